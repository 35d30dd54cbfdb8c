// tern bench --concurrency: the rows of N streams decoding at once (the method is at the top of bench_run.h).
#pragma once

#include "engine/bench_run.h"

namespace tern {

// Measures every (length, N) of options.lengths x options.concurrency into report.concurrency, and sets
// report.memory_peak_bytes and report.decode_path. Called by bench_run, which has checked the options that the
// table shares (lengths, repeats, warm-up); throws tern::Error on a bad stream count, no decode steps, sessions that
// do not fit (naming N and the context) or a failed entry.
void bench_concurrency_rows(ModelRunner& runner, const BenchOptions& options, BenchReport& report);

}  // namespace tern
