// The kernel workbench (`tern_kernels`): every decode and prefill kernel alone at the model's real shapes, timed
// with CUDA events, printed as one table of µs, GB/s and TFLOP/s against the H200 ceilings (4.6 TB/s read
// bandwidth, 790 TFLOP/s dense bf16). Each kernel family adds its cases in its own bench/bench_<family>.cu through
// TERN_BENCH_CASES; main.cu runs them (a name filter on the command line selects cases).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tern::bench {

struct Case {
  std::string group;  // "decode" or "prefill"
  std::string name;   // kernel and shape, e.g. "qmv 4-bit 12352x2048 T=1"
  double bytes = 0;   // fewest bytes the kernel must move through device memory per run
  double flops = 0;   // arithmetic per run (2 per multiply-add)
  int units = 1;      // the printed µs, bytes and flops are per unit: a run that holds several links counts them
  // One run of the kernel on `stream`. `rep` counts the runs: cases whose inputs fit in L2 (60 MB) keep several
  // copies and pick copy rep % copies, so that timed runs read device memory, not the cache.
  std::function<void(cudaStream_t stream, int rep)> run;
  // Called once before the case is timed and once after (frees memory); may be empty.
  std::function<void()> setup, teardown;
};

using CaseList = std::vector<Case>;
// Registers a function that appends cases; runs before main (static initialisation).
struct Registrar {
  Registrar(const char* family, std::function<void(CaseList&)> add);
};
#define TERN_BENCH_CAT2(a, b) a##b
#define TERN_BENCH_CAT(a, b) TERN_BENCH_CAT2(a, b)
#define TERN_BENCH_CASES(family)                                                                   \
  static void TERN_BENCH_CAT(tern_bench_add_, family)(::tern::bench::CaseList & cases);           \
  static ::tern::bench::Registrar TERN_BENCH_CAT(tern_bench_reg_, family)(#family,                 \
                                                                          TERN_BENCH_CAT(tern_bench_add_, family)); \
  static void TERN_BENCH_CAT(tern_bench_add_, family)(::tern::bench::CaseList & cases)

// Device memory owned by the workbench until the process ends, filled with random bits (bytes) or random floats in
// [lo, hi) (floats). Never zeros: zeros run faster than real data.
void* bench_alloc_random_bytes(size_t bytes, uint64_t seed);
float* bench_alloc_random_floats(size_t n, float lo, float hi, uint64_t seed);
// Copies needed so that `bytes_per_copy` × copies exceeds 4× the L2 size (at least 1).
int bench_copies_for(double bytes_per_copy);

}  // namespace tern::bench
