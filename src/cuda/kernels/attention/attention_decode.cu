// attention()'s and attention_batched's decode path: split-KV flash decoding (T <= kDecodeMaxTokens tokens, the query
// heads of a KV head packed on the rows), in two launches: the split kernel writes each split's partial, the merge
// kernel combines them. The batched calls (one token of each of B sequences) are the same kernels with a sequence
// index (Seqs), so that a sequence's arithmetic is the one it gets alone. Here too: the decode variants' one-time
// setup (stages, shared memory, occupancy) and the split count.
//
// The batched split kernel has a second, opt-in schedule pending measurement (TERN_ATTN_BATCH_ITEMS=auto or N;
// attn_batch_set_items): attention_decode_items_kernel, one block running several (sequence, KV head, split) items
// in turn, the next item's first K/V tiles copied while it computes, combines and writes the current one. Today's
// one-item kernel spends 36 µs a launch at 8 streams × 4K (docs/benchmarks.md, real clocks: 1,040 one-tile blocks,
// the stream idle in each block's prologue and epilogue) for 64 MB that the memory reads in ~14 µs. Both run an item
// through the same helpers (decode_item .. decode_combine_write), so the form gives the same bits.
#include "cuda/kernels/attention/attention.cuh"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <type_traits>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/warp_reduce.cuh"
#include "cuda/kernels/attention/attention_i16_tiles.cuh"
#include "cuda/kernels/attention/attention_internal.cuh"
#include "cuda/kernels/attention/attention_tiles.cuh"
#include "cuda/kernels/qmv/dp4a_tables.cuh"
#include "cuda/weights/dmat_device.cuh"

namespace tern::cuda {
using namespace attn;
namespace {

// ---- decode: split-KV flash decoding with the query heads of a KV head packed on the rows ------------------------
//
// Block (KV head, split, sequence b) over keys [tile_begin·64, tile_end·64) ∩ [0, pos0 + T) of sequence b; query
// rows r = t·G + hg (token t, head kvh·G + hg), R = T·G <= 16·RW. Warp w = kw·RW + rw handles rows 16rw..16rw+15 and
// keys 16·(4/RW)… of each tile: KW = 4/RW warps split a tile's 64 keys (T·G <= 16: four warps of 16 keys each). K/V
// tiles stream through a `stages`-deep cp.async ring; the KW key-warps are combined in shared memory at the end and
// the block writes the unnormalised partial o with its max m (log2 units) and sum l. Empty splits write m = −inf,
// l = 0 and no o. The grid has the largest split count's columns; a sequence's columns past its own count do nothing.

// Where a launch's split partials are: sequence b's o at o + b·stride·dh, [T, Hq, splits_b, dh]; its m and l at
// m + b·stride and l + b·stride, [T, Hq, splits_b]. attention (one sequence): stride unused; attention_batched:
// stride = Hq·kAttnMaxSplits, room for any split count.
struct Partials {
  float* o = nullptr;
  float* m = nullptr;
  float* l = nullptr;
  int64_t stride = 0;
};

// i16: the i16 cache's kernel (I16Stage's, and q in two planes unless STACK).
template <int DH, int RW, bool I16 = false, bool STACK = false>
constexpr size_t decode_smem_bytes(int stages) {
  const size_t q = size_t(I16 && !STACK ? 2 : 1) * (16 * RW) * DH * 2, stats = 2 * 4 * 16 * sizeof(float);
  const size_t tiles = size_t(stages) * (I16 ? I16Stage<DH>::kBytes : 2 * kBlockKeys * DH * 2);
  const size_t merge = 4 * 16 * size_t(DH + 8) * sizeof(float);
  return q + stats + (tiles > merge ? tiles : merge);
}

// ---- the decode kernels' per-item body -------------------------------------------------------------------------
//
// A work item is one (KV head, split, sequence b) of a launch: the one-item kernel (attention_decode_split_kernel)
// runs one per block, the items-per-block form (attention_decode_items_kernel, below it) several in turn. Both run an
// item through the helpers below, so that its arithmetic is one copy of the code: the tile range, the Q rows, each
// tile's scores, masks, online softmax and P·V, the key-warp combine and the partial's writes. Only when the tiles'
// copies are issued differs.

// An item's keys [0, L) (L = pos0 + T) in ⌈L/64⌉ tiles, of which it takes [tb, te) (split `split` of `splits`).
struct DecodeItem {
  int64_t pos0, L, tb, te;
};

__device__ __forceinline__ DecodeItem decode_item(int64_t pos0, int64_t T, int split, int splits) {
  const int64_t L = pos0 + T;  // keys [0, L)
  const int64_t n_tiles = (L + kBlockKeys - 1) / kBlockKeys;
  return {pos0, L, split * n_tiles / splits, (split + 1) * n_tiles / splits};
}

// The K and V rows [capacity, DH] of KV head kvh of a sequence's caches (fp8, i16: and the rows' scales).
template <int DH, KvDtype KV>
struct DecodeKv {
  using Elem = CacheElem<KV>;
  const Elem* Kh;
  const Elem* Vh;
  const float* Ks = nullptr;  // fp8, i16: the head's row scales
  const float* Vs = nullptr;
  __device__ __forceinline__ DecodeKv(const void* cache_k, const void* cache_v, int64_t capacity, int Hkv, int kvh)
      : Kh(static_cast<const Elem*>(cache_k) + int64_t(kvh) * capacity * DH),
        Vh(static_cast<const Elem*>(cache_v) + int64_t(kvh) * capacity * DH) {
    if constexpr (kScaled<KV>) {
      Ks = row_scales<KV>(static_cast<const uint8_t*>(cache_k), Hkv, capacity, DH) + int64_t(kvh) * capacity;
      Vs = row_scales<KV>(static_cast<const uint8_t*>(cache_v), Hkv, capacity, DH) + int64_t(kvh) * capacity;
    }
  }
};

// This thread's share of copying tile `tile` (keys tile·64 .. +63; those >= L zero-filled) of K and V into a stage:
// K [64][DH] at `stage` (a generic pointer; smem address sstage), V [64][DH] right after it. 16-bit caches by
// cp.async (the caller commits), fp8 by plain loads and stores (copy_tile_fp8); i16 by cp.async into an I16Stage
// (copy_stage_i16: the values as they are, then the rows' scales).
template <int DH, KvDtype KV>
__device__ __forceinline__ void decode_load_tile(const DecodeKv<DH, KV>& kv, int64_t L, int64_t tile, uint8_t* stage,
                                                 uint32_t sstage, int tid) {
  constexpr int TILE = kBlockKeys * DH * 2;
  const int64_t k0 = tile * kBlockKeys;
  const int valid = int(L - k0 < kBlockKeys ? L - k0 : kBlockKeys);
  if constexpr (kFp8<KV>) {
    copy_tile_fp8<DH>(stage, kv.Kh + k0 * DH, kv.Ks + k0, valid, tid);
    copy_tile_fp8<DH>(stage + TILE, kv.Vh + k0 * DH, kv.Vs + k0, valid, tid);
  } else if constexpr (kI16<KV>) {
    copy_stage_i16<DH>(sstage, kv.Kh + k0 * DH, kv.Vh + k0 * DH, kv.Ks + k0, kv.Vs + k0, valid, tid);
  } else {
    copy_tile_async<DH>(sstage, kv.Kh + k0 * DH, valid, tid);
    copy_tile_async<DH>(sstage + TILE, kv.Vh + k0 * DH, valid, tid);
  }
}

// The item's query rows r = t·G + hg (token t, head kvh·G + hg; q: the sequence's rows [T, Hq, DH]) in chunks of 8
// values: this thread's chunk it is i = tid + it·128, row i / CH, columns 8·(i % CH) (CH = DH / 8). N chunks from it0,
// fp32, in registers.
template <int N>
struct DecodeQChunks {
  float4 v[N][2];
};

// A thread's chunks of the item's 16·RW query rows, all of them (the items kernel's registers).
template <int DH, int RW>
using DecodeQRows = DecodeQChunks<16 * RW * (DH / 8) / 128>;

// This thread's chunks it0 .. it0 + N − 1 of the query rows into f; rows past R are not read (zeros).
template <int DH, int N>
__device__ __forceinline__ void decode_fetch_q(DecodeQChunks<N>& f, const float* q, int Hq, int kvh, int G, int R,
                                               int tid, int it0 = 0) {
  constexpr int CH = DH / 8;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const int i = tid + (it0 + k) * 128, r = i / CH, c = i % CH;
    f.v[k][0] = f.v[k][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < R) {
      const float4* src = reinterpret_cast<const float4*>(q + ((int64_t(r / G) * Hq + kvh * G + r % G) * DH + c * 8));
      f.v[k][0] = src[0];
      f.v[k][1] = src[1];
    }
  }
}

// decode_fetch_q's chunks it0 .. it0 + N − 1 into sQ [16·RW][DH] swizzled, fp32 -> 16 bits; rows past R are zero.
template <int DH, bool F16, int N>
__device__ __forceinline__ void decode_store_q(uint8_t* sQ, const DecodeQChunks<N>& f, int R, int tid, int it0 = 0) {
  constexpr int CH = DH / 8;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const int i = tid + (it0 + k) * 128, r = i / CH, c = i % CH;
    *reinterpret_cast<uint4*>(sQ + swz<DH>(r, c)) =
        r < R ? pack8_as16<F16>(f.v[k][0], f.v[k][1]) : make_uint4(0u, 0u, 0u, 0u);
  }
}

// The item's query rows into sQ: up to eight chunks' loads a thread (all of them at head dim 256, RW 2: the 4-token
// verify) are issued before any is converted (one memory round trip for them, not one each). The items kernel fetches
// and stores apart instead, to fetch an item's rows while it combines the item before.
template <int DH, int RW, bool F16>
__device__ __forceinline__ void decode_load_q(uint8_t* sQ, const float* q, int Hq, int kvh, int G, int R, int tid) {
  constexpr int IT = 16 * RW * (DH / 8) / 128, GRP = IT < 8 ? IT : 8;
#pragma unroll
  for (int it0 = 0; it0 < IT; it0 += GRP) {
    DecodeQChunks<GRP> f;
    decode_fetch_q<DH>(f, q, Hq, kvh, G, R, tid, it0);
    decode_store_q<DH, F16>(sQ, f, R, tid, it0);
  }
}

// The last key each of this thread's rows (row0 + g, +8) may see: pos0 + t; padding rows see all keys.
__device__ __forceinline__ void decode_limits(int64_t (&limit)[2], const DecodeItem& it, int row0, int g, int G,
                                              int R) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int r = row0 + g + 8 * hf;
    limit[hf] = r < R ? it.pos0 + r / G : it.L - 1;
  }
}

// One tile j of the item (K at sk, V at sk + TILE): this warp's rows row0.. against its keys kb..kb+KPW-1 of the tile,
// scores, masks, online softmax and O += P·V. upper: whether rows row0 + 8.. hold a query row (row0 + 8 < R); where
// they do not (the one-token decode's 8 query heads of a KV head), their softmax is skipped: their o, m and l are then
// not the softmax's, and nothing reads them (a row's sums never mix with another row's). Only with SKIP (the 16-bit
// caches' one-row-warp kernels: the second form of the softmax would make the others spill).
template <int DH, int RW, bool F16, bool SKIP>
__device__ __forceinline__ void decode_tile(float (&m)[2], float (&l)[2], float (&o)[DH / 8][4],
                                            const int64_t (&limit)[2], uint32_t sq, uint32_t sk, int64_t j,
                                            int64_t pos0, int row0, int kb, float sl, int lane, int qd, bool upper) {
  constexpr int KW = 4 / RW, KPW = kBlockKeys / KW, SN = KPW / 8, TILE = kBlockKeys * DH * 2;
  float s[SN][4];
  scores_qk<DH, SN, F16>(s, sq, row0, sk, kb, lane);
  const int64_t k0 = j * kBlockKeys + kb;
  if (k0 + KPW - 1 > pos0) {  // keys past pos0 (the new tokens', or past L) are in this slice
    const int rel[2] = {clamp_rel(limit[0] - k0, KPW), clamp_rel(limit[1] - k0, KPW)};
    mask_scores<SN>(s, rel, qd);
  }
  if (!SKIP || upper)
    online_softmax<SN, DH / 8>(s, m, l, o, sl);
  else
    online_softmax<SN, DH / 8, 1>(s, m, l, o, sl);
  accumulate_pv<DH, SN, F16>(o, s, sk + TILE, kb, lane);
}

// decode_tile for the i16 cache (attention_i16_tiles.cuh): Q at sq (STACK: hi on rows 0-7, lo on 8-15; else hi, and
// lo at sq + q_lo); the stage's I16Stage at sk (smem address) and stage (the same, a generic pointer). e_v: the power
// of two the output accumulators count in (i16_rescale_o).
template <int DH, int RW, bool STACK>
__device__ __forceinline__ void decode_tile_i16(float (&m)[2], float (&l)[2], float (&o)[DH / 8][4], int& e_v,
                                                const int64_t (&limit)[2], uint32_t sq, uint32_t q_lo, uint32_t sk,
                                                const uint8_t* stage, int64_t j, int64_t pos0, int row0, int kb,
                                                float sl, int lane, int qd) {
  constexpr int KW = 4 / RW, KPW = kBlockKeys / KW, SN = KPW / 8;
  const float* k_scales = reinterpret_cast<const float*>(stage + I16Stage<DH>::kScales);
  const float* v_scales = k_scales + kBlockKeys;
  float s[SN][4];
  scores_qk_i16<DH, SN, STACK>(s, sq, q_lo, row0, sk, kb, lane);
  i16_scale_scores_half<SN, STACK>(s, k_scales + kb, qd);
  const int64_t k0 = j * kBlockKeys + kb;
  if (k0 + KPW - 1 > pos0) {
    const int rel[2] = {clamp_rel(limit[0] - k0, KPW), clamp_rel(limit[1] - k0, KPW)};
    mask_scores<SN>(s, rel, qd);
  }
  online_softmax<SN, DH / 8, STACK ? 1 : 2>(s, m, l, o, sl);
  const int e = i16_tile_exponent(v_scales, lane);
  i16_rescale_o<DH / 8, STACK ? 1 : 2>(o, e_v, e);
  accumulate_pv_i16<DH, SN, STACK>(o, s, sk + I16Stage<DH>::kTile, v_scales + kb, e, kb, lane);
}

// Where an item's partials go: row r's at index (t·Hq + kvh·G + hg)·splits + split of the sequence's m, l (o: × DH).
struct DecodePartial {
  float* o;
  float* m;
  float* l;
  int64_t Hq;
  int kvh, G, splits, split;
  __device__ __forceinline__ int64_t index(int r) const { return (int64_t(r / G) * Hq + kvh * G + r % G) * splits + split; }
};

__device__ __forceinline__ DecodePartial decode_partial(const Partials& part, int b, int Hq, int kvh, int G, int splits,
                                                        int split, int dh) {
  return {part.o + b * part.stride * dh, part.m + b * part.stride, part.l + b * part.stride, Hq, kvh, G, splits, split};
}

// An empty item (tb >= te): m = −inf, l = 0, no o.
__device__ __forceinline__ void decode_write_empty(const DecodePartial& p, int R, int tid) {
  for (int r = tid; r < R; r += blockDim.x) {
    p.m[p.index(r)] = -INFINITY;
    p.l[p.index(r)] = 0.0f;
  }
}

// The key-warp combine, first half: each warp's m, row sums and o into s_m, s_l [4 warps][16] and sO
// [4 warps][16][DH + 8] fp32. The caller then syncs the block and calls decode_combine_write.
template <int DH>
__device__ __forceinline__ void decode_combine_stage(const float (&m)[2], const float (&l)[2],
                                                     const float (&o)[DH / 8][4], float* s_m, float* s_l, float* sO,
                                                     int warp, int g, int qd) {
  constexpr int OSTRIDE = DH + 8;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float lt = l[hf];
    lt += __shfl_xor_sync(0xffffffffu, lt, 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    if (qd == 0) {
      s_m[warp * 16 + g + 8 * hf] = m[hf];
      s_l[warp * 16 + g + 8 * hf] = lt;
    }
    float* row = sO + (warp * 16 + g + 8 * hf) * OSTRIDE;
#pragma unroll
    for (int n = 0; n < DH / 8; ++n)
      *reinterpret_cast<float2*>(row + 8 * n + 2 * qd) = make_float2(o[n][2 * hf], o[n][2 * hf + 1]);
  }
}

// The key-warp combine, second half: the KW key-warps of each of the R rows weighted by 2^(m_w − M) into the
// item's partial: unnormalised o, m = M·sl (log2 units), l.
template <int DH, int RW>
__device__ __forceinline__ void decode_combine_write(const float* s_m, const float* s_l, const float* sO,
                                                     const DecodePartial& p, int R, float sl, int tid) {
  constexpr int KW = 4 / RW, OSTRIDE = DH + 8, C4 = DH / 4;
  for (int i = tid; i < R * C4; i += 128) {
    const int r = i / C4, c = i % C4, rg = r / 16, rr = r % 16;
    float M = -INFINITY;
#pragma unroll
    for (int k = 0; k < KW; ++k) M = fmaxf(M, s_m[(k * RW + rg) * 16 + rr]);
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float lsum = 0.0f;
    if (M != -INFINITY) {
#pragma unroll
      for (int k = 0; k < KW; ++k) {
        const int w = k * RW + rg;
        const float wt = exp2f((s_m[w * 16 + rr] - M) * sl);  // 0 for a warp that saw no key of this row
        const float4 v = *reinterpret_cast<const float4*>(sO + (w * 16 + rr) * OSTRIDE + 4 * c);
        acc.x += wt * v.x;
        acc.y += wt * v.y;
        acc.z += wt * v.z;
        acc.w += wt * v.w;
        lsum += wt * s_l[w * 16 + rr];
      }
    }
    const int64_t pi = p.index(r);
    reinterpret_cast<float4*>(p.o + pi * DH)[c] = acc;  // columns 4c..4c+3 (one 16-byte store)
    if (c == 0) {
      p.m[pi] = M == -INFINITY ? -INFINITY : M * sl;
      p.l[pi] = lsum;
    }
  }
}

// ---- the one-item kernel: one block per (KV head, split, sequence) ----------------------------------------------

// STACK (i16 only, RW = 1, R <= 8): q's hi and lo on rows r and r + 8 of one tile (attention_i16_tiles.cuh).
template <int DH, int RW, KvDtype KV, bool STACK = false>
__global__ void __launch_bounds__(128, 1)
    attention_decode_split_kernel(const float* q, Seqs<const void> seqs, AttnDims d, int stages,
                                  bool kv_prefetch_enabled, Partials part) {
  static_assert(!STACK || (kI16<KV> && RW == 1), "stacked q rows: the i16 cache's, 16 rows");
  constexpr bool F16 = kF16<KV>;
  constexpr int BN = kBlockKeys, NT = DH / 8;
  constexpr int KW = 4 / RW, KPW = BN / KW;
  constexpr int QROWS = 16 * RW, TILE = BN * DH * 2, PL = kI16<KV> && !STACK ? 2 : 1;
  constexpr uint32_t Q_LO = QROWS * DH * 2;  // i16 (not STACK): sQ's lo plane
  constexpr uint32_t STAGE = kI16<KV> ? I16Stage<DH>::kBytes : 2 * TILE;  // a stage's bytes
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* sQ = smem;                                                 // [PL][QROWS][DH] 16-bit, swizzled
  float* s_m = reinterpret_cast<float*>(smem + PL * QROWS * DH * 2);  // [4 warps][16 rows]
  float* s_l = s_m + 4 * 16;
  uint8_t* ring = reinterpret_cast<uint8_t*>(s_l + 4 * 16);  // stages × {K [64][DH], V [64][DH]} (i16: I16Stage's)
  float* sO = reinterpret_cast<float*>(ring);                     // after the loop: [4 warps][16][OSTRIDE] fp32
  const uint32_t sq = smem_addr(sQ), sring = smem_addr(ring);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, qd = lane & 3;
  const int rw = warp % RW, kw = warp / RW;
  const int kvh = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
  const int G = d.Hq / d.Hkv, R = int(d.T) * G;

  // A column past the sequence's own split count (a batched launch, whose grid has the largest count's columns)
  // exits at once, before any pdl_wait or pdl_trigger: a block that exits counts as triggered, and the merge kernel's
  // pdl_wait still waits for this whole grid, whose other blocks (split 0 of every sequence at least) wait for the
  // kernel before. The tables are launch constants (attention_batched), read before the wait like the position.
  const int splits = splits_at(seqs, b);
  if (splits > int(gridDim.y)) __trap();  // attention_batched's d.capacity below this sequence's: fail, loudly
  if (split >= splits) return;
  const Seq<const void> sb = seq_at(seqs, b);
  q += int64_t(b) * d.T * d.Hq * DH;  // the sequence's rows [T, Hq, DH]
  const DecodePartial pp = decode_partial(part, b, d.Hq, kvh, G, splits, split, DH);

  // The position and the cache rows before it were written by earlier steps, complete before this launch (the
  // kernel before it, attn_prepare, triggers after its pdl_wait): tiles of keys < pos0 may stream in before the
  // wait; the tiles holding the new tokens' rows (written by attn_prepare) only after it.
  const DecodeItem it = decode_item(sb.pos0, d.T, split, splits);
  const int64_t pos0 = it.pos0, tb = it.tb, te = it.te;
  if (tb >= te) {
    pdl_wait();
    pdl_trigger();
    decode_write_empty(pp, R, tid);
    return;
  }
  const DecodeKv<DH, KV> kv(sb.cache_k, sb.cache_v, sb.capacity, d.Hkv, kvh);
  auto load_tile = [&](int64_t tile, int stage) {
    decode_load_tile<DH, KV>(kv, it.L, tile, ring + size_t(stage) * STAGE, sring + uint32_t(stage) * STAGE, tid);
  };
  // Tiles [tb, prologue_end) are copied first: stages - 1 of them, or with one stage (a batched launch whose splits
  // hold one or two tiles, see launch_decode) the first tile, into the one stage the loop then refills.
  const int ahead = stages > 1 ? stages - 1 : 1;
  const int64_t prologue_end = tb + ahead < te ? tb + ahead : te;
  const bool early = prologue_end * BN <= pos0 && kv_prefetch_enabled;  // none holds a new row
  if (!early) {
    pdl_wait();
    pdl_trigger();
  }
  for (int s = 0; s < ahead; ++s) {
    if (tb + s < te) load_tile(tb + s, s);
    cp_async_commit();
  }
  if (early) {
    pdl_wait();
    pdl_trigger();
  }
  if constexpr (kI16<KV>)
    decode_load_q_i16<DH, RW, STACK>(sQ, Q_LO, q, d.Hq, kvh, G, R, tid);
  else
    decode_load_q<DH, RW, F16>(sQ, q, d.Hq, kvh, G, R, tid);

  const float sl = rsqrtf(float(DH)) * kLog2e;
  const int row0 = 16 * rw, kb = kw * KPW;
  int64_t limit[2];
  decode_limits(limit, it, row0, g, G, R);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  int e_v = 0;  // i16: the power of two (2^e_v) the output accumulators count in

  for (int64_t j = tb; j < te; ++j) {
    const int i = int(j - tb);
    if (stages == 1) {
      if (j > tb) load_tile(j, 0);  // the stage read at i - 1, free since the barrier that ended it
    } else if (j + stages - 1 < te) {
      load_tile(j + stages - 1, (i + stages - 1) % stages);  // the stage read at i - 1
    }
    cp_async_commit();
    cp_async_wait_dyn(stages - 1);
    __syncthreads();  // tile j is in for every thread
    if constexpr (kI16<KV>)
      decode_tile_i16<DH, RW, STACK>(m, l, o, e_v, limit, sq, Q_LO, sring + uint32_t(i % stages) * STAGE,
                                     ring + size_t(i % stages) * STAGE, j, pos0, row0, kb, sl, lane, qd);
    else
      decode_tile<DH, RW, F16, RW == 1 && !kFp8<KV>>(m, l, o, limit, sq, sring + uint32_t(i % stages) * STAGE, j,
                                                     pos0, row0, kb, sl, lane, qd, row0 + 8 < R);
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  cp_async_wait<0>();
  if constexpr (kI16<KV>) i16_rescale_o<NT, STACK ? 1 : 2>(o, e_v, 0);  // back to units of 1

  // Combine the KW key-warps of each row group through shared memory (the ring is free now).
  decode_combine_stage<DH>(m, l, o, s_m, s_l, sO, warp, g, qd);
  __syncthreads();
  decode_combine_write<DH, RW>(s_m, s_l, sO, pp, R, sl, tid);
}

// ---- the items-per-block form (TERN_ATTN_BATCH_ITEMS; opt-in pending measurement) ------------------------------
//
// attention_batched's split kernel in another schedule: a block runs several work items in turn, items
// it = blockIdx.x + i·gridDim.x of the B·columns·Hkv items it = (b·columns + split)·Hkv + kvh (an item past its
// sequence's split count is skipped, as the one-item kernel's block for it exits). The K/V tiles of the block's items
// form one stream through a ring of `stages` (2 or 3) stages: tile k of the stream goes to stage k % stages, copied
// stages − 1 tiles before it is computed, so the next item's first tiles stream in while the current item's last
// tile is computed and the item is combined and written (a block of the one-item kernel waits for its one tile with
// nothing behind it, and has no copy in flight while it combines and writes). A stage holds a K/V tile pair or the
// combine's sO [4 warps][16][DH + 8] fp32, whichever is larger: an item combines in the stage of its last tile while
// the other stages fill, and the next item's query rows are fetched into registers meanwhile (decode_fetch_q). Each
// item runs the per-item helpers above in the one-item kernel's order, so every partial gets the same bits; only when
// each copy is issued differs (and the order in which the block's items are written).
//
// Shared memory: sQ [16·RW][DH] 16-bit | s_m, s_l [4][16] | stages × stage | the sequence table [B]. At DH = 256:
// 8.5 KB + 3 × 66 KB + 1.3 KB = 207 KB (Hopper: 1 block per SM) or with 2 stages 141 KB (A100's 163 KB); where two
// stages do not fit, the form is off and attention_batched takes the one-item kernel. Only RW = 1 (T·G <= 16, the
// batched step's one token of up to 16 query heads per KV head) has the form.

// A batched launch's sequence, as the items kernel keeps it in shared memory (launch constants, read once a block).
struct DecodeSeqEntry {
  const void* cache_k;
  const void* cache_v;
  int64_t pos0, capacity;
  int splits, unused;
};

template <int DH>
constexpr size_t decode_items_stage_bytes() {
  const size_t tiles = 2 * size_t(kBlockKeys) * DH * 2, merge = 4 * 16 * size_t(DH + 8) * sizeof(float);
  return tiles > merge ? tiles : merge;
}

template <int DH, int RW>
constexpr size_t decode_items_smem_bytes(int stages) {
  return size_t(16 * RW) * DH * 2 + 2 * 4 * 16 * sizeof(float) + size_t(stages) * decode_items_stage_bytes<DH>() +
         kMaxBatch * sizeof(DecodeSeqEntry);
}

template <int DH, int RW, KvDtype KV>
__global__ void __launch_bounds__(128, 1)
    attention_decode_items_kernel(const float* q, Seqs<const void> seqs, AttnDims d, int columns, int stages,
                                  bool kv_prefetch_enabled, Partials part) {
  constexpr bool F16 = kF16<KV>;
  constexpr int BN = kBlockKeys, NT = DH / 8;
  constexpr int KW = 4 / RW, KPW = BN / KW;
  constexpr int QROWS = 16 * RW;
  constexpr uint32_t STAGE = uint32_t(decode_items_stage_bytes<DH>());
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* sQ = smem;                                            // [QROWS][DH] 16-bit, swizzled
  float* s_m = reinterpret_cast<float*>(smem + QROWS * DH * 2);  // [4 warps][16 rows]
  float* s_l = s_m + 4 * 16;
  uint8_t* ring = reinterpret_cast<uint8_t*>(s_l + 4 * 16);     // stages × {K [64][DH], V [64][DH]} or sO
  DecodeSeqEntry* table = reinterpret_cast<DecodeSeqEntry*>(ring + size_t(stages) * STAGE);  // [B]
  const uint32_t sq = smem_addr(sQ), sring = smem_addr(ring);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, qd = lane & 3;
  const int rw = warp % RW, kw = warp / RW;
  const int G = d.Hq / d.Hkv, R = int(d.T) * G;
  const int n_items = seqs.B * columns * d.Hkv;

  // The tables are launch constants (attention_batched), read before the wait as the one-item kernel reads them.
  if (tid < seqs.B) {
    const Seq<const void> sb = seq_at(seqs, tid);
    const int splits = splits_at(seqs, tid);
    if (splits > columns) __trap();  // attention_batched's d.capacity below this sequence's: fail, loudly
    table[tid] = {sb.cache_k, sb.cache_v, sb.pos0, sb.capacity, splits, 0};
  }
  __syncthreads();

  // Every block waits for the kernel before (and triggers the merge) before it reads q or a tile with a new row, or
  // writes a partial; a block with no item exits without (it counts as triggered, as the one-item kernel's).
  bool waited = false;
  auto wait_once = [&] {
    if (!waited) {
      pdl_wait();
      pdl_trigger();
      waited = true;
    }
  };

  // The producer: tile p_j of item p_it (of tiles up to p_te) is the stream's next copy; p_it >= n_items: none left.
  int p_it = n_items;
  int64_t p_j = 0, p_te = 0;
  auto seek = [&](int it) {  // the block's first item from `it` on that has a tile
    for (; it < n_items; it += gridDim.x) {
      const int split = (it / d.Hkv) % columns;
      const DecodeSeqEntry& e = table[it / (d.Hkv * columns)];
      if (split >= e.splits) continue;
      const DecodeItem x = decode_item(e.pos0, d.T, split, e.splits);
      if (x.tb < x.te) {
        p_j = x.tb;
        p_te = x.te;
        break;
      }
    }
    p_it = it;
  };
  auto produce = [&](int stage) {  // the next tile (if any) into `stage`, which no warp reads; the caller commits
    if (p_it >= n_items) return;
    const DecodeSeqEntry& e = table[p_it / (d.Hkv * columns)];
    // A tile of keys < pos0 only may stream in before the wait (the one-item kernel's `early`); one with a new row
    // (written by attn_prepare) only after it.
    if (!(kv_prefetch_enabled && (p_j + 1) * BN <= e.pos0)) wait_once();
    const DecodeKv<DH, KV> kv(e.cache_k, e.cache_v, e.capacity, d.Hkv, p_it % d.Hkv);
    decode_load_tile<DH, KV>(kv, e.pos0 + d.T, p_j, ring + size_t(stage) * STAGE, sring + uint32_t(stage) * STAGE,
                             tid);
    if (++p_j >= p_te) seek(p_it + int(gridDim.x));
  };
  seek(blockIdx.x);
  for (int s = 0; s + 1 < stages; ++s) {
    produce(s);
    cp_async_commit();
  }
  // Invariant at each tile: produced − consumed = stages − 1 (one commit group per copy, empty ones included).
  int produced = stages - 1, consumed = 0;

  // The block's items in turn: from `it` on, writes the partials of the empty ones (tb >= te, no tile) and returns
  // the first with a tile (n_items: none left). Skips the columns past a sequence's split count.
  auto next_item = [&](int it) {
    for (; it < n_items; it += gridDim.x) {
      const int kvh = it % d.Hkv, split = (it / d.Hkv) % columns, b = it / (d.Hkv * columns);
      const DecodeSeqEntry& e = table[b];
      if (split >= e.splits) continue;
      wait_once();
      const DecodeItem x = decode_item(e.pos0, d.T, split, e.splits);
      if (x.tb < x.te) break;
      decode_write_empty(decode_partial(part, b, d.Hq, kvh, G, e.splits, split, DH), R, tid);
    }
    return it;
  };
  auto fetch_q = [&](DecodeQRows<DH, RW>& f, int it) {  // item it's query rows (after the wait)
    const int b = it / (d.Hkv * columns);
    decode_fetch_q<DH>(f, q + int64_t(b) * d.T * d.Hq * DH, d.Hq, it % d.Hkv, G, R, tid);
  };

  const float sl = rsqrtf(float(DH)) * kLog2e;
  const int row0 = 16 * rw, kb = kw * KPW;
  DecodeQRows<DH, RW> qrows;
  int it = next_item(blockIdx.x);
  if (it < n_items) fetch_q(qrows, it);
  while (it < n_items) {
    const int kvh = it % d.Hkv, split = (it / d.Hkv) % columns, b = it / (d.Hkv * columns);
    const DecodeSeqEntry& e = table[b];
    const int splits = e.splits;
    const DecodeItem x = decode_item(e.pos0, d.T, split, splits);
    // sQ is free: every warp read the last one before the barrier that ended the block's previous item.
    decode_store_q<DH, F16>(sQ, qrows, R, tid);
    int64_t limit[2];
    decode_limits(limit, x, row0, g, G, R);
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    for (int64_t j = x.tb; j < x.te; ++j) {
      produce(produced % stages);  // the stage read at the stream's previous tile (or its item's sO): free
      ++produced;
      cp_async_commit();
      cp_async_wait_dyn(stages - 1);
      __syncthreads();  // tile j is in for every thread (and this item's sQ)
      decode_tile<DH, RW, F16, RW == 1 && !kFp8<KV>>(m, l, o, limit, sq, sring + uint32_t(consumed % stages) * STAGE,
                                                     j, x.pos0, row0, kb, sl, lane, qd, row0 + 8 < R);
      __syncthreads();  // every warp is done with this stage before it is refilled
      ++consumed;
    }

    // Combine the KW key-warps in the stage of the item's last tile (no copy is in flight to it); the next item's
    // query rows are fetched meanwhile.
    float* sO = reinterpret_cast<float*>(ring + size_t((consumed - 1) % stages) * STAGE);
    decode_combine_stage<DH>(m, l, o, s_m, s_l, sO, warp, g, qd);
    __syncthreads();
    const int next = next_item(it + int(gridDim.x));
    if (next < n_items) fetch_q(qrows, next);
    decode_combine_write<DH, RW>(s_m, s_l, sO, decode_partial(part, b, d.Hq, kvh, G, splits, split, DH), R, sl, tid);
    __syncthreads();  // sO, s_m, s_l and sQ are free again
    it = next;
  }
  cp_async_wait<0>();
}

// The merge kernel's partial-o loads a round: kMergeHeld float4 a thread (64 registers in all at DH = 256, 4 blocks of
// 256 threads an SM: 32 sequences' 512 blocks at Qwen3.6's 16 heads are one wave on 132 SMs; 74 and 3 blocks at DH =
// 64 and 128, where a bound of 4 blocks spills).
constexpr int kMergeHeld = 9;
static_assert(kAttnMaxSplits % 32 == 0, "the merge's warp 0 holds whole rounds of 32 splits' m and l");

// out[i, h·dh + j] = (Σ_s 2^{m_s−M} o_s[j]) / (Σ_s 2^{m_s−M} l_s) · sigmoid(gate[i, h, j]) for row i = b·T + t;
// one block per (t, h, sequence b) over the sequence's own split count. Row i of qg at qg + i·ld_qg ([Hq][q | gate]).
// Thread (split group sg, column quad c) sums splits sg, sg + SG, ...; splits of weight 0 are not summed.
// Loads are issued a round at a time before any of the round is used, not one memory round trip each: the first round
// (the thread's o of its first kMergeHeld splits, warp 0's m and l of every split, the gate) before the weights are
// formed; the next kMergeHeld splits' o (more than kMergeHeld·SG splits: long contexts, a server's capacity) a round
// each after. An empty split's o (no tiles) is not read: it writes none.
// With tables (attention_batched's AttnBatch::out_tables; d.T = 1): o_proj's activation tables of row i too, from the
// block's head (DH / 8 whole words of whole groups of 64: warp 0's lane l takes word l), as the pre-quantising kernel
// would make them from out.
template <int DH>
__global__ void __launch_bounds__(256)
    attention_decode_merge_kernel(Partials part, const float* qg, int64_t ld_qg, Seqs<const void> seqs,
                                  AttnDims d, float* out, uint8_t* tables) {
  static_assert(DH % 64 == 0 && DH <= 256, "a head is whole groups of 64, at most a warp's words");
  constexpr int C4 = DH / 4, SG = 256 / C4, ML = kAttnMaxSplits / 32;
  __shared__ float wts[kAttnMaxSplits];
  __shared__ float inv_sum;
  __shared__ float4 red[256];
  const int tid = threadIdx.x;
  const int64_t th = blockIdx.x, t = th / d.Hq;
  const int h = int(th % d.Hq), b = blockIdx.y;
  const int64_t row = b * d.T + t;  // of qg and out
  const int splits = splits_at(seqs, b);
  const float* const part_o = part.o + b * part.stride * DH;
  const float* const part_m = part.m + b * part.stride;
  const float* const part_l = part.l + b * part.stride;
  const int c = tid % C4, sg = tid / C4;
  // The sequence's n key tiles (decode_item's; the position written by earlier steps, read before the wait as the split
  // kernel reads it). Split s has tiles [⌊s·n / splits⌋, ⌊(s + 1)·n / splits⌋): with s·n = q·splits + r, it is empty
  // unless r + n >= splits. r is carried from split to split (+ SG·n mod splits), not divided for each; in 32 bits
  // (s·n < kAttnMaxSplits·n: n under 2^24 tiles, a billion positions).
  const int n_tiles = int((seq_at(seqs, b).pos0 + d.T + kBlockKeys - 1) / kBlockKeys);
  const int r_step = SG * n_tiles % splits;
  pdl_wait();
  pdl_trigger();
  float4 held[kMergeHeld];  // this thread's o of splits base + sg + i·SG, a round
  auto load_round = [&](int base) {
    unsigned has = 0;  // bit i: split base + sg + i·SG has tiles (an empty one writes no o)
    int r = (base + sg) * n_tiles % splits;  // of the round's first split
#pragma unroll
    for (int i = 0; i < kMergeHeld; ++i) {
      has |= unsigned(base + sg + i * SG < splits && r + n_tiles >= splits) << i;
      r += r_step;
      if (r >= splits) r -= splits;
    }
    const float4* src = reinterpret_cast<const float4*>(part_o + (th * splits + base + sg) * DH + 4 * c);
#pragma unroll
    for (int i = 0; i < kMergeHeld; ++i)
      if (has >> i & 1u) held[i] = src[i * SG * DH / 4];
  };
  load_round(0);
  float4 gv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (sg == 0) gv = *reinterpret_cast<const float4*>(qg + row * ld_qg + int64_t(h) * 2 * DH + DH + 4 * c);
  if (tid < 32) {
    float ms[ML], ls[ML];
#pragma unroll
    for (int k = 0; k < ML; ++k) {
      const int s = tid + 32 * k;
      ms[k] = s < splits ? part_m[th * splits + s] : -INFINITY;
      ls[k] = s < splits ? part_l[th * splits + s] : 0.0f;
    }
    float M = -INFINITY;
#pragma unroll
    for (int k = 0; k < ML; ++k) M = fmaxf(M, ms[k]);
    M = warp_max(M);
    float L = 0.0f;
#pragma unroll
    for (int k = 0; k < ML; ++k) {
      const int s = tid + 32 * k;
      if (s >= splits) break;
      const float w = ms[k] == -INFINITY ? 0.0f : exp2f(ms[k] - M);
      wts[s] = w;
      if (w != 0.0f) L += w * ls[k];
    }
    L = warp_sum(L);
    if (tid == 0) inv_sum = 1.0f / L;
  }
  __syncthreads();
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int base = 0; base < splits; base += kMergeHeld * SG) {
    if (base > 0) load_round(base);
#pragma unroll
    for (int i = 0; i < kMergeHeld; ++i) {
      const int s = base + sg + i * SG;
      if (s < splits) {
        const float w = wts[s];
        if (w != 0.0f) {
          acc.x += w * held[i].x;
          acc.y += w * held[i].y;
          acc.z += w * held[i].z;
          acc.w += w * held[i].w;
        }
      }
    }
  }
  red[tid] = acc;
  __syncthreads();
  if (sg == 0) {
#pragma unroll
    for (int k = 1; k < SG; ++k) {
      const float4 v = red[k * C4 + c];
      acc.x += v.x;
      acc.y += v.y;
      acc.z += v.z;
      acc.w += v.w;
    }
    const float inv = inv_sum;
    const float4 y = make_float4(acc.x * inv * sigmoidf(gv.x), acc.y * inv * sigmoidf(gv.y),
                                 acc.z * inv * sigmoidf(gv.z), acc.w * inv * sigmoidf(gv.w));
    *reinterpret_cast<float4*>(out + (row * d.Hq + h) * DH + 4 * c) = y;
    red[c] = y;  // the thread's own slot (the others read only slots k·C4 + c, k ≥ 1)
  }
  if (tables) {  // uniform
    __syncthreads();  // red[0, C4) holds the head's outputs
    if (tid < 32) {
      constexpr int kWords = DH / 8;
      const dp4a::TableOffsets o = dp4a::table_offsets(int(int64_t(d.Hq) * DH / 32));
      uint8_t* const tile = tables + (row / dp4a::kTileTokens) * o.bytes;
      const int slot = int(row % dp4a::kTileTokens);
      const bool has = tid < kWords;
      const float4 a = has ? red[2 * tid] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const float4 b2 = has ? red[2 * tid + 1] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const float v[8] = {a.x, a.y, a.z, a.w, b2.x, b2.y, b2.z, b2.w};
      dp4a::table_word(tile, o, h * kWords + tid, slot, v, has);
      if (h == 0 && tid == 0) reinterpret_cast<float*>(tile + o.rinv)[slot] = 1.0f;
    }
  }
}

// ---- host side --------------------------------------------------------------------------------------------------

template <int DH, int RW>
void setup_decode(AttentionSetup& s, int optin) {
  DecodeVariant& v = s.decode[dh_index(DH)][rw_index(RW)];
  v.stages = 3;
  while (v.stages > 1 && decode_smem_bytes<DH, RW>(v.stages) > size_t(optin)) --v.stages;
  v.smem = decode_smem_bytes<DH, RW>(v.stages);
  if (v.smem > size_t(optin)) return;  // unusable on this device; attention() reports it
  for (auto kernel : {attention_decode_split_kernel<DH, RW, KvDtype::f16>,
                      attention_decode_split_kernel<DH, RW, KvDtype::bf16>,
                      attention_decode_split_kernel<DH, RW, KvDtype::fp8>}) {
    TERN_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(v.smem)));
    TERN_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                   int(cudaSharedmemCarveoutMaxShared)));
  }
  // The split count comes from the fp16 kernel's occupancy for every cache type (the same shared memory; the fp8
  // kernel's registers may differ), so that it depends on the capacity alone, as the batched calls need.
  int n = 0;
  TERN_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attention_decode_split_kernel<DH, RW, KvDtype::f16>, 128,
                                                          v.smem));
  v.blocks_per_sm = std::max(1, n);
  v.smem_one_stage = decode_smem_bytes<DH, RW>(1);
  TERN_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attention_decode_split_kernel<DH, RW, KvDtype::f16>, 128,
                                                          v.smem_one_stage));
  v.blocks_per_sm_one_stage = std::max(1, n);
  // The i16 cache's kernels: the fp16 kernel's stage and 512 bytes of scales, q in two planes (or stacked, RW = 1),
  // as many stages as fit (3 at DH = 256 on Hopper but for RW = 4's 2). Their split count is the fp16 kernel's
  // (above), as for every cache type.
  auto fit_i16 = [&](auto kernel, auto smem_bytes, int& stages_out, size_t& smem_out) {
    for (int stages = 3; stages >= 1 && stages_out == 0; --stages) {
      if (smem_bytes(stages) > size_t(optin)) continue;
      stages_out = stages;
      smem_out = smem_bytes(stages);
      TERN_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_out)));
      TERN_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     int(cudaSharedmemCarveoutMaxShared)));
    }
  };
  fit_i16(attention_decode_split_kernel<DH, RW, KvDtype::i16>,
          [](int st) { return decode_smem_bytes<DH, RW, true>(st); }, v.i16_stages, v.i16_smem);
  if constexpr (RW == 1)
    fit_i16(attention_decode_split_kernel<DH, 1, KvDtype::i16, true>,
            [](int st) { return decode_smem_bytes<DH, 1, true, true>(st); }, v.i16_stack_stages, v.i16_stack_smem);
  if constexpr (RW == 1) {  // the items-per-block form: 3 stages where they fit (Hopper), else 2 (A100), else off
    int stages = 3;
    while (stages >= 2 && decode_items_smem_bytes<DH, RW>(stages) > size_t(optin)) --stages;
    if (stages < 2) return;
    v.items_smem = decode_items_smem_bytes<DH, RW>(stages);
    for (auto kernel : {attention_decode_items_kernel<DH, RW, KvDtype::f16>,
                        attention_decode_items_kernel<DH, RW, KvDtype::bf16>,
                        attention_decode_items_kernel<DH, RW, KvDtype::fp8>}) {
      TERN_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(v.items_smem)));
      TERN_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     int(cudaSharedmemCarveoutMaxShared)));
    }
    TERN_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attention_decode_items_kernel<DH, RW, KvDtype::f16>,
                                                            128, v.items_smem));
    v.items_blocks_per_sm = std::max(1, n);
    v.items_stages = stages;
  }
}

// The decode path's two launches over seqs (B sequences of d.T tokens), `columns` splits in the grid: attention's
// (one sequence, its split count) and attention_batched's (the largest split count of the batch). Row i of qg at
// qg + i·ld_qg. items: 0 for the one-item split kernel; kAttnBatchItemsAuto or N >= 1 for the items-per-block form
// where it exists (RW = 1, fits the device; else the one-item kernel): one wave of blocks, or ⌈items / N⌉ blocks.
template <int DH, KvDtype KV>
void launch_decode(const float* q, const float* qg, int64_t ld_qg, const Seqs<const void>& seqs, int columns,
                   const AttnDims& d, const Partials& part, float* out, cudaStream_t stream, bool kv_before_wait,
                   int items = 0, uint8_t* tables = nullptr) {
  const AttentionSetup& setup = attention_setup();
  const int RW = decode_rows_warps(d.T * (d.Hq / d.Hkv));
  const DecodeVariant& v = decode_variant(setup, d);
  TERN_CHECK(v.smem <= size_t(setup.smem_optin), "attention: the decode kernel needs ", v.smem,
             " bytes of shared memory, the device has ", setup.smem_optin);
  const int64_t n_items = int64_t(seqs.B) * columns * d.Hkv;  // (sequence, split column, KV head)
  auto kernel = RW == 1 ? attention_decode_split_kernel<DH, 1, KV>
                : RW == 2 ? attention_decode_split_kernel<DH, 2, KV>
                          : attention_decode_split_kernel<DH, 4, KV>;
  if constexpr (kI16<KV>) {  // its own ring (I16Stage's); no items-per-block form, no one-stage switch
    TERN_CHECK(v.i16_stages >= 1, "attention: the decode kernel for an i16 cache does not fit the device's ",
               setup.smem_optin, " bytes of shared memory");
    // At most 8 query rows: q's hi and lo stacked on one tile's 16 rows (half the products' instructions).
    const bool stack = RW == 1 && d.T * (d.Hq / d.Hkv) <= 8 && v.i16_stack_stages >= 1;
    launch_pdl("attention_decode_split", stack ? attention_decode_split_kernel<DH, 1, KV, true> : kernel,
               dim3(unsigned(d.Hkv), unsigned(columns), unsigned(seqs.B)), dim3(128),
               stack ? v.i16_stack_smem : v.i16_smem, stream, q, seqs, d, stack ? v.i16_stack_stages : v.i16_stages,
               kv_before_wait, part);
    launch_pdl("attention_decode_merge", attention_decode_merge_kernel<DH>,
               dim3(unsigned(d.T * d.Hq), unsigned(seqs.B)), dim3(256), 0, stream, part, qg, ld_qg, seqs, d, out,
               tables);
    return;
  } else {
    if (items != 0 && RW == 1 && v.items_stages >= 2) {
      // (A test may ask for fewer stages than fit: the same shared memory, the ring using only the first of them.)
      const int stages = items_stages_asked() > 0 ? std::min(items_stages_asked(), v.items_stages) : v.items_stages;
      const int64_t wave = int64_t(setup.sms) * v.items_blocks_per_sm;
      const int64_t blocks = items == kAttnBatchItemsAuto ? std::min(n_items, wave) : (n_items + items - 1) / items;
      items_launches.fetch_add(1, std::memory_order_relaxed);
      launch_pdl("attention_decode_items", attention_decode_items_kernel<DH, 1, KV>, dim3(unsigned(blocks)), dim3(128),
                 v.items_smem, stream, q, seqs, d, columns, stages, kv_before_wait, part);
      launch_pdl("attention_decode_merge", attention_decode_merge_kernel<DH>,
                 dim3(unsigned(d.T * d.Hq), unsigned(seqs.B)), dim3(256), 0, stream, part, qg, ld_qg, seqs, d, out,
                 tables);
      return;
    }
  }
  // A grid of more than one wave whose splits hold one or two 64-key tiles (the batched step at short and middle
  // lengths: 8 sequences at 4K are 8 waves of one-tile splits) gains nothing from a deep ring and loses blocks per
  // SM to it: it takes the one-stage form (at DH = 256: 76 KB of shared memory, 2 blocks per SM instead of 1, the
  // registers allowing no more). The stages change only when the copies are issued, not what is summed, so every
  // sequence's values are the same either way.
  const int64_t tiles_per_split = ((d.capacity + kBlockKeys - 1) / kBlockKeys + columns - 1) / columns;
  const int64_t blocks = n_items;
  const bool one_stage = attn_batch_one_stage() && v.stages > 1 && tiles_per_split <= 2 &&
                         v.blocks_per_sm_one_stage > v.blocks_per_sm &&
                         blocks > int64_t(setup.sms) * v.blocks_per_sm;
  launch_pdl("attention_decode_split", kernel, dim3(unsigned(d.Hkv), unsigned(columns), unsigned(seqs.B)), dim3(128),
             one_stage ? v.smem_one_stage : v.smem, stream, q, seqs, d, one_stage ? 1 : v.stages, kv_before_wait,
             part);
  launch_pdl("attention_decode_merge", attention_decode_merge_kernel<DH>,
             dim3(unsigned(d.T * d.Hq), unsigned(seqs.B)), dim3(256), 0, stream, part, qg, ld_qg, seqs, d, out,
             tables);
}

}  // namespace

namespace attn {

int decode_rows_warps(int64_t rows) { return rows <= 16 ? 1 : rows <= 32 ? 2 : 4; }

// The decode kernels' variant (rows per warp: its stages, shared memory and occupancy) for d.T tokens of d's heads.
const DecodeVariant& decode_variant(const AttentionSetup& setup, const AttnDims& d) {
  return setup.decode[dh_index(d.dh)][rw_index(decode_rows_warps(d.T * (d.Hq / d.Hkv)))];
}

// Splits of the decode grid: enough (KV head, split) blocks to fill every SM once, at most one per
// attn_split_tiles() 64-key tiles of the capacity (two by default). Fixed for a given capacity, so a captured decode
// step stays valid as the length grows.
int decode_splits(const AttnDims& d, const DecodeVariant& v, int sms) {
  const int64_t want = (int64_t(sms) * v.blocks_per_sm + d.Hkv - 1) / d.Hkv;
  const int64_t tiles = (d.capacity + kBlockKeys - 1) / kBlockKeys, per = attn_split_tiles();
  return int(std::clamp<int64_t>(std::min(want, (tiles + per - 1) / per), 1, kAttnMaxSplits));
}

void decode_setup(AttentionSetup& s, int optin) {
  setup_decode<64, 1>(s, optin);
  setup_decode<64, 2>(s, optin);
  setup_decode<64, 4>(s, optin);
  setup_decode<128, 1>(s, optin);
  setup_decode<128, 2>(s, optin);
  setup_decode<128, 4>(s, optin);
  setup_decode<256, 1>(s, optin);
  setup_decode<256, 2>(s, optin);
  setup_decode<256, 4>(s, optin);
}

void attention_decode(const float* q, const float* qg, const void* cache_k, const void* cache_v, const int* pos0,
                      const AttnDims& d, float* partial, float* out, cudaStream_t stream) {
  with_head_dim(d, [&]<int DH, KvDtype KV>() {
    const AttentionSetup& setup = attention_setup();
    TERN_CHECK(partial != nullptr, "attention: decode needs the partial scratch");
    const int splits = decode_splits(d, decode_variant(setup, d), setup.sms);
    Partials part;  // [T, Hq, splits] (o: × DH), one sequence
    part.o = partial;
    part.m = part.o + d.T * d.Hq * splits * DH;
    part.l = part.m + d.T * d.Hq * splits;
    const Seqs<const void> seqs{
        .pos0 = pos0, .cache_k = cache_k, .cache_v = cache_v, .capacity = d.capacity, .splits = splits};
    launch_decode<DH, KV>(q, qg, int64_t(d.Hq) * 2 * DH, seqs, splits, d, part, out, stream, kv_early());
  });
}

void attention_decode_batched(const float* q, const float* qg, const AttnBatch& batch, const AttnDims& d, int columns,
                              float* partial, float* out, cudaStream_t stream) {
  const int64_t room = int64_t(d.Hq) * kAttnMaxSplits;  // partials m, l of one sequence (o: × dh)
  Partials part;  // [B, Hq, kAttnMaxSplits] (o: × dh)
  part.o = partial;
  part.m = part.o + batch.B * room * d.dh;
  part.l = part.m + batch.B * room;
  part.stride = room;
  with_head_dim(d, [&]<int DH, KvDtype KV>() {
    // The items-per-block form (opt-in) from two sequences on; one sequence keeps attention()'s kernel.
    launch_decode<DH, KV>(q, qg, batch.ld_qkv, batch_seqs<const void>(batch), columns, d, part, out, stream,
                           kv_early() && !batch.one_session, batch.B >= 2 ? batch_items() : 0, batch.out_tables);
  });
}

}  // namespace attn
}  // namespace tern::cuda
