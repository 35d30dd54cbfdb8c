// Gated DeltaNet core (model.md §2.4): q/k normalisation and gates, the gated delta rule over an fp32 state, and the
// gated RMSNorm. The state is V-major: [Hv][dv][dk] fp32 (row j of head h holds S[:, j] over the key dims).
// The kernels: gdn_prefill.cu (prepare, gates, the recurrence token by token and chunked, gated norm; the chunked form's
// tensor-core kernels in gdn_chunked_tc.cuh and gdn_chunked_twopass.cuh) and gdn_decode.cu (the fused decode step, of
// one sequence or of a batch).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tern::cuda {

struct GdnDims {
  int64_t T = 0;
  int Hk = 16, Hv = 32, dk = 128, dv = 128;
  // Row strides (floats) of the prefill kernels' b and a (gdn_prepare, gdn_gates) and z (gdn_gated_norm) inputs; 0:
  // packed (Hv, Hv·dv). The prefill plan reads them from the fused in_proj's output [T, C + Hv·dv + 2·Hv].
  int64_t ld_ba = 0, ld_z = 0;
  __host__ __device__ int64_t C() const { return 2LL * Hk * dk + int64_t(Hv) * dv; }
  __host__ __device__ int64_t ba_stride() const { return ld_ba > 0 ? ld_ba : Hv; }
  __host__ __device__ int64_t z_stride() const { return ld_z > 0 ? ld_z : int64_t(Hv) * dv; }
};

// In place on qkv [T, C] = [q (Hk·dk) | k (Hk·dk) | v (Hv·dv)] (after conv + SiLU):
//   q ← q·rsqrt(Σq² + 1e-6)/√dk, k ← k·rsqrt(Σk² + 1e-6) per key head;
// and per value head h: g_log[t,h] = −exp(A_log[h])·softplus(a[t,h] + dt_bias[h]), beta[t,h] = sigmoid(b[t,h]).
//   b, a [T, Hv] (row stride d.ba_stride()); g_log, beta [T, Hv].
void gdn_prepare(float* qkv, const float* b, const float* a, const float* A_log, const float* dt_bias, const GdnDims& d,
                 float* g_log, float* beta, cudaStream_t stream);

// The gates of gdn_prepare alone (g_log, beta as above), for prefill where conv1d_silu_qknorm did the q/k norms.
void gdn_gates(const float* b, const float* a, const float* A_log, const float* dt_bias, const GdnDims& d, float* g_log,
               float* beta, cudaStream_t stream);

// The recurrence, token by token, v-head h using key head h / (Hv/Hk):
//   S ← e^{g}·S;  δ = β(v − Sᵀk);  S ← S + k δᵀ;  o = Sᵀq
// qkv as left by gdn_prepare; state [Hv, dv, dk] read and written in place; o [T, Hv·dv].
// dk must be 32, 64 or 128 and dv a multiple of 16.
void gdn_recurrent(const float* qkv, const float* g_log, const float* beta, float* state, const GdnDims& d, float* o,
                   cudaStream_t stream);

// The same function as gdn_recurrent (same inputs, outputs and state layout) in the chunked (WY/UT) form: per v-head
// and chunk of `chunk` tokens, G = in-chunk cumulative log decay, the deltas solve (I + A)Δ = β(V − e^{G}·K·S₀ᵀ)
// with A[t,s] = β_t e^{G_t−G_s} k_t·k_s (s < t); o = e^{G}·Q·S₀ᵀ + (e^{G_t−G_s} q_t·k_s)_{s≤t}·Δ;
// S ← e^{G_n}·S₀ + Σ_s e^{G_n−G_s} δ_s k_sᵀ. Any T (the last chunk may be short); the state is carried in and out.
// Kernels:
//   simt:   fp32 throughout, forward substitution row by row; dk 32, 64 or 128; dv a multiple of 32; 1 ≤ chunk ≤ 64.
//   tf32:   tensor cores (mma.sync tf32, fp32 accumulation), the triangular inverse by 16×16 blocks; chunk 64,
//           dk 128, dv a multiple of 32, qkv/state/o 16-byte aligned. Relative error ~1e-3.
//   tf32x3: the same with every operand split into tf32 hi + lo (three products): ≈ fp32 accuracy.
//   The fused tensor-core kernels run a block per (v-head, 32 value rows) that walks the chunks with the in-chunk
//   matrices recomputed per chunk, where 177 KB of shared memory per block are available (sm_90), else per (v-head,
//   16 value rows) (152 KB: A100); tf32x3_slice16 forces the latter (tests).
//   twopass_tf32x3: two kernels through a workspace (see gdn_chunked_workspace_bytes): every (v-head, chunk) at once
//           computes the WY form (the decay cumsum, T = (I + A)⁻¹, W = T·(βe^{G}K), U = T·(βV), P = (QKᵀ)∘decay),
//           then a block per (v-head, 32 value rows) walks the chunks: V' = U − W·Sᵀ, O = e^{G}QSᵀ + P·V', state
//           update; 3xTF32 throughout (≈ fp32). Needs dk = dv = 128, chunk 64, 222 KB of shared memory (sm_90),
//           16-byte aligned qkv/state/o/workspace, and a workspace of at least one chunk (T is processed in
//           segments of as many chunks as the workspace holds, the state carried between them).
//   twopass_mixed: the same with the output-only products (QKᵀ, Q·Sᵀ, P·V') in plain tf32; the state path
//           (KKᵀ, the inverse, W, U, W·Sᵀ, the state update) stays 3xTF32.
//   automatic: twopass_tf32x3 when a large enough workspace is given and supported, else tf32x3 when supported,
//           else simt.
enum class GdnChunkedKernel { automatic, simt, tf32, tf32x3, tf32x3_slice16, twopass_tf32x3, twopass_mixed };
bool gdn_chunked_tc_supported(const GdnDims& d, int chunk);
// Whether this device's shared memory per block holds the one-pass tensor-core kernel (152 KB at 16 value rows per
// slice: sm_80 and sm_90 do, sm_86/89/120 and the portable path do not).
bool gdn_chunked_tc_fits();
// Whether the two-pass kernels take these dims on this device (dk = dv = 128, Hv a multiple of Hk, chunk 64, enough
// shared memory per block).
bool gdn_chunked_twopass_supported(const GdnDims& d, int chunk = 64);
// Workspace bytes for the two-pass kernels to process d.T tokens in one segment: ⌈T/64⌉ · Hv · 82,432 bytes
// (W, U fp32 [64, 128], P fp32 [64, 64], two gate rows per chunk and v-head): 169 MB at T = 4096, Hv = 32. Any
// smaller multiple of the per-chunk size works too (more segments). 0 where unsupported.
size_t gdn_chunked_workspace_bytes(const GdnDims& d, int chunk = 64);
void gdn_chunked(const float* qkv, const float* g_log, const float* beta, float* state, const GdnDims& d, float* o,
                 cudaStream_t stream, int chunk = 64, GdnChunkedKernel kernel = GdnChunkedKernel::automatic,
                 void* workspace = nullptr, size_t workspace_bytes = 0);

// out[t, h, :] = (o·rsqrt(mean(o²) + eps)·w) · silu(z[t, h, :]) per head over dv.  o, out [T, Hv·dv]; z [T, Hv·dv]
// (row stride d.z_stride()); w [dv].
void gdn_gated_norm(const float* o, const float* z, const float* w, float eps, const GdnDims& d, float* out,
                    cudaStream_t stream);

// ---- kept recurrent states in replay form (the verify's rollback, issue 32) --------------------------------------
// The delta rule updates each state element alone: S[h][j][i] ← fmaf(g_t[h], S[h][j][i], k̂_t[h / 2][i] · δ_t[h][j])
// (gdn_decode's step 4, the product rounded, then one fmaf), so the state after u tokens is the state before them
// and u such updates. A verify keeps that state once and, per token, the values of its update: the normed k of each
// key head, the δ of each value row (β(v − e^g·S·k)) and the decay e^g of each value head. Per token [k̂ | δ | g]:
//   k̂ [Hk, dk] at k_at, δ [Hv, dv] at delta_at, g [Hv] at g_at, in a slot of `floats` (a multiple of 4, so that every
//   slot starts 16-byte aligned after the [Hv, dv, dk] state).
struct GdnReplayLayout {
  int64_t k_at = 0, delta_at = 0, g_at = 0, floats = 0;
  __host__ __device__ static GdnReplayLayout of(const GdnDims& d) {
    GdnReplayLayout l;
    l.k_at = 0;
    l.delta_at = int64_t(d.Hk) * d.dk;
    l.g_at = l.delta_at + int64_t(d.Hv) * d.dv;
    l.floats = (l.g_at + d.Hv + 3) / 4 * 4;
    return l;
  }
};
// Floats of one layer's rec_keep for a verify of `tokens` tokens: the state before them and each token's replay slot.
inline int64_t gdn_kept_rec_floats(const GdnDims& d, int64_t tokens) {
  return int64_t(d.Hv) * d.dv * d.dk + tokens * GdnReplayLayout::of(d).floats;
}

// One layer's rollback: state [Hv, dv, dk] ← the kept state before the verify's first token, replayed through
// the first `tokens` updates of `kept` (rec_keep as gdn_decode wrote it). dk = dv = 128 and Hv = 2·Hk (the shapes of
// gdn_decode_supported); state and kept 16-byte aligned.
struct GdnReplay {
  float* state = nullptr;
  const float* kept = nullptr;
};
// Every entry's layer in one launch, each replaying the same `tokens` (0 copies the kept state): bit for bit the
// state gdn_decode had before token `tokens` of the verify. Any number of entries (one launch per
// kGdnReplayMaxEntries).
constexpr int kGdnReplayMaxEntries = 64;
// (Its host twin is in tests/cuda/kernels/gdn_replay_test.cpp.)
void gdn_state_replay(const GdnReplay* entries, int count, const GdnDims& d, int tokens, cudaStream_t stream);

// ---- decode: the whole mixer core after in_proj in one kernel ---------------------------------------------------
// Exactly conv1d_silu → gdn_prepare → gdn_recurrent → gdn_gated_norm over T = 1..kGdnDecodeMaxTokens tokens
// (processed in order): the conv (+ SiLU) of the qkv channels with its state, the q/k L2 norms, the gates, the delta
// rule on the fp32 state and the gated RMSNorm, without intermediate buffers. The kernel walks the tokens in chunks of
// 8 (the state in registers throughout); every token runs the same code, so T tokens in one call give bit for bit
// what T calls of one token in order give (outputs, final and kept states).
constexpr int kGdnDecodeMaxTokens = 32;
struct GdnDecodeArgs {
  const float* proj = nullptr;  // [T, ld_proj]: row = [qkv_raw (C) | z (Hv·dv) | b (Hv) | a (Hv)] (in_proj output)
  int64_t ld_proj = 0;          // ≥ C + Hv·dv + 2·Hv
  const float* conv_w = nullptr;  // [C, Ck]
  int Ck = 4;                     // 1..8
  float* conv_state = nullptr;    // [Ck-1, C] fp32: the last Ck-1 pre-conv inputs, oldest first; updated
  float* rec_state = nullptr;     // [Hv, dv, dk] fp32, updated in place
  const float* A_log = nullptr;   // [Hv]
  const float* dt_bias = nullptr;  // [Hv]
  const float* norm_w = nullptr;   // [dv]
  float eps = 1e-6f;
  GdnDims d;  // d.T = tokens (0..kGdnDecodeMaxTokens); dk = dv = 128 and Hv = 2·Hk (the model's GDN shape)
  float* out = nullptr;  // [T, Hv·dv] = gated RMSNorm(o, z): the input of out_proj
  // Verification of drafts (gdn_decode only; null: not kept), so that the caller can set the layer back to the state
  // before any of the T tokens (Session::rollback): conv_keep [T, Ck-1, C], the conv states before each token, and
  // rec_keep [gdn_kept_rec_floats(d, T)], the recurrent state before the first token [Hv, dv, dk] followed by each
  // token's replay values (GdnReplayLayout): gdn_state_replay rebuilds the state before token u from them, bit for
  // bit, writing one state where keeping T of them wrote T.
  float* conv_keep = nullptr;
  float* rec_keep = nullptr;
  // [gdn_decode_ticket_count(Hk)] device, zeroed once by the owner; every launch leaves it at zero again. The
  // portable_split shape's tickets (one per sequence and key head: which of a key head's two blocks writes the q/k
  // conv state, after both have read it). Launches that may run at the same time (different streams) need separate
  // arrays; those of one stream may share one. Null: no portable_split (the portable path runs portable).
  unsigned* tickets = nullptr;
  // gdn_decode_batched and gdn_decode_from_tables only (null: none): out_proj's activation tables (dp4a_tables.cuh;
  // qmv_dp4a_mma_scratch_bytes(rows, Hv·dv) bytes, 16-byte aligned), out's row r (sequence b of a batch, or token t
  // of one sequence's T ≤ 8) in token slot r % 8 of tile r / 8, without a norm (rinv 1), written beside out where the
  // launch shape's blocks hold whole groups of 64 values (both calls say whether they did).
  uint8_t* out_tables = nullptr;
  // Tests only: take the one-block portable shape (no thread-block cluster, no tickets) on any GPU.
  bool force_portable = false;
  // Which launch shape (tests and the workbench; automatic = cluster4_w16 on sm_90 for one sequence, for
  // gdn_decode_batched's B ≥ 2 cluster2_w16 up to one wave of it and smem_w16 beyond, unless TERN_GDN_BATCH_SHAPE
  // names cluster4_w16, cluster4_w8, cluster2_w16 or smem_w16; else as the fallback below):
  //   cluster8_w8:    clusters of 8 blocks × 8 warps × 4 state rows per warp (128 blocks of 256 threads);
  //   cluster8_w16:   clusters of 8 blocks × 16 warps × 2 rows (128 blocks of 512 threads);
  //   cluster16_w8:   clusters of 16 blocks × 8 warps × 2 rows (256 blocks of 256 threads; a non-portable size);
  //   cluster4_w16:   clusters of 4 blocks × 16 warps × 4 rows (64 blocks of 512 threads);
  //   portable:       one block of 32 warps × 8 rows per key head, no cluster (16 blocks of 1024 threads; any GPU);
  //   portable_split: one block of 32 warps × 4 rows per v-head, two per key head, no cluster (32 blocks of 1024
  //                   threads; any GPU; needs tickets). Meant to be bit for bit cluster4_w16's results (the same
  //                   rows per warp and warps per v-head, so the same sums; gdn_test compares them on sm_90).
  //   cluster2_w16:   clusters of 2 blocks × 16 warps × 8 rows (32 blocks of 512 threads; a block per v-head); the
  //                   batched step's: its one-token kernel holds 8 rows per warp in 64 registers, 2 blocks per SM
  //                   (B = 8: 256 blocks, one wave on an H200);
  //   cluster4_w8:    clusters of 4 blocks × 8 warps × 8 rows (64 blocks of 256 threads; one token: 80 registers, 3
  //                   blocks per SM).
  //   smem_w16:       one block of 16 warps × 16 rows per key head, 12 of each warp's rows in shared memory (16
  //                   blocks of 512 threads, 96 KB each; 2 blocks per SM: twice cluster2_w16's rows). One token at
  //                   conv width ≤ 4; otherwise cluster2_w16's kernels. automatic takes it for gdn_decode_batched
  //                   where B · Hk exceeds the SMs (one wave of cluster2_w16 does not hold the batch).
  //   The three sum the gated norm's squares over sets of 4 rows as cluster4_w16 does: bit for bit its results.
  // The cluster shapes fall back where the sm_90 binary does not run: to portable_split when tickets are given and
  // TERN_GDN_PORTABLE_SPLIT is not 0, else to portable.
  enum class Kernel {
    automatic,
    cluster8_w8,
    cluster8_w16,
    cluster16_w8,
    cluster4_w16,
    portable,
    portable_split,
    cluster2_w16,
    cluster4_w8,
    smem_w16
  };
  Kernel kernel = Kernel::automatic;
};

// Launched with PDL. The recurrent state rows are read BEFORE pdl_wait(), overlapping the previous kernel: this is
// safe because a layer's state is written only by this layer's own gdn_decode / gdn_chunked, never by the kernel
// just before it in the stream; callers must not launch two state-writing calls on the same state back to back
// within one PDL chain (one call per layer per decode graph is fine: graph launches are fully ordered).
// sm_90+: a thread-block cluster per key head (its 2 v-heads split into row slices; the gated norm sums over the
// cluster through distributed shared memory; Kernel picks the shape); before sm_90: a 1024-thread block per v-head
// (with tickets) or per key head.
void gdn_decode(const GdnDecodeArgs& a, cudaStream_t stream);
// Whether gdn_decode takes these head shapes (the model's: dk = dv = 128, Hv = 2·Hk).
bool gdn_decode_supported(const GdnDims& d);
// The unsigned counters GdnDecodeArgs::tickets holds for Hk key heads: one per (sequence, key head), for the
// largest batch gdn_decode_batched takes.
int64_t gdn_decode_ticket_count(int Hk);

// ---- a batch of sequences, one token each (the batched decode step, issue 31) ----
// B sequences, one new token each, each bit for bit what gdn_decode gives for that sequence alone: a as for gdn_decode
// with a.d.T = 1, proj row b at a.proj + b·a.ld_proj, out row b at a.out + b·Hv·dv, and the states of sequence b at
// conv_states[b] and rec_states[b] (device arrays of B pointers; a.conv_state and a.rec_state are not read;
// rec_states[b] 16-byte aligned, the states of different sequences distinct). 1 <= B <= 32; the shapes of
// gdn_decode_supported. The launch shape is gdn_decode's for a (a.kernel, a.force_portable, a.tickets), with a grid
// index per sequence, except that automatic takes cluster2_w16 on sm_90 for B ≥ 2 (more of the batch resident at once),
// and smem_w16 where B · Hk exceeds the SM count (TERN_GDN_BATCH_SHAPE names one shape for every B ≥ 2): the same
// arithmetic for each sequence. Launched with PDL like gdn_decode (the same rule for the states read before pdl_wait);
// the two tables are read before pdl_wait too, so they are launch constants of the step (written by a copy before it,
// never by the kernel just before this one).
// Returns whether it wrote a.out_tables: given, and the shape's blocks hold whole groups of 64 values of a v-head
// (every shape but cluster8_w8, cluster8_w16 and cluster16_w8).
bool gdn_decode_batched(const GdnDecodeArgs& a, int B, float* const* conv_states, float* const* rec_states,
                        cudaStream_t stream);
// gdn_decode for one sequence of a.d.T tokens whose states and kept buffers (GdnDecodeArgs::conv_keep, rec_keep;
// kept here) are the first entries of four device tables instead of arguments, read before pdl_wait as
// gdn_decode_batched's tables are: one captured step then serves any session (the verify step, issue 32).
// keep_token (null, or a device int in [0, T) read before pdl_wait like the tables): null keeps the states before
// every token as gdn_decode does; else only those before token *keep_token, in the kept buffers' first slot
// ([Ck-1, C] and [Hv, dv, dk]: a prefix snapshot taken inside a short call, Session::keep_state_at), by kernels of
// their own (the verification kernels' registers stay as they are); only where gdn_decode_keeps_one(a.tickets given).
// Returns whether it wrote a.out_tables: given, T ≤ 8 (one chunk) and a shape whose blocks hold whole groups of 64
// values (as gdn_decode_batched).
bool gdn_decode_from_tables(const GdnDecodeArgs& a, float* const* conv_state, float* const* rec_state,
                            float* const* conv_keep, float* const* rec_keep, const int* keep_token,
                            cudaStream_t stream);
// Whether gdn_decode_from_tables takes a keep_token here (with or without GdnDecodeArgs::tickets): where its automatic
// shape is cluster4_w16 (sm_90 code, not the portable path) or portable_split (tickets, TERN_GDN_PORTABLE_SPLIT not 0).
bool gdn_decode_keeps_one(bool tickets);

}  // namespace tern::cuda
