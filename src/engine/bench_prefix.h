// tern bench --prefix-reuse: time to first token of a conversation's second turn, with and without multi-turn
// prefix reuse (Session::snapshot/restore, what the server's prefix cache does), on the engine API (no HTTP).
//
// Method (one session of capacity context + reply + next):
//   turn 1:  `context` random prompt tokens prefilled in calls of `prefill_chunk` tokens that also end at every
//            multiple of `snapshot_every` (a snapshot there, as the server takes them), a snapshot at the end of the
//            prompt, then `reply` tokens fed as the generated reply (one forward call: only their KV and state
//            matter here) and the end-of-request snapshot;
//   turn 2:  the prompt is turn 1's prompt + reply + `next` new tokens (the next user message).
//            without reuse: reset, prefill all of it (chunks of `prefill_chunk`), last-token logits;
//            with reuse: restore the end-of-request snapshot, prefill the `next` tokens (and take the end-of-prompt
//            snapshot, as the server does before its first token), last-token logits;
//            with reuse from host memory: the same after the snapshot was moved to host memory (to_host).
//   Each timed on the host around the calls (the runner's forward returns logits on the host: synchronous).
//   `repeats` times; medians reported. The two turn-2 logits are compared (max |difference|) as a check.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/runner.h"

namespace tern {

struct PrefixBenchOptions {
  int64_t context = 16384;         // turn 1's prompt tokens
  int64_t reply = 256;             // turn 1's reply tokens
  int64_t next = 256;              // turn 2's new tokens
  int64_t snapshot_every = 4096;   // snapshots during turn 1's prefill (0: only at the ends)
  int64_t prefill_chunk = 4096;    // tokens per forward call of a prefill (the server's generator uses 4096)
  int repeats = 3;
  uint64_t seed = 1;
  std::function<void(const std::string&)> log;  // progress lines; may be empty
};

struct PrefixBenchReport {
  std::string backend;
  PrefixBenchOptions options;            // as run (log dropped)
  int64_t turn2_tokens = 0;              // turn 2's prompt
  int64_t reused_tokens = 0;             // of which resumed from the snapshot
  std::vector<double> scratch_ms, reuse_ms, reuse_host_ms;  // every timed run
  double scratch_ms_median = 0, reuse_ms_median = 0, reuse_host_ms_median = 0;  // time to first token
  double turn1_ms = 0;                   // turn 1 (prompt + reply, snapshots included)
  double snapshot_ms = 0;                // median time to take one snapshot
  double to_host_ms = 0, to_device_ms = 0;  // median time to move one snapshot
  int64_t snapshot_bytes = 0;            // one snapshot
  int snapshots = 0;                     // taken in turn 1
  double max_abs_dlogit = 0;             // turn 2's last logits, reuse vs no reuse
  double max_abs_logit = 0;
};

// Throws tern::Error on bad options, or when the runner's sessions have no snapshots.
PrefixBenchReport bench_prefix_reuse(ModelRunner& runner, const PrefixBenchOptions& options);
std::string bench_prefix_table(const PrefixBenchReport& report);

}  // namespace tern
