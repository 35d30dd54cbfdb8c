// The sparse MoE block for a few tokens (decode, T <= kQmvMaxTokens) in three kernels (model.md §2.6):
//   1. moe_router_decode:  x̂ = RMSNorm(hidden)·norm_w; router logits (8-bit, [E, D]) and the shared-expert gate
//      logit; softmax over E in fp32, top-k (ties: lower index), weights renormalised over the top k; sigmoid of the
//      shared gate. One warp per row (weights loaded before pdl_wait); the last block to finish (an atomic ticket)
//      does the softmax and top-k and (Hopper) asks L2 to fetch the chosen experts' weights. One token under qmv
//      variant 3 on sm_90: one cluster of 8 blocks instead (moe_router_cluster.cuh), same results, no ticket.
//   2. moe_gate_up_decode: h[t, s] = silu(Wg[e_s]·x̂) ⊙ (Wu[e_s]·x̂) for the k routed slots and the shared expert
//      (slot k).
//   3. moe_down_decode:    hidden[t] += Σ_{s<k} w[t, s]·(Wd[e_s]·h[t, s]) + shared_gate[t]·(Wd_shared·h[t, k]),
//      each output element summed in a fixed order (deterministic, no float atomics).
// One token without Hopper's features (the portable path, GPUs before sm_90): 1 and 2 as one kernel
// (moe_router_gate_up.cuh), the same bits, so that the routing overlaps the shared expert's rows and a launch is saved.
// One token of each of B sequences (the batched decode step): moe_decode_batched runs the T = 1 path's kernels (the
// cluster router, the integer gate_up and down) once each with a token index, every token bit for bit as alone.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/weights/device_weights.cuh"

namespace tern::cuda {

struct MoeDecodeWeights {
  const float* norm_w = nullptr;  // [D] post-attention RMSNorm
  float eps = 1e-6f;
  DMat router;                    // [E, D]
  DMat shared_expert_gate;        // [1, D]
  DMat expert_gate, expert_up;    // [E][F, D]
  DMat expert_down;               // [E][D, F]
  DMat shared_gate, shared_up;    // [Fs, D], Fs == F
  DMat shared_down;               // [D, Fs]
  int top_k = 8;
  // One token on the integer path (moe_dp4a.cuh): the gate_up kernel, once it has read the routing, asks L2 for the
  // down matrices of the chosen experts and the shared expert (l2_prefetch.cuh), so that the down kernel reads L2.
  bool prefetch_down = false;
};

// Device scratch of one MoE decode step for T tokens; moe_decode_scratch_bytes() bytes, carved by
// moe_decode_scratch_view(). Holds x̂, ids, weights, shared gate, h, the router's ticket counter and the fused
// router's epoch (both zeroed by moe_decode_scratch_init once; each router launch leaves the ticket at zero again, each
// fused launch adds one to the epoch).
struct MoeDecodeScratch {
  float* xhat = nullptr;         // [T, D] normed input (written by the router kernel)
  float* router_logits = nullptr;// [T, E]
  float* shared_logit = nullptr; // [T]
  int* ids = nullptr;            // [T, k]
  float* w = nullptr;            // [T, k] routing weights
  float* shared_gate = nullptr;  // [T] sigmoid(shared logit)
  float* h = nullptr;            // [T, k+1, F]
  unsigned* ticket = nullptr;    // [1] arrivals of a router launch's blocks (the ticket or the fused kernel)
  unsigned* epoch = nullptr;     // [1] routings published by the fused router + gate_up kernel (ticket + 1)
  // [T][ceil(D / 1024)] slices of kMoeXLaneSliceBytes: x̂ quantised (dp4a_tile.cuh: quantize_word) in the form the
  // integer gate_up's lanes read it (gate_up_lane_x), written by the cluster router when asked (the batched step with
  // the grouped gate_up: moe_gate_up_wants_x_lanes) and read by that gate_up. Slice j (columns [1024·j, +1024)) of a
  // token: uint4 [4][32], [k][l] the activations of word 4·l + k of the slice (lane l's columns [32·l, +32)), then
  // float2 [32], [l] = (σ of lane l's group of 64 columns, σ·Σv over its 32 columns).
  uint4* x_lanes = nullptr;
  // [T] arrivals of a token's down blocks (moe_decode_batched with MoeTablesOut: the last block writes the tables);
  // zeroed by moe_decode_scratch_init, left at zero by every launch.
  unsigned* down_tickets = nullptr;
  int down_tickets_count = 0;
};
constexpr int64_t kMoeXLaneSliceBytes = 4 * 32 * 16 + 32 * 8;  // 2304 per 1024 columns
size_t moe_decode_scratch_bytes(int T, int64_t D, int E, int k, int64_t F);
MoeDecodeScratch moe_decode_scratch_view(void* base, int T, int64_t D, int E, int k, int64_t F);
void moe_decode_scratch_init(const MoeDecodeScratch& s, cudaStream_t stream);
// For TERN_STEP_OMIT=router (step_omit.h), a timing diagnostic: rows [0, T) of the scratch's routing set to
// step_omit_routing's ids, weights 1/k and shared gates 1/2 (synchronous; outside any capture), so that steps without
// the router read as many distinct experts as steps with it.
void moe_decode_scratch_stand_in_routing(const MoeDecodeScratch& s, int T, int E, int k, cudaStream_t stream);

// hidden [T, D] fp32, updated in place by moe_down_decode.
void moe_router_decode(const MoeDecodeWeights& w, const float* hidden, int T, const MoeDecodeScratch& s,
                       cudaStream_t stream);
// moe_gate_up_decode returns whether it ran the one-token integer kernel (moe_dp4a.cuh), which lets the kernel after
// it start only once the routing is complete: pass that to moe_down_decode's after_integer_gate_up when down is the
// next launch of the same step, and the down kernel reads the routing and its first weights before pdl_wait.
bool moe_gate_up_decode(const MoeDecodeWeights& w, int T, const MoeDecodeScratch& s, cudaStream_t stream);
void moe_down_decode(const MoeDecodeWeights& w, float* hidden, int T, const MoeDecodeScratch& s, cudaStream_t stream,
                     bool after_integer_gate_up = false);

// One token under qmv variant 3 (the default): gate_up and down run the integer kernels of moe_dp4a.cuh where the
// shapes fit (the model's do). Otherwise 4-bit experts (group 64, D and F multiples of 256) run on the tensor-core tile of qmv (fp16 hi + lo activations, ≈ fp32); other
// formats on an fp32 SIMT path. gate_up and down cover T·k routed (token, slot) pairs plus the shared expert, each pair
// reading its expert's rows once. The first call of gate_up / down sets their shared-memory limit: make it outside
// graph capture.

// Tuning (benchmarks): whether the routing block asks L2 (Hopper, cp.async.bulk.prefetch) to fetch the chosen
// experts' gate, up and down weights (and the shared expert's) for the next two kernels. Default OFF (measured on the
// H200: the MoE block 100 µs with it vs 43 µs without, whole-model decode 2x slower); TERN_MOE_PREFETCH=1 turns it on.
// Set it outside graph capture (it is read when a launch is recorded). gate_up and down follow qmv's
// TERN_QMV_VARIANT / TERN_QMV_DEPTH / TERN_QMV_BPS (qtile::tuning()).
void moe_decode_set_l2_prefetch(bool on);

// ---- a batch of sequences, one token each (the batched decode step, issue 31) ----
// Whether moe_decode_batched takes these weights on this device: the one-token kernels it runs per token (the
// cluster router of moe_router_cluster.cuh and the integer gate_up / down of moe_dp4a.cuh) all apply.
bool moe_decode_batched_supported(const MoeDecodeWeights& w);
// hidden [B, D]: token b updated bit for bit as moe_decode(w, hidden + b·D, 1, ...) updates it alone, for
// 1 <= B <= kBatchMaxTokens (qmv_dp4a.cuh); s sized for at least B tokens (moe_decode_scratch_bytes(T >= B)), its
// rows b holding token b's routing and h. Throws tern::Error when !moe_decode_batched_supported(w).
// With next.tables (null: none) the down kernel also writes the next batched product's activation tables from the
// finished rows (dp4a_tables.cuh: x·next.norm_w with the RMSNorm's rinv, token b in slot b % 8 of tile b / 8; the
// last of a token's blocks to finish quantises its row, as qmv_dp4a_prequant_kernel would). Returns whether it wrote
// them (next.tables given, D a multiple of 64 and the down kernel launched).
struct MoeTablesOut {
  uint8_t* tables = nullptr;      // qmv_dp4a_mma_scratch_bytes(B, D) bytes, 16-byte aligned
  const float* norm_w = nullptr;  // [D] the next product's RMSNorm weights (null: no norm, rinv 1)
  float eps = 1e-6f;
};
bool moe_decode_batched(const MoeDecodeWeights& w, float* hidden, int B, const MoeDecodeScratch& s,
                        cudaStream_t stream, const MoeTablesOut& next = {});

// Whether moe_decode runs router and gate_up as the one fused kernel (moe_router_gate_up.cuh): T = 1, no sm_90
// features (the portable path or an older GPU), qmv variant 3, no router L2 prefetch, TERN_MOE_FUSED_ROUTER not 0,
// and the kernel takes these weights (moe_router_gate_up_fits).
bool moe_decode_fuses_router(const MoeDecodeWeights& w, int T);
// Runs the fused kernel and returns true when moe_decode_fuses_router(w, T); false: nothing was launched. The routing
// is then complete when the next kernel starts (moe_down_decode's after_integer_gate_up holds).
bool moe_router_gate_up_decode(const MoeDecodeWeights& w, const float* hidden, int T, const MoeDecodeScratch& s,
                               cudaStream_t stream);

// All three in order (router and gate_up fused where moe_decode_fuses_router).
void moe_decode(const MoeDecodeWeights& w, float* hidden, int T, const MoeDecodeScratch& s, cudaStream_t stream);

}  // namespace tern::cuda
