// The memory plan (issue 33): how long a context, and how many sequences at once, a GPU holds beside the model.
// Pure arithmetic over sizes measured elsewhere (the CLI measures the device and the runner, cli/memory_flags.h;
// the tests give fake ones), so that every choice and every refusal is testable on the CPU.
//
// What it counts, in bytes, against what is available (the GPU's free memory before the model was loaded, or
// --gpu-memory when that is smaller):
//
//   weights + scratch + reserve + sessions x (state + context x kv_token) + parallel x verify + snapshots
//     <=  available
//
// where a session is one sequence's KV cache region and Gated DeltaNet state (one per request running at once, and
// one per conversation the prefix cache keeps), verify is what a speculative decoding step keeps for its rollback
// (the Gated DeltaNet states before each of its tokens, held from the verify to the sequence's next step: once per
// sequence running at once, not per session the cache keeps; 0 without speculative decoding), and snapshots are
// the prefix cache's copies of the state kept in GPU memory. Each allocation is counted at the 2 MiB the driver
// rounds it to.
//
// A flag that was given is kept as given; when it cannot fit, the plan is refused (tern::Error) with the memory
// needed and available and what would fit. What was not given is chosen, and when memory is short the choices give
// way in this order, the first first:
//   1. the prefix cache's snapshots in GPU memory (down to none: the snapshots then move to pinned host memory at
//      once, which costs a PCIe copy per snapshot and per restore, 21 and 7 ms on the H200, not a context token);
//   2. the prefix cache's sessions beyond the sequences that run at once (conversations kept for reuse: a
//      convenience, where a context token is a capability);
//   3. the sequences at once (--parallel; tern serve's default 4), down to 1, but only while each would hold fewer
//      than 32,768 tokens (the context tern served before this plan): below that a longer context serves more uses
//      than a second stream;
//   4. the context, from the model's positions (262,144 for Qwen3.6) down to 4,096 in steps of 1,024 tokens. Below
//      4,096 (an explicit --ctx-size may be smaller) the plan is refused.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/kv_dtype.h"

namespace tern {

// What the plan keeps free after it: the CUDA runtime's allocations that no one sizes in advance and that come
// after the plan, at the first requests. One decode graph per session and one batched-step graph per batch size
// (2..32) keep their nodes' parameters on the device (well under 1 MB each); the kernels' code is loaded at first
// use (CUDA 12's lazy loading), and with it the local memory the runtime sizes for the largest per-thread stack of
// any kernel loaded, times every thread the GPU holds at once (132 SMs x 2,048 threads on the H200: 1 KiB of stack
// is 277 MB); the token-mask buffers and the 2 MiB rounding of the arenas are small. 512 MiB covers these with
// room; on a 24 GB card it is 2% of the memory, some 26,000 tokens of one sequence's context. (The CUDA context
// itself is made before the free memory is read, so it is not part of the plan: a few hundred MB.)
inline constexpr int64_t kMemoryPlanReserveBytes = int64_t(512) << 20;
inline constexpr int64_t kMemoryPlanMinContext = 4096;        // the shortest context the plan chooses
inline constexpr int64_t kMemoryPlanParallelContext = 32768;  // --parallel gives way while contexts are shorter
inline constexpr int64_t kMemoryPlanContextStep = 1024;       // a chosen context is a multiple (or the model's max)
inline constexpr int64_t kMemoryPlanAllocationGranule = int64_t(2) << 20;  // cudaMalloc rounds large sizes to it
// Snapshot buffers the CUDA runner holds beyond the prefix cache's budget: up to 4 spare buffers kept for reuse
// (cuda_session.cuh, SnapshotBuffers) and the one a snapshot being taken holds before the budget is enforced.
inline constexpr int kMemoryPlanSnapshotSpares = 5;

struct MemoryPlanInput {
  // The device.
  int64_t free_bytes = 0;   // free before the model was loaded (the CUDA context already made)
  int64_t total_bytes = 0;  // its size
  int64_t cap_bytes = 0;    // --gpu-memory: the plan uses at most this, or the free memory when smaller; 0: none
  // The model on the device.
  int64_t weights_bytes = 0;
  int64_t scratch_bytes = 0;   // the runner's other fixed buffers (activations, the batched step's tables)
  int64_t state_bytes = 0;     // per sequence, whatever its context: the Gated DeltaNet conv and recurrent states
  int64_t kv_token_bytes = 0;  // per sequence and context token: K and V of every attention layer (kv_token_bytes())
  KvDtype kv_dtype = KvDtype::f16;  // the KV cache's type (--kv-dtype), which kv_token_bytes was measured with
  // Per sequence running at once, with speculative decoding: the states a verify of the most tokens the command
  // verifies keeps (ModelRunner::verify_state_bytes of max drafts + 1 tokens); 0: speculative decoding off. The CUDA
  // runner's pool of them holds no more than the most in use at once (cuda_session.cuh, KeptStateBuffers).
  int64_t verify_bytes = 0;
  int64_t reserve_bytes = kMemoryPlanReserveBytes;
  int64_t max_context = 0;     // the model's positions
  // What the command asks; 0: the plan chooses.
  int64_t context = 0;         // --ctx-size
  int parallel = 0;            // --parallel
  int default_parallel = 1;    // what the plan starts from when parallel is 0 (tern serve: 4)
  // The prefix cache (engine/prefix_cache.h); none when cache_slots is 0. Its sessions are counted as the requests'
  // (max(parallel, cache_slots) sessions), and its snapshots in GPU memory as the budget plus the spare buffers.
  int cache_slots = 0;            // --cache-slots (or the command's default)
  bool cache_slots_given = false;  // else fewer when memory is short, down to `parallel`
  int64_t snapshot_budget = 0;    // --cache-gpu-mb in bytes (or the command's default)
  bool snapshot_budget_given = false;  // else less when memory is short, down to none
  // The flags named in a refusal's advice ("" : not a flag of this command).
  std::string context_flag = "--ctx-size";
  std::string parallel_flag = "--parallel";
};

struct MemoryPlan {
  int64_t context = 0;          // tokens per sequence
  int parallel = 0;             // sequences at once
  int sessions = 0;             // sessions in all: parallel, plus the prefix cache's beyond them
  int64_t snapshot_budget = 0;  // the prefix cache's snapshots in GPU memory (PrefixCacheOptions::gpu_bytes)
  // The accounting.
  int64_t available_bytes = 0;  // min(free, cap)
  int64_t session_bytes = 0;    // one session at `context`
  int64_t snapshot_bytes = 0;   // what the snapshots may hold on the device (budget and spare buffers)
  int64_t verify_bytes = 0;     // the verify steps' kept states: parallel x input.verify_bytes (each in 2 MiB)
  int64_t total_bytes = 0;      // everything planned, reserve included (<= available_bytes)
  std::vector<std::string> notes;  // what gave way and why ("--parallel 3: ..."), empty when nothing did
  MemoryPlanInput input;        // what it was planned from
};

// The plan for `in`. Throws tern::Error when what was asked (or, with nothing asked, one sequence of 4,096 tokens)
// does not fit: the message states the memory needed, item by item, what is available, and what would fit.
MemoryPlan memory_plan(const MemoryPlanInput& in);

// Before the weights are uploaded: throws tern::Error, with the numbers, when the weights and the reserve alone
// exceed what is available (a checkpoint too large for the card, or for --gpu-memory).
void memory_plan_check_weights(int64_t weights_bytes, const MemoryPlanInput& device);

// What `tern serve` and the others print at start: the choice, then the items it was made from, then the notes.
std::vector<std::string> memory_plan_describe(const MemoryPlan& plan);

// A --gpu-memory value: a number of GB (10^9 bytes, as tern prints them), optionally with a unit: GB or G, GiB,
// MB or M, MiB ("24", "23.5", "24GB", "24 GiB", "24576MiB"). Throws tern::Error naming the value when it is not
// such a size, or not more than zero, or not finite.
int64_t memory_size_parse(const std::string& text);

// "19.51 GB", "65.9 MB": the sizes as the plan prints them; "262,144": the token counts.
std::string memory_size_text(int64_t bytes);
std::string token_count_text(int64_t tokens);

}  // namespace tern
