// The decode plan's Gated DeltaNet mixer core in one kernel, gdn_decode (gdn.cuh): conv + SiLU, q/k norms, gates, the
// delta rule on the fp32 state and the gated RMSNorm over 1..32 tokens (kGdnDecodeMaxTokens, in chunks of 8); a
// thread-block cluster per key head on sm_90, elsewhere two plain blocks per key head (one per v-head; one block per
// key head without tickets or with TERN_GDN_PORTABLE_SPLIT=0).
// gdn_decode_batched runs the same kernel over B sequences of one token (a grid z index per sequence), so that each
// sequence's arithmetic is exactly what gdn_decode does for it alone; from B = 2 on sm_90 in shapes of its own:
// cluster2_w16 (8 state rows per warp instead of 4, 2 registers per state float instead of 4: twice the rows resident
// per SM, B = 8 in one wave), and beyond one wave of it smem_w16 (16 rows per warp, 12 of them in shared memory: B = 16
// in one wave). Their numbers are cluster4_w16's: the rows' arithmetic does not depend on the shape (every
// multiply-add written out, see dot4), and the gated norm's sums of squares are formed over the same sets of 4 rows in
// the same order (see decode()).
#include "cuda/kernels/gdn/gdn.cuh"

#include <cooperative_groups.h>

#include <cstdlib>
#include <type_traits>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/warp_reduce.cuh"
#include "cuda/kernels/qmv/dp4a_tables.cuh"
#include "cuda/kernels/qmv/qmv_tile.cuh"

namespace tern::cuda {
namespace {

// ---- decode: conv + SiLU, q/k norms, gates, delta rule and gated norm in one kernel ------------------------------
// A "group" is everything one key head kh needs: its q/k channels, the kRatio = 2 v-heads that share it, their
// 2·dv = 256 state rows and v/z channels. A group is CS blocks, block `rank` owning group rows
// [rank·kRows, (rank+1)·kRows) (row r = v-head kh·2 + r/dv, value dim r%dv), NW warps of RPW rows each; a lane holds
// key dims 4·lane..4·lane+3 of its warp's rows in registers for all T tokens.
// The T tokens (1..kGdnDecodeMaxTokens) are processed in chunks of kDecodeChunk = 8 with the same per-chunk shared
// buffers and registers: the state stays in registers from chunk to chunk, the conv window passes through the
// block's s_conv_new (each thread its own channels), and every token runs the same code whatever its chunk (T tokens
// in one launch are bit for bit T launches of one token). The global states are read once before the first chunk
// and written once after the last. The CS blocks are a thread-block
// cluster (kCluster, sm_90: a v-head may span blocks, its sums of squares meet through distributed shared memory) or
// plain blocks that each hold whole v-heads (CS = 1: the group in one block; CS = 2: a block per v-head) and share
// nothing but the conv state.
// Every block recomputes the conv + SiLU of the group's 256 q/k channels (the L2 norms need whole heads) and of its
// own v channels. Conv state: the q/k entries are read by every block of the group and written by one of them only
// once every block has read them: in a cluster rank 0, after the cluster barrier that follows every block's reads;
// in plain blocks (CS > 1) the last block to take the group's ticket (GdnDecodeArgs::tickets, see below). A block's
// v entries are read and written by it alone.
// A launch covers B sequences of T tokens each (grid z = sequence; gdn_decode: B = 1, gdn_decode_batched: T = 1);
// the groups of different sequences share nothing.
constexpr int kDecodeChunk = 8, kDecodeMaxTaps = 8, kDecodeDk = 128, kDecodeDv = 128, kDecodeRatio = 2;
constexpr int kDecodeMaxSeqs = 32;  // gdn_decode_batched's B
static_assert(kGdnDecodeMaxTokens >= kDecodeChunk, "a launch takes at least one whole chunk");

// a·b over 4 lanes of a float4, each rounding spelt out: fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, a.x·b.x))). The
// delta rule below writes every multiply-add so too (fmaf, __fmul_rn), and so do the conv's taps and the q/k norms'
// sums of squares (fmaf), so that no shape's compilation may contract a sum otherwise: the shapes (and chunked or
// one-token forms) give the same bits because they run the same roundings. (A plain `u += w·x` is contracted at the
// compiler's discretion: the one-chunk kernels, sm_90a, nvcc 13.0, left the last tap a separate FMUL + FADD, the
// product taken from an FSEL between tokens, while the one-token kernels fused it, FFMA: the batched shapes' conv
// outputs, hence their outputs and states, differed from cluster4_w16's in the last bits.)
__device__ __forceinline__ float dot4(const float4& a, const float4& b) {
  return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, __fmul_rn(a.x, b.x))));
}

// Where the sequences' states are: null tables for gdn_decode (its one sequence's a.conv_state, a.rec_state), device
// arrays of B pointers for gdn_decode_batched.
struct StateTables {
  float* const* conv = nullptr;  // [B] → [Ck-1, C]
  float* const* rec = nullptr;   // [B] → [Hv, dv, dk]
  float* const* conv_keep = nullptr;  // [1] → [T, Ck-1, C] (gdn_decode_from_tables)
  float* const* rec_keep = nullptr;   // [1] → [gdn_kept_rec_floats(d, T)]
  const int* keep_token = nullptr;    // [1] (kKeepOne): keep only the state before this token, in slot 0
};

// kSq: the rows of one partial sum of squares of the gated norm (a warp's RPW rows in RPW / kSq row sets, each summed
// in row order into its own partial; a v-head's dv / kSq partials are then summed in one warp_sum). The sums of
// squares, hence the outputs, depend on kSq and on nothing else of the shape: the shapes with kSq = 4 (cluster4_w16,
// cluster2_w16, cluster4_w8, portable_split) give the same numbers.
// kMinBlocks: blocks per SM the registers must allow (__launch_bounds__); 0: none (no .minnctapersm at all: even 1
// changes ptxas's choice, cluster4_w16 then takes 80 registers instead of 64).
// kMaxT: the most tokens of a launch. kGdnDecodeMaxTokens: T may exceed kDecodeChunk (the loop over the chunks,
// kChunked); kDecodeChunk: one chunk of T ≤ kDecodeChunk tokens, the loop gone at compile time (the registers of the
// one-chunk code: the portable shapes' 64 per thread are tight); 1: one token (T = 1), the chunk's buffers and
// per-thread inputs (xin, zin) sized for it (the batched step's shapes: 64 registers for cluster2_w16 rather than the
// one-chunk code's 102). The code of a token is the same in all three.
// kKeepOne: the kept buffers take only the states before token *tables.keep_token, in their first slot (a prefix
// snapshot inside a short call); else (verification) the conv states before every token c0 + t, in slot c0 + t, and
// the recurrent state before the first token with every token's replay values (GdnReplayLayout). The one-token
// kernels (kMaxT = 1: the batched step's, which never keeps) have no code for either.
// kSmemRows: the last kSmemRows of a warp's RPW rows live in shared memory (gdn_smem_rows: each lane its own 16-byte
// pieces, copied there by cp.async before pdl_wait), the first RPW - kSmemRows in registers; the delta rule takes a
// shared set into registers, updates it and puts it back. More rows per SM than the register files hold (smem_w16).
template <int CS, bool kCluster, int NW, int RPW, int kSq, int kMinBlocks, int kTaps, int kMaxT, bool kKeepOne,
          int kSmemRows = 0>
__global__ void __launch_bounds__(NW * 32, kMinBlocks) gdn_decode_kernel(GdnDecodeArgs a, StateTables tables) {
  namespace cg = cooperative_groups;
  constexpr bool kChunked = kMaxT > kDecodeChunk;
  constexpr int kChunk = kChunked ? kDecodeChunk : kMaxT;  // tokens of a chunk (buffers, per-thread inputs)
  static_assert(kMaxT == 1 || kMaxT == kDecodeChunk || kMaxT == kGdnDecodeMaxTokens, "one token, one chunk or all");
  constexpr int kRows = NW * RPW;                      // state rows of this block
  constexpr int kQk = 2 * kDecodeDk;                   // q and k channels of the key head
  constexpr int kCh = kQk + kRows;                     // conv channels this block computes
  constexpr int kHeads = kRows > kDecodeDv ? kRows / kDecodeDv : 1;  // v-heads the block touches
  constexpr int kSets = RPW / kSq;                     // row sets (partial sums of squares) per warp
  constexpr int kSqPerBlock = kRows / kSq;             // partial sums of squares per block (per token)
  constexpr int kSqPerHead = kDecodeDv / kSq;          // partial sums of squares per v-head (over the group)
  constexpr bool kTicket = CS > 1 && !kCluster;        // plain blocks that meet only through the conv-state ticket
  // Whether the kernel can write out_proj's tables (GdnDecodeArgs::out_tables; the host passes them for one chunk of
  // T ≤ kDecodeChunk tokens only): one chunk, blocks of whole groups of 64 rows
  constexpr bool kTables = !kChunked && kRows % 64 == 0;
  static_assert(CS * kRows == kDecodeRatio * kDecodeDv, "a group covers the 2·dv rows of one key head");
  static_assert(kDecodeDv % kRows == 0 || kRows % kDecodeDv == 0, "blocks hold whole heads or slices of one head");
  static_assert(kDecodeDv % RPW == 0, "warps lie inside one head");
  static_assert(RPW % kSq == 0, "a warp's rows are whole row sets");
  static_assert(kCluster ? CS > 1 : kRows % kDecodeDv == 0, "a cluster has blocks to share; a plain block whole heads");
  constexpr int kRegRows = RPW - kSmemRows;  // the warp's rows in registers: 0 .. kRegRows - 1
  static_assert(kSmemRows == 0 || (kMaxT == 1 && !kKeepOne && kSmemRows % kSq == 0 && kSmemRows < RPW),
                "rows in shared memory: one token, whole row sets");
  static_assert(!kTicket || 2 * kChunk < NW, "the ticket's thread (warp NW - 1) has no task in step 3");
  // The per-chunk buffers (a chunk = up to kChunk tokens; reused by every chunk of the launch).
  __shared__ __align__(16) float s_x[kChunk][kCh];  // conv+SiLU outputs [t][q 128 | k 128 | v kRows]
  __shared__ float s_conv_new[kTaps - 1][kCh];      // the conv state of those channels after the chunk
  __shared__ float s_o[kChunk][kRows];              // delta-rule outputs
  __shared__ float s_sq[kChunk][kSqPerBlock];       // Σ o² per (token, row set), read across the group
  __shared__ float s_decay[kChunk][kHeads], s_beta[kChunk][kHeads], s_inv[kChunk][kHeads];
  __shared__ bool s_writes_qk;                            // kTicket: this block writes the q/k conv state

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int rank = blockIdx.x, kh = blockIdx.y, seq = blockIdx.z;
  const int T = int(a.d.T), Hk = a.d.Hk, Hv = a.d.Hv, Ck = a.Ck;
  const int64_t C = a.d.C(), ld = a.ld_proj;
  // The sequence's rows and states (the tables are launch constants: read before pdl_wait, see gdn.cuh).
  const float* const proj = a.proj + int64_t(seq) * T * ld;     // [T, ld]
  float* const out = a.out + int64_t(seq) * T * Hv * kDecodeDv;  // [T, Hv·dv]
  float* const conv_state = tables.conv ? tables.conv[seq] : a.conv_state;
  float* const rec_state = tables.rec ? tables.rec[seq] : a.rec_state;
  float* const conv_keep = tables.conv_keep ? tables.conv_keep[seq] : a.conv_keep;
  float* const rec_keep = tables.rec_keep ? tables.rec_keep[seq] : a.rec_keep;
  // The conv state before token tt of the launch is kept (kept(tt)) in slot keep_slot(tt): every one in its own slot,
  // or (kKeepOne) keep_token's alone, in slot 0. The recurrent state: keep_token's alone (kKeepOne), or (kReplay) the
  // one before token 0 and each token's replay values, in replay_slot(tt).
  constexpr bool kMayKeep = kMaxT > 1, kReplay = kMayKeep && !kKeepOne;
  int keep_token = 0;
  if constexpr (kKeepOne) keep_token = *tables.keep_token;
  auto kept = [&](int tt) { return !kKeepOne || tt == keep_token; };
  auto keep_slot = [&](int tt) -> int64_t { return kKeepOne ? 0 : tt; };
  const GdnReplayLayout replay = GdnReplayLayout::of(a.d);
  const int64_t state_floats = int64_t(Hv) * kDecodeDv * kDecodeDk;
  auto replay_slot = [&](int tt) { return rec_keep + state_floats + tt * replay.floats; };
  const int row0 = rank * kRows;                       // first group row of the block
  const int head0 = kh * kDecodeRatio + row0 / kDecodeDv;  // first v-head of the block
  const int j00 = row0 % kDecodeDv;                     // first value dim of the block inside head0
  // The warp's rows: v-head head0 + wslot, value dims wj0..wj0+RPW-1.
  const int wslot = (j00 + warp * RPW) / kDecodeDv, wj0 = (j00 + warp * RPW) % kDecodeDv;
  const int wh = head0 + wslot;

  // State rows, before pdl_wait(): see gdn.cuh (only this layer's own GDN kernels write them). They stay in
  // registers across the chunks and are stored once, after the last chunk's delta rule.
  float* S = rec_state + (int64_t(wh) * kDecodeDv + wj0) * kDecodeDk + 4 * lane;
  float4 s[RPW];  // rows kRegRows.. live in gdn_smem_rows, and in s only while the delta rule takes their set
#pragma unroll
  for (int r = 0; r < kRegRows; ++r) s[r] = *reinterpret_cast<const float4*>(S + r * kDecodeDk);
  // Row r >= kRegRows of this thread in shared memory: [r - kRegRows][thread].
  extern __shared__ __align__(16) float4 gdn_smem_rows[];
  const auto smem_row = [&](int r) -> float4& { return gdn_smem_rows[(r - kRegRows) * NW * 32 + threadIdx.x]; };
  if constexpr (kSmemRows > 0) {
#pragma unroll
    for (int r = kRegRows; r < RPW; ++r) cp_async_16(smem_addr(&smem_row(r)), S + r * kDecodeDk, 16u);
    cp_async_commit();
  }

  // Channel of local conv index lc: q (0..127), k (128..255), then the block's v rows.
  auto channel = [&](int lc) -> int64_t {
    if (lc < kDecodeDk) return int64_t(kh) * kDecodeDk + lc;
    if (lc < kQk) return int64_t(Hk) * kDecodeDk + int64_t(kh) * kDecodeDk + (lc - kDecodeDk);
    return 2LL * Hk * kDecodeDk + int64_t(kh) * kDecodeRatio * kDecodeDv + row0 + (lc - kQk);
  };
  constexpr int kNt = NW * 32, kChPerThread = (kCh + kNt - 1) / kNt;
  constexpr int kOutPerThread = (kChunk * kRows + kNt - 1) / kNt;
  // Conv weights of the thread's channels lc = tid + q·NT (launch constants): one chunk's before pdl_wait; with
  // chunks, per chunk (rather than held in registers through the delta rule).
  float cw[kChPerThread][kTaps];
  auto load_weights = [&] {
#pragma unroll
    for (int q = 0; q < kChPerThread; ++q) {
      const int lc = tid + q * kNt;
      const int64_t c = lc < kCh ? channel(lc) : 0;
#pragma unroll
      for (int j = 0; j < kTaps; ++j) cw[q][j] = lc < kCh && j < Ck ? a.conv_w[c * Ck + j] : 0.0f;
    }
  };
  if constexpr (!kChunked) load_weights();
  // The gates' constants of the thread's v-head (step 2) and the norm weights of its outputs (step 7), launch
  // constants too: loaded here, so that neither step waits for a round trip of its own between the barriers (at
  // their use, the gate threads would fetch both after step 1, one after the other, while the block waits).
  const int gate_head = head0 + tid % kHeads;
  const float dt_bias = a.dt_bias[gate_head], a_log = a.A_log[gate_head];
  float out_norm_w[kOutPerThread];
#pragma unroll
  for (int q = 0; q < kOutPerThread; ++q) out_norm_w[q] = a.norm_w[(j00 + (tid + q * kNt) % kRows) % kDecodeDv];

  pdl_wait();
  pdl_trigger();

  unsigned* const ticket = kTicket ? a.tickets + int64_t(seq) * Hk + kh : nullptr;
  unsigned drawn = 0;

  // The chunks: tokens c0..c0+Tc-1 (Tc = min(kDecodeChunk, T - c0)), the state s carried in registers. Every token
  // runs the same code whatever its chunk (so T tokens in one launch give what T launches of one token give).
  for (int c0 = 0; c0 < (kChunked ? T : 1); c0 += kDecodeChunk) {
    const int Tc = kChunked ? min(kDecodeChunk, T - c0) : kMaxT == 1 ? 1 : T;
    const bool first = !kChunked || c0 == 0, last = !kChunked || c0 + Tc >= T;
    const float* const cproj = proj + int64_t(c0) * ld;  // the chunk's rows
    float* const cout = out + int64_t(c0) * Hv * kDecodeDv;
    // Every global input of the chunk is requested up front: (with chunks) the conv weights, the window and inputs
    // of the thread's channels, the gates and the z of the outputs. The window: the first chunk's from the conv
    // state (the only reads of the global conv state: the q/k ticket and the cluster barrier below order them before
    // the one write after the last chunk), a later chunk's from s_conv_new, where the same thread left it after the
    // chunk before.
    if constexpr (kChunked) load_weights();
    float win[kChPerThread][kTaps], xin[kChPerThread][kChunk];
#pragma unroll
    for (int q = 0; q < kChPerThread; ++q) {
      const int lc = tid + q * kNt;
      const int64_t c = lc < kCh ? channel(lc) : 0;
#pragma unroll
      for (int t = 0; t < kChunk; ++t) xin[q][t] = lc < kCh && t < Tc ? cproj[t * ld + c] : 0.0f;
#pragma unroll
      for (int j = 0; j < kTaps; ++j)
        win[q][j] = lc < kCh && j < Ck - 1 ? (first ? conv_state[j * C + c] : s_conv_new[j][lc]) : 0.0f;
    }
    float gate_a = 0.0f, gate_b = 0.0f;
    if (tid < Tc * kHeads) {
      const int t = tid / kHeads, h = head0 + tid % kHeads;
      const float* row = cproj + t * ld + C + int64_t(Hv) * kDecodeDv;  // [b (Hv) | a (Hv)]
      gate_b = row[h];
      gate_a = row[Hv + h];
    }
    float zin[kOutPerThread];
#pragma unroll
    for (int q = 0; q < kOutPerThread; ++q) {
      const int i = tid + q * kNt, t = i / kRows, r = i % kRows;
      const int64_t col = int64_t(head0) * kDecodeDv + j00 + r;  // the block's rows are consecutive columns
      zin[q] = i < Tc * kRows ? cproj[t * ld + C + col] : 0.0f;
    }

    // 1. conv + SiLU over the chunk's tokens, window in registers (taps unrolled to kTaps, guarded by Ck).
#pragma unroll
    for (int q = 0; q < kChPerThread; ++q) {
      const int lc = tid + q * kNt;
      if (lc >= kCh) continue;
#pragma unroll
      for (int t = 0; t < kChunk; ++t) {
        if (t >= Tc) break;
        if (kMayKeep && conv_keep && (lc >= kQk || rank == 0) && kept(c0 + t)) {  // the state before token c0 + t
          const int64_t c = channel(lc), slot = keep_slot(c0 + t);
#pragma unroll
          for (int j = 0; j + 1 < kTaps; ++j)
            if (j < Ck - 1) conv_keep[(slot * (Ck - 1) + j) * C + c] = win[q][j];
        }
        // u = Σ_j w_j·x_j, one fmaf per tap in tap order (the first: w_0·x_0 + 0). All kTaps taps, unguarded: beyond
        // Ck the weight and the window are 0 (load_weights, the window's loads and shifts), so such a tap adds +0 (it
        // changes nothing but a sum of -0, to +0). Unguarded, ptxas keeps cluster4_w16's one-chunk kernel (4 taps) at
        // 64 registers without spills (guarded by j < Ck: 20 bytes of spills).
        float u = 0.0f;
#pragma unroll
        for (int j = 0; j < kTaps; ++j) {
          if (j == Ck - 1) win[q][j] = xin[q][t];
          u = fmaf(cw[q][j], win[q][j], u);
        }
        s_x[t][lc] = u / (1.0f + expf(-u));
#pragma unroll
        for (int j = 0; j + 1 < kTaps; ++j)
          if (j < Ck - 1) win[q][j] = win[q][j + 1];
      }
#pragma unroll
      for (int j = 0; j + 1 < kTaps; ++j)
        if (j < Ck - 1) s_conv_new[j][lc] = win[q][j];
    }
    // 2. gates of the block's v-heads
    if (tid < Tc * kHeads) {
      const int t = tid / kHeads, hs = tid % kHeads;  // the v-head gate_head = head0 + hs
      const float x = gate_a + dt_bias;
      const float sp = x > 20.0f ? x : log1pf(expf(x));
      s_decay[t][hs] = expf(-expf(a_log) * sp);
      s_beta[t][hs] = 1.0f / (1.0f + expf(-gate_b));
      // the head's decay, by the block that holds its first row
      if (kReplay && rec_keep && j00 == 0) replay_slot(c0 + t)[replay.g_at + gate_head] = s_decay[t][hs];
    }
    __syncthreads();
    // The group's ticket (kTicket, first chunk; [sequence][key head] in a.tickets, 0 at every launch's start): every
    // thread of the block has read its conv-state entries (the first chunk's window, before the barrier above), so the
    // last thread takes a ticket. The block that draws CS - 1 is the last of the group to have read the q/k entries:
    // it writes them after the last chunk and sets the ticket back to 0 for the next launch (which touches it only
    // after its pdl_wait, once this one has ended).
    // Memory order: the readers' loads → barrier → fence → atomicAdd (release side); the last block's atomicAdd →
    // fence → barrier (step 5) → its stores (acquire side): the fences synchronise through the atomic, so no block's
    // read of a q/k entry can see the new value. The drawn number is looked at only after step 4, which hides the
    // atomic's latency; the last thread's warp, NW - 1, has no task in step 3 (2·Tc ≤ 16 < NW tasks).
    if constexpr (kTicket) {
      if (first && tid == kNt - 1) {
        __threadfence();
        drawn = atomicAdd(ticket, 1u);
      }
    }
    // 3. L2 norms of q (scaled by 1/√dk) and k, a warp per (token, q|k)
    for (int task = warp; task < 2 * Tc; task += NW) {
      float* v = &s_x[task / 2][(task % 2) * kDecodeDk];
      float ss = 0.0f;
#pragma unroll
      for (int i = 0; i < kDecodeDk / 32; ++i) ss = fmaf(v[lane + 32 * i], v[lane + 32 * i], ss);
      float inv = rsqrtf(warp_sum(ss) + 1e-6f);
      if (task % 2 == 0) inv *= rsqrtf(float(kDecodeDk));
#pragma unroll
      for (int i = 0; i < kDecodeDk / 32; ++i) v[lane + 32 * i] *= inv;
    }
    __syncthreads();
    // 4. the delta rule, token by token: with ks = S_old·k, qs = S_old·q (one pass over the state),
    //    δ = β(v − e^g·ks), S = e^g·S + δ kᵀ, o = e^g·qs + (q·k)·δ.
    if constexpr (kSmemRows > 0) cp_async_wait<0>();  // this thread's shared rows have landed (its own copies)
    for (int t = 0; t < Tc; ++t) {
      // the state before token c0 + t (kKeepOne: keep_token's; kReplay: token 0's), at the rows' offset in rec_state
      if (kMayKeep && rec_keep && (kKeepOne ? kept(c0 + t) : c0 + t == 0)) {
        float* K = rec_keep + (S - rec_state);
#pragma unroll
        for (int r = 0; r < RPW; ++r)
          *reinterpret_cast<float4*>(K + r * kDecodeDk) = r < kRegRows ? s[r] : smem_row(r);
      }
      // Row set by row set (kSq rows each: the butterflies of one set at a time, fewer registers than all RPW rows'
      // at once; q·k's butterfly with the first set's); each row's arithmetic is the same whatever the set.
      const float4 q = *reinterpret_cast<const float4*>(&s_x[t][4 * lane]);
      const float4 k = *reinterpret_cast<const float4*>(&s_x[t][kDecodeDk + 4 * lane]);
      if (kReplay && rec_keep && rank == 0 && warp == 0)  // the key head's normed k, by one warp of the group
        *reinterpret_cast<float4*>(replay_slot(c0 + t) + replay.k_at + int64_t(kh) * kDecodeDk + 4 * lane) = k;
      float qk = dot4(q, k);
      float sq[kSets], mine = 0.0f, mine_delta = 0.0f;
#pragma unroll
      for (int set = 0; set < kSets; ++set) {
        const bool shared_set = kSmemRows > 0 && set * kSq >= kRegRows;  // known at compile time (unrolled)
        if (shared_set) {
#pragma unroll
          for (int r = 0; r < kSq; ++r) s[set * kSq + r] = smem_row(set * kSq + r);
        }
        float ks[kSq], qs[kSq];
#pragma unroll
        for (int r = 0; r < kSq; ++r) {
          const float4& sr = s[set * kSq + r];
          ks[r] = dot4(sr, k);
          qs[r] = dot4(sr, q);
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
          if (set == 0) qk += __shfl_xor_sync(0xffffffffu, qk, off);
#pragma unroll
          for (int r = 0; r < kSq; ++r) {
            ks[r] += __shfl_xor_sync(0xffffffffu, ks[r], off);
            qs[r] += __shfl_xor_sync(0xffffffffu, qs[r], off);
          }
        }
        const float g = s_decay[t][wslot], b = s_beta[t][wslot];
        sq[set] = 0.0f;
#pragma unroll
        for (int r = 0; r < kSq; ++r) {
          const int wr = set * kSq + r;  // the row within the warp's
          const float delta = __fmul_rn(b, fmaf(-g, ks[r], s_x[t][kQk + warp * RPW + wr]));
          s[wr].x = fmaf(g, s[wr].x, __fmul_rn(k.x, delta));
          s[wr].y = fmaf(g, s[wr].y, __fmul_rn(k.y, delta));
          s[wr].z = fmaf(g, s[wr].z, __fmul_rn(k.z, delta));
          s[wr].w = fmaf(g, s[wr].w, __fmul_rn(k.w, delta));
          const float o = fmaf(g, qs[r], __fmul_rn(qk, delta));
          sq[set] = fmaf(o, o, sq[set]);
          if (lane == wr) mine = o;
          if (kReplay && lane == wr) mine_delta = delta;
        }
        if (shared_set) {
#pragma unroll
          for (int r = 0; r < kSq; ++r) smem_row(set * kSq + r) = s[set * kSq + r];
        }
      }
      if (lane < RPW) s_o[t][warp * RPW + lane] = mine;
      if (kReplay && rec_keep && lane < RPW)  // the warp's rows' δ
        replay_slot(c0 + t)[replay.delta_at + int64_t(wh) * kDecodeDv + wj0 + lane] = mine_delta;
      if (lane == 0) {
#pragma unroll
        for (int set = 0; set < kSets; ++set) s_sq[t][warp * kSets + set] = sq[set];  // the block's row sets in order
      }
    }
    if (last) {
#pragma unroll
      for (int r = 0; r < RPW; ++r)
        *reinterpret_cast<float4*>(S + r * kDecodeDk) = r < kRegRows ? s[r] : smem_row(r);
    }
    if constexpr (kTicket) {
      if (first && tid == kNt - 1) {
        const bool writer = drawn == unsigned(CS - 1);
        if (writer) {
          __threadfence();  // acquire: the group's reads before this block's conv-state stores
          *ticket = 0u;     // ready for the next launch
        }
        s_writes_qk = writer;
      }
    }

    // 5. group barrier: every block's partial sums are written and (in a cluster, first chunk) its conv-state reads
    //    are done; plain blocks: the block's own barrier, which also publishes s_writes_qk
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (kCluster) cg::this_cluster().sync(); else __syncthreads();
#else
    if constexpr (kCluster) __trap();  // never launched: the host takes the cluster path only for sm_90 binaries
    __syncthreads();
#endif
    // The partial sums of group block `block`; a plain block holds whole heads, so it reads only its own (block =
    // rank).
    auto partials = [&](int block) -> const float* {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      if constexpr (kCluster) return cg::this_cluster().map_shared_rank(&s_sq[0][0], block);
#endif
      return &s_sq[0][0];
    };
    // 6. per (token, v-head of the block): inv = rsqrt(mean(o²) + eps) over the head's dv rows: its kSqPerHead
    //    partial sums (group row set gp = group row / kSq, in block gp / kSqPerBlock), lane by lane in row order
    for (int task = warp; task < Tc * kHeads; task += NW) {
      const int t = task / kHeads, hs = task % kHeads;
      const int gp0 = (head0 - kh * kDecodeRatio + hs) * kSqPerHead;  // first group row set of the head
      float ss = 0.0f;
#pragma unroll
      for (int i = 0; i < (kSqPerHead + 31) / 32; ++i) {
        if (lane + 32 * i >= kSqPerHead) break;
        const int gp = gp0 + lane + 32 * i;
        ss += partials(gp / kSqPerBlock)[t * kSqPerBlock + gp % kSqPerBlock];
      }
      ss = warp_sum(ss);
      if (lane == 0) s_inv[t][hs] = rsqrtf(ss / float(kDecodeDv) + a.eps);
    }
    __syncthreads();
    // 7. gated norm out, and after the last chunk the conv state (q/k channels by one block of the group: rank 0, or
    //    the ticket's last)
#pragma unroll
    for (int q = 0; q < kOutPerThread; ++q) {
      const int i = tid + q * kNt, t = i / kRows, r = i % kRows;
      if (i >= Tc * kRows) break;
      const int hs = (j00 + r) / kDecodeDv, j = (j00 + r) % kDecodeDv;
      const int64_t col = int64_t(head0 + hs) * kDecodeDv + j;
      const float zz = zin[q];
      const float y = s_o[t][r] * s_inv[t][hs] * out_norm_w[q] * (zz / (1.0f + expf(-zz)));  // norm_w[j]
      cout[t * int64_t(Hv) * kDecodeDv + col] = y;
      if constexpr (kTables) s_o[t][r] = y;  // the thread's own entry: read above, by no one else since step 6
    }
    // out_proj's tables from the block's outputs (whole groups of 64: warp w takes words 32w.. of the block's rows,
    // in order, so each lane octet holds one group), written as qmv_dp4a_prequant_kernel would write them from out:
    // token t of sequence seq is out's row seq·T + t (one of the two is 0), in token slot row % 8 of tile row / 8.
    if constexpr (kTables) {
      if (a.out_tables) {
        __syncthreads();  // s_o holds the outputs
        constexpr int kWords = kRows / 8;
        const dp4a::TableOffsets o = dp4a::table_offsets(Hv * kDecodeDv / 32);
        const int word0 = (head0 * kDecodeDv + j00) / 8;
        for (int t = 0; t < Tc; ++t) {
          const int row = kMaxT == 1 ? seq : seq * T + t;
          uint8_t* const tile = a.out_tables + int64_t(row / dp4a::kTileTokens) * o.bytes;
          for (int w = warp * 32; w < kWords; w += NW * 32) {  // uniform over the warp
            const int lw = w + lane;
            const bool has = lw < kWords;
            float v[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = has ? s_o[t][8 * lw + e] : 0.0f;
            dp4a::table_word(tile, o, word0 + lw, row % dp4a::kTileTokens, v, has);
          }
          if (rank == 0 && kh == 0 && tid == 0)
            reinterpret_cast<float*>(tile + o.rinv)[row % dp4a::kTileTokens] = 1.0f;
        }
      }
    }
    if (last) {
      const bool writes_qk = kTicket ? s_writes_qk : rank == 0;
      for (int lc = tid; lc < kCh; lc += NW * 32) {
        if (lc < kQk && !writes_qk) continue;
        const int64_t c = channel(lc);
        for (int j = 0; j < Ck - 1; ++j) conv_state[j * C + c] = s_conv_new[j][lc];
      }
    }
    // Keep s_sq alive until every block of the cluster has read it (the next chunk's step 4 writes it again).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (kCluster) cg::this_cluster().sync();
#endif
  }
}

// sm_90: clusters of blocks (GdnDecodeArgs::Kernel; automatic: clusters of 4 × 16 warps × 4 rows, 64 blocks, or for the
// batched step of B ≥ 2 clusters of 2 × 16 warps × 8 rows, 32·B blocks, and beyond one wave of those a plain block of
// 16 warps × 16 rows per key head with 12 rows a warp in shared memory, 16·B blocks); without clusters: a block of 32
// warps × 4 rows per v-head (portable_split: 32 blocks, the tickets given), or one block of 32 warps × 8 rows per key
// head (portable: 16 blocks).
constexpr int kDecodeClusterCS = 8, kDecodeClusterNW = 8, kDecodeClusterRPW = 4;
constexpr int kDecodePortableNW = 32, kDecodePortableRPW = 8;
constexpr int kDecodeSplitNW = 32, kDecodeSplitRPW = 4;  // RPW 4 as cluster4_w16's: the same sums of squares
// The batched step's shapes (sm_90): 8 rows per warp, summed in sets of 4 (so the sums of squares are cluster4_w16's):
// cluster2_w16 (2 × 16 warps, 2 blocks per SM) and cluster4_w8 (4 × 8 warps, 3 blocks per SM); see decode().
constexpr int kDecodeBatchRPW = 8, kDecodeBatchSq = 4;
// smem_w16: 16 rows per warp, the last 12 in shared memory (16 warps × 12 × 16 B a lane = 96 KB a block); its
// one-token kernel at conv width ≤ 4, bound to 2 blocks per SM (64 registers).
constexpr int kDecodeSmemNW = 16, kDecodeSmemRPW = 16, kDecodeSmemRows = 12;
constexpr int kDecodeSmemBytes = kDecodeSmemNW * 32 * kDecodeSmemRows * int(sizeof(float4));
constexpr auto smem_w16_kernel =
    gdn_decode_kernel<1, false, kDecodeSmemNW, kDecodeSmemRPW, kDecodeBatchSq, 2, 4, 1, false, kDecodeSmemRows>;

// Whether smem_w16's kernel runs 2 blocks per SM here (its shared memory allowed first: sm_90's 228 KB hold two, an
// A100's 164 or an RTX card's 100 do not). automatic_kind asks it from the first batched call on, which runs outside
// any capture, so that the attribute is set there.
bool smem_rows_fit() {
  static const bool fit = [] {
    if (kDecodeSmemBytes > qtile::max_dynamic_smem()) return false;
    TERN_CUDA(cudaFuncSetAttribute(smem_w16_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kDecodeSmemBytes));
    int blocks = 0;
    TERN_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, smem_w16_kernel, kDecodeSmemNW * 32,
                                                            size_t(kDecodeSmemBytes)));
    return blocks >= 2;
  }();
  return fit;
}

}  // namespace

namespace {

// One launch of shape (CS blocks per key head, in a cluster or plain; NW warps, RPW rows per warp, kSq rows per
// partial sum of squares; kMinBlocks blocks per SM) over B sequences (grid z).
// kSmemRows > 0: that many of each warp's rows in shared memory (16 bytes a lane each).
template <int CS, bool kCluster, int NW, int RPW, int kSq, int kMinBlocks, int kTaps, int kMaxT, bool kKeepOne = false,
          int kSmemRows = 0>
void launch_decode_kernel(const GdnDecodeArgs& a, int B, const StateTables& tables, cudaStream_t stream) {
  auto kernel = gdn_decode_kernel<CS, kCluster, NW, RPW, kSq, kMinBlocks, kTaps, kMaxT, kKeepOne, kSmemRows>;
  const dim3 grid(CS, unsigned(a.d.Hk), unsigned(B));
  // Shared rows: smem_w16's kernel alone, whose shared memory smem_rows_fit allowed before any launch of it.
  constexpr int smem = kSmemRows * NW * 32 * int(sizeof(float4));
  static_assert(smem == 0 || smem == kDecodeSmemBytes, "shared rows: smem_w16 only (smem_rows_fit)");
  if constexpr (!kCluster) {
    launch_pdl("gdn_decode", kernel, grid, dim3(NW * 32), size_t(smem), stream, a, tables);
  } else {
    if constexpr (CS > 8) {  // non-portable cluster size: allowed once, outside any capture (the first call is eager)
      static const bool allowed = [&] {
        TERN_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
        return true;
      }();
      (void)allowed;
    }
    launch_cluster_pdl("gdn_decode (cluster)", kernel, grid, dim3(NW * 32), CS, size_t(smem), stream, a, tables);
  }
}
// One shape's launch: the kernel of 4 taps for the model's conv width (fewer registers), of 8 beyond; the one-chunk
// kernel up to kDecodeChunk tokens, the chunked one beyond. kSq: rows per partial sum of squares (RPW: one per warp).
// kOneTokenBlocks > 0 (the batched step's shapes): T = 1 takes the one-token kernel, at conv width ≤ 4 bound to that
// many blocks per SM (__launch_bounds__'s second argument; the other kernels have none). kKeepOne: the kernels that
// keep one state (gdn_decode_from_tables with a keep_token).
template <int CS, bool kCluster, int NW, int RPW, int kSq = RPW, int kOneTokenBlocks = 0, bool kKeepOne = false>
void launch_decode(const GdnDecodeArgs& a, int B, const StateTables& tables, cudaStream_t stream) {
  const int T = int(a.d.T);
  const bool short_conv = a.Ck <= 4;
  const bool keeps = a.rec_keep || tables.rec_keep;  // the one-token kernels keep nothing
  if constexpr (kOneTokenBlocks > 0) {
    if (T == 1 && !keeps && short_conv)
      return launch_decode_kernel<CS, kCluster, NW, RPW, kSq, kOneTokenBlocks, 4, 1>(a, B, tables, stream);
    if (T == 1 && !keeps) return launch_decode_kernel<CS, kCluster, NW, RPW, kSq, 0, 8, 1>(a, B, tables, stream);
  }
  constexpr int kOne = kDecodeChunk, kAll = kGdnDecodeMaxTokens;
  if (T <= kDecodeChunk && short_conv)
    return launch_decode_kernel<CS, kCluster, NW, RPW, kSq, 0, 4, kOne, kKeepOne>(a, B, tables, stream);
  if (T <= kDecodeChunk)
    return launch_decode_kernel<CS, kCluster, NW, RPW, kSq, 0, 8, kOne, kKeepOne>(a, B, tables, stream);
  if (short_conv) return launch_decode_kernel<CS, kCluster, NW, RPW, kSq, 0, 4, kAll, kKeepOne>(a, B, tables, stream);
  return launch_decode_kernel<CS, kCluster, NW, RPW, kSq, 0, 8, kAll, kKeepOne>(a, B, tables, stream);
}

// The shape `automatic` takes for B sequences (gdn_decode_keeps_one asks it too). The cluster shapes run when the code
// chosen for this device was compiled for sm_90+ (not a JIT of the sm_80 PTX, not the portable path). Without them: a
// block per v-head when the caller gave the tickets, unless TERN_GDN_PORTABLE_SPLIT=0 (then, as without tickets, one
// block per key head). The switches are read once, outside any capture.
// On sm_90:
//  - one sequence (gdn_decode, gdn_decode_from_tables, gdn_decode_batched with B = 1): cluster4_w16, fastest in the
//    workbench (H200, 2026-12-01: 5.2 µs vs 6.2 for cluster8_w8). Its 64 blocks (Hk = 16) are under one wave
//    already, where 8 rows per warp would only lengthen each warp's chain; kept (not measured against those).
//  - gdn_decode_batched with B ≥ 2 (only it passes B > 1 here): cluster2_w16 (TERN_GDN_BATCH_SHAPE=cluster4_w16 or
//    cluster4_w8 for the others). Its bits are cluster4_w16's since the conv's last tap became an explicit fmaf
//    (on 2340328 some kernels contracted it and others did not): CudaGdnDecode.BatchShapesAreBitIdenticalToCluster4
//    and the batch-invariance tests passed on the H200 (2026-12-05), and it gave +4.8% / +4.4% at 8 / 16 streams
//    (2,078 → 2,177 and 2,455 → 2,563 tok/s, docs/benchmarks.md). The step is latency-bound and its state (B · 2 MB) is as large as the register files: cluster4_w16 holds 16 state
//    floats per thread in 64 registers (4 per float), 2 blocks of 512 threads per SM = 128 rows per SM, so B = 8
//    is 512 blocks over 264 slots on the H200's 132 SMs (1.94 waves; Nsight: 22.4 µs, 47% occupancy, DRAM 17%).
//    cluster2_w16's one-token kernel holds 32 in 64 registers (2 per float): 2 blocks of 512 threads = 256 rows per
//    SM, B = 8 is 256 blocks over 264 slots (0.97 waves), B = 16 1.94 (cluster4_w16: 3.9). cluster4_w8 (80
//    registers, 2.5 per float): 3 blocks of 256 threads = 192 rows per SM, B = 8 1.29 waves, B = 16 2.59.
//    Each gives a sequence the numbers cluster4_w16 gives it alone (the same per-row arithmetic, the sums of squares
//    in sets of 4 rows): the same FP instruction sequence in the SASS since the fmaf fix.
//  - where a wave of cluster2_w16 does not hold the batch (B · Hk > the SMs: B ≥ 9 on 132 SMs, two waves, each block
//    one chain of loads, barriers and reductions; Nsight on an H100 at B = 16: 33 µs, DRAM 44%, docs/benchmarks.md):
//    smem_w16, a block of 16 warps × 16 rows per key head, 12 of each warp's rows in shared memory (96 KB a block),
//    2 blocks per SM = 512 rows, so B ≤ 16 is one wave with one chain per block. Its numbers are cluster4_w16's too.
//    TERN_GDN_BATCH_SHAPE=cluster2_w16 keeps cluster2_w16 for every B, =smem_w16 takes smem_w16 from B = 2.
GdnDecodeArgs::Kernel automatic_kind(int B, bool tickets, int Hk) {
  using K = GdnDecodeArgs::Kernel;
  static const bool cluster_ok = sm90_features();
  static const bool split_ok = !env_is("TERN_GDN_PORTABLE_SPLIT", "0");
  // TERN_GDN_BATCH_SHAPE (the batched step's shape for B >= 2): cluster4_w16, cluster4_w8, cluster2_w16 or smem_w16;
  // else cluster2_w16 up to one wave of it, smem_w16 beyond.
  static const bool by_wave = [] {
    const char* shape = std::getenv("TERN_GDN_BATCH_SHAPE");
    return !shape || !*shape;
  }();
  static const K batch_kind = env_is("TERN_GDN_BATCH_SHAPE", "cluster4_w16") ? K::cluster4_w16
                              : env_is("TERN_GDN_BATCH_SHAPE", "cluster4_w8")  ? K::cluster4_w8
                              : env_is("TERN_GDN_BATCH_SHAPE", "smem_w16")     ? K::smem_w16
                                                                               : K::cluster2_w16;
  if (!cluster_ok) return tickets && split_ok ? K::portable_split : K::portable;
  if (B < 2) return K::cluster4_w16;
  const bool smem_ok = smem_rows_fit();  // asked at every batched call, so first outside a capture
  if (by_wave && int64_t(B) * Hk > qtile::sm_count() && smem_ok) return K::smem_w16;
  return batch_kind;
}

// The shape a launch of B sequences takes: a.kernel (a.force_portable: portable), automatic_kind where it is automatic
// or a cluster shape where the sm_90 code does not run.
GdnDecodeArgs::Kernel launch_kind(const GdnDecodeArgs& a, int B) {
  using K = GdnDecodeArgs::Kernel;
  const K kind = a.force_portable ? K::portable : a.kernel;
  if (kind == K::automatic) return automatic_kind(B, a.tickets != nullptr, a.d.Hk);
  if (!sm90_features() && kind != K::portable && kind != K::portable_split)
    return automatic_kind(B, a.tickets != nullptr, a.d.Hk);  // the cluster shapes only where the sm_90 code runs
  return kind;
}

// Whether a launch shape (launch_kind's, never automatic) writes GdnDecodeArgs::out_tables: blocks of whole groups
// of 64 rows (kTables).
bool writes_tables(GdnDecodeArgs::Kernel kind) {
  using K = GdnDecodeArgs::Kernel;
  return kind != K::cluster8_w8 && kind != K::cluster8_w16 && kind != K::cluster16_w8;
}

// gdn_decode and gdn_decode_batched after their own checks of the states: the other arguments' checks and the launch
// shape, the same for both (so that a sequence of a batch runs the code it runs alone).
void decode(const GdnDecodeArgs& a, int B, const StateTables& tables, cudaStream_t stream) {
  const GdnDims& d = a.d;
  TERN_CHECK(d.T >= 1 && d.T <= kGdnDecodeMaxTokens, "gdn_decode: ", d.T, " tokens (1..", kGdnDecodeMaxTokens, ")");
  TERN_CHECK(gdn_decode_supported(d),
             "gdn_decode: needs dk = dv = 128 and Hv = 2·Hk (got dk ", d.dk, ", dv ", d.dv, ", Hk ", d.Hk, ", Hv ",
             d.Hv, ")");
  TERN_CHECK(a.Ck >= 1 && a.Ck <= kDecodeMaxTaps, "gdn_decode: conv width ", a.Ck, " not in [1, ", kDecodeMaxTaps,
             "]");
  TERN_CHECK(a.ld_proj >= d.C() + int64_t(d.Hv) * d.dv + 2 * d.Hv, "gdn_decode: ld_proj ", a.ld_proj, " too small");
  TERN_CHECK(a.proj && a.conv_w && a.A_log && a.dt_bias && a.norm_w && a.out, "gdn_decode: null pointer");
  using K = GdnDecodeArgs::Kernel;
  const K kind = launch_kind(a, B);
  TERN_CHECK(!a.out_tables || ((B == 1 ? d.T <= kDecodeChunk : d.T == 1) && writes_tables(kind)),
             "gdn_decode: out_tables need one token per sequence of a batch or one chunk of one sequence, and a shape "
             "whose blocks hold whole groups of 64 values");
  TERN_CHECK(kind != K::portable_split || a.tickets,
             "gdn_decode: the portable_split shape needs GdnDecodeArgs::tickets");
  if (tables.keep_token) {  // one kept state (gdn_decode_from_tables): cluster4_w16's or portable_split's kernels
    TERN_CHECK(kind == K::cluster4_w16 || kind == K::portable_split,
               "gdn_decode: one kept state needs the cluster4_w16 or portable_split shape (see gdn_decode_keeps_one)");
    if (kind == K::portable_split)
      return launch_decode<kDecodeRatio, false, kDecodeSplitNW, kDecodeSplitRPW, kDecodeSplitRPW, 0, true>(a, B, tables,
                                                                                                       stream);
    return launch_decode<4, true, 16, 4, 4, 0, true>(a, B, tables, stream);
  }
  switch (kind) {
    case K::cluster8_w16:
      return launch_decode<8, true, 16, 2>(a, B, tables, stream);
    case K::cluster16_w8:
      return launch_decode<16, true, 8, 2>(a, B, tables, stream);
    case K::cluster4_w16:
      return launch_decode<4, true, 16, 4>(a, B, tables, stream);
    case K::cluster2_w16:
      return launch_decode<2, true, 16, kDecodeBatchRPW, kDecodeBatchSq, 2>(a, B, tables, stream);
    case K::cluster4_w8:
      return launch_decode<4, true, 8, kDecodeBatchRPW, kDecodeBatchSq, 3>(a, B, tables, stream);
    case K::smem_w16:  // one token at conv width ≤ 4 where the shared rows fit (keeping nothing); else cluster2_w16
      if (d.T == 1 && a.Ck <= 4 && !a.rec_keep && !tables.rec_keep && smem_rows_fit())
        return launch_decode_kernel<1, false, kDecodeSmemNW, kDecodeSmemRPW, kDecodeBatchSq, 2, 4, 1, false,
                                    kDecodeSmemRows>(a, B, tables, stream);
      return launch_decode<2, true, 16, kDecodeBatchRPW, kDecodeBatchSq, 2>(a, B, tables, stream);
    case K::portable:
      return launch_decode<1, false, kDecodePortableNW, kDecodePortableRPW>(a, B, tables, stream);
    case K::portable_split:
      return launch_decode<kDecodeRatio, false, kDecodeSplitNW, kDecodeSplitRPW>(a, B, tables, stream);
    default:
      return launch_decode<kDecodeClusterCS, true, kDecodeClusterNW, kDecodeClusterRPW>(a, B, tables, stream);
  }
}

}  // namespace

bool gdn_decode_supported(const GdnDims& d) {
  return d.dk == kDecodeDk && d.dv == kDecodeDv && d.Hk > 0 && d.Hv == kDecodeRatio * d.Hk;
}

int64_t gdn_decode_ticket_count(int Hk) { return int64_t(kDecodeMaxSeqs) * Hk; }

bool gdn_decode_keeps_one(bool tickets) {
  const GdnDecodeArgs::Kernel kind = automatic_kind(1, tickets, 0);
  return kind == GdnDecodeArgs::Kernel::cluster4_w16 || kind == GdnDecodeArgs::Kernel::portable_split;
}

void gdn_decode(const GdnDecodeArgs& a, cudaStream_t stream) {
  if (a.d.T == 0) return;
  TERN_CHECK((a.Ck == 1 || a.conv_state) && a.rec_state, "gdn_decode: null state");
  TERN_CHECK(reinterpret_cast<uintptr_t>(a.rec_state) % 16 == 0 && reinterpret_cast<uintptr_t>(a.rec_keep) % 16 == 0,
             "gdn_decode: state not 16-byte aligned");
  TERN_CHECK(!a.conv_keep == !a.rec_keep, "gdn_decode: keep both states or neither");
  decode(a, 1, StateTables{}, stream);
}

bool gdn_decode_batched(const GdnDecodeArgs& a, int B, float* const* conv_states, float* const* rec_states,
                        cudaStream_t stream) {
  TERN_CHECK(a.d.T == 1, "gdn_decode_batched: one token per sequence (d.T = ", a.d.T, ")");
  TERN_CHECK(B >= 1 && B <= kDecodeMaxSeqs, "gdn_decode_batched: ", B, " sequences (1..", kDecodeMaxSeqs, ")");
  TERN_CHECK((a.Ck == 1 || conv_states) && rec_states, "gdn_decode_batched: null state table");
  TERN_CHECK(!a.conv_keep && !a.rec_keep, "gdn_decode_batched: kept states are gdn_decode's (one sequence)");
  TERN_CHECK(!a.out_tables || (reinterpret_cast<uintptr_t>(a.out_tables) & 15) == 0,
             "gdn_decode_batched: out_tables not 16-byte aligned");
  GdnDecodeArgs b = a;
  if (b.out_tables && !writes_tables(launch_kind(a, B))) b.out_tables = nullptr;
  decode(b, B, StateTables{conv_states, rec_states}, stream);
  return b.out_tables != nullptr;
}

bool gdn_decode_from_tables(const GdnDecodeArgs& a, float* const* conv_state, float* const* rec_state,
                            float* const* conv_keep, float* const* rec_keep, const int* keep_token,
                            cudaStream_t stream) {
  TERN_CHECK((a.Ck == 1 || conv_state) && rec_state && conv_keep && rec_keep, "gdn_decode_from_tables: null table");
  TERN_CHECK(!keep_token || (!a.force_portable && gdn_decode_keeps_one(a.tickets != nullptr)),
             "gdn_decode_from_tables: one kept state needs the cluster4_w16 or portable_split shape");
  TERN_CHECK(!a.out_tables || aligned16(a.out_tables), "gdn_decode_from_tables: out_tables not 16-byte aligned");
  GdnDecodeArgs b = a;
  if (b.out_tables && (a.d.T > kDecodeChunk || !writes_tables(launch_kind(a, 1)))) b.out_tables = nullptr;
  decode(b, 1, StateTables{conv_state, rec_state, conv_keep, rec_keep, keep_token}, stream);
  return b.out_tables != nullptr;
}

}  // namespace tern::cuda
