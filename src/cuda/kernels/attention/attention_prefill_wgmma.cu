// attention()'s prefill path on Hopper's warpgroup MMA (sm_90a; head dim 256 over an fp16, bf16 or i16 cache): flash
// attention with the same arithmetic as attention_prefill_kernel's (attention_prefill.cu: 16-bit q, K, V and softmax
// weights, or the i16 cache's hi + lo pairs; fp32 scores, sums and output; the same online softmax and masks), its
// products on wgmma instead of mma.sync. (The mma.sync i16 kernel splits each tile's keys between two warps, each with
// its own online softmax, merged at the end; here one softmax runs over every key, so m, l and o round a little
// differently.) That kernel keeps a third of the tensor pipe busy, bound by the latency of each warp's in-order MMA
// chains at 8 warps an SM (docs/benchmarks.md, forty-ninth session); a warpgroup's MMAs run asynchronously from its
// other instructions, so one warpgroup's softmax overlaps the other's MMAs.
//
// A block is one query head's 128 new tokens: two warpgroups, each 64 query rows (warp w of a warpgroup: rows 16w..+15,
// the accumulators' rows, wgmma.cuh). Shared memory (1024-byte aligned), every tile in 64-column panels of the
// 128-byte swizzle (wgmma.cuh): Q [128][256] (64 KB), then two stages of a K tile [64 keys][256] and a V tile (32 KB
// each): 192 KB, one block an SM. cp.async fills tile j + 1 while tile j is computed; one barrier a tile.
// Per tile and warpgroup: S = Q·Kᵀ (16 m64n64k16, Q and K K-major from shared memory), the masks and online softmax on
// the 32 scores a thread holds, then O += P·V (P from registers, packed from the scores; V MN-major, 4 × m64n64 over
// the head dim for each 16 keys). A warpgroup skips the tiles past its last row's last key.
#include <cuda_fp16.h>

#include <cmath>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/kernels/attention/attention.cuh"
#include "cuda/kernels/attention/attention_i16_tiles.cuh"
#include "cuda/kernels/attention/attention_internal.cuh"
#include "cuda/kernels/attention/attention_tiles.cuh"

namespace tern::cuda {
using namespace attn;
namespace {

constexpr int kWgDh = 256;        // the head dim this kernel takes
constexpr int kWgRows = 128;      // new tokens per block: two warpgroups of 64
constexpr int kWgKeys = kBlockKeys;  // keys per tile
constexpr int kWgThreads = 256;
constexpr uint32_t kWgQBytes = kWgRows * kWgDh * 2;     // 64 KB
constexpr uint32_t kWgTileBytes = kWgKeys * kWgDh * 2;  // 32 KB: one K or V tile
constexpr size_t kWgSmem = 1024 + kWgQBytes + 2 * 2 * size_t(kWgTileBytes);  // + 1024: the 1024-byte alignment

// Byte offset of 16-byte chunk c (0..31) of row r in a [ROWS][256] 16-bit tile stored as 4 panels of 64 columns
// (ROWS × 128 bytes each), each in the 128-byte swizzle.
template <int ROWS>
__device__ __forceinline__ uint32_t panel_off(int r, int c) {
  return uint32_t((c >> 3) * (ROWS * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// A block's new tokens t0 .. t0 + rows - 1 (the longest rows, the latest tokens, start first) and the keys they read,
// [0, kv_end): n_tiles tiles of `keys`. After pdl_wait (pos0 is an earlier kernel's).
struct BlockSpan {
  int64_t t0, pos0, kv_end;
  int rows, n_tiles;
  __device__ __forceinline__ BlockSpan(const AttnDims& d, const int* pos0_ptr, int keys) {
    t0 = int64_t(gridDim.y - 1 - blockIdx.y) * kWgRows;
    pos0 = *pos0_ptr;
    rows = int(d.T - t0 < kWgRows ? d.T - t0 : kWgRows);
    kv_end = pos0 + t0 + rows;
    n_tiles = int((kv_end + keys - 1) / keys);
  }
};

// This thread's cp.async share of keys k0 .. k0 + KEYS - 1 of K and V (a head's rows, DH values each) into two
// [KEYS][256] panel tiles at dk and dv: 16-byte chunk x = tid + i·256 is row x / 32, chunk x % 32. Rows past kv_end
// are zero-filled, not read. The caller commits.
template <int KEYS>
__device__ __forceinline__ void copy_key_rows(uint32_t dk, uint32_t dv, const uint16_t* K, const uint16_t* V,
                                              int64_t k0, int64_t kv_end, int tid) {
  constexpr int CH = kWgDh / 8;
  const int valid = int(kv_end - k0 < KEYS ? kv_end - k0 : KEYS);
#pragma unroll
  for (int i = 0; i < KEYS * CH / kWgThreads; ++i) {
    const int x = tid + i * kWgThreads, r = x / CH, c = x % CH;
    const bool ok = r < valid;
    const int64_t at = (k0 + (ok ? r : 0)) * kWgDh + c * 8;
    cp_async_16(dk + panel_off<KEYS>(r, c), K + at, ok ? 16u : 0u);
    cp_async_16(dv + panel_off<KEYS>(r, c), V + at, ok ? 16u : 0u);
  }
}

// The last key each of this thread's rows (g, g + 8) may see, the first of its warp's rows and the last of its
// warpgroup's (p0 = pos0 + t0: the block's first row's position; keys [0, kv_end) are loaded). Rows past T see every
// loaded key (their output is dropped).
struct KeyLimits {
  int64_t row[2], warp_first, wg_last;
  __device__ __forceinline__ KeyLimits(int64_t p0, int64_t kv_end, int wrow0, int row0, int g) {
    const auto at_most = [&](int64_t key) { return key < kv_end - 1 ? key : kv_end - 1; };
    row[0] = at_most(p0 + row0 + g);
    row[1] = at_most(p0 + row0 + g + 8);
    warp_first = at_most(p0 + row0);
    wg_last = at_most(p0 + wrow0 + 63);
  }
};

// wgmma::fence_regs over the output accumulators (4 panels of 32): before the MMAs that read them (what wrote them
// stays above the wgmma fence) and after the wait (what reads them stays below).
__device__ __forceinline__ void fence_operands(float (&o)[kWgDh / 8][4]) {
#pragma unroll
  for (int p = 0; p < kWgDh / 64; ++p) wgmma::fence_regs(reinterpret_cast<float(&)[32]>(o[8 * p]));
}

template <KvDtype KV>
__global__ void __launch_bounds__(kWgThreads, 1)
    attention_prefill_wgmma_kernel(const float* q, const float* qg, const void* cache_k, const void* cache_v,
                                   const int* pos0_ptr, AttnDims d, float* out) {
  constexpr bool F16 = kF16<KV>;
  constexpr int DH = kWgDh, BM = kWgRows, BN = kWgKeys, CH = DH / 8, NT = DH / 8, SN = BN / 8;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* const smem = smem_raw + ((1024 - smem_addr(smem_raw) % 1024) % 1024);
  const uint32_t sq = smem_addr(smem), skv = sq + kWgQBytes;  // stage s: K at skv + 2s·tile, V one tile after
  const int tid = threadIdx.x, wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, qd = lane % 4;
  const int h = blockIdx.x, kvh = h / (d.Hq / d.Hkv);

  pdl_wait();
  pdl_trigger();
  const BlockSpan span(d, pos0_ptr, BN);
  const int64_t t0 = span.t0, kv_end = span.kv_end;
  const int rows = span.rows;
  const uint16_t* Kh = static_cast<const uint16_t*>(cache_k) + int64_t(kvh) * d.capacity * DH;
  const uint16_t* Vh = static_cast<const uint16_t*>(cache_v) + int64_t(kvh) * d.capacity * DH;

  // K_j and V_j into stage j % 2.
  auto load_tiles = [&](int j) {
    const uint32_t st = skv + uint32_t(j % 2) * 2 * kWgTileBytes;
    copy_key_rows<BN>(st, st + kWgTileBytes, Kh, Vh, int64_t(j) * BN, kv_end, tid);
  };
  load_tiles(0);
  cp_async_commit();
  // Q tile, fp32 -> 16 bits; rows past T are zero.
#pragma unroll 4
  for (int i = 0; i < BM * CH / kWgThreads; ++i) {
    const int x = tid + i * kWgThreads, r = x / CH, c = x % CH;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (r < rows) val = load8_as16<F16>(q + ((t0 + r) * d.Hq + h) * DH + c * 8);
    *reinterpret_cast<uint4*>(smem + panel_off<BM>(r, c)) = val;
  }

  const float sl = rsqrtf(float(DH)) * kLog2e;
  const int wrow0 = 64 * wg, row0 = wrow0 + 16 * warp;  // this warpgroup's and this warp's first rows
  const KeyLimits lim(span.pos0 + t0, kv_end, wrow0, row0, g);
  const bool wg_rows = wrow0 < rows;  // a warpgroup of rows all past T computes nothing
  const uint32_t qa = sq + uint32_t(wrow0) * 128;  // this warpgroup's Q rows in each panel

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  for (int j = 0; j < span.n_tiles; ++j) {
    cp_async_wait<0>();
    wgmma::fence_proxy_async();  // this thread's copies (and Q's stores) visible to the tensor cores
    __syncthreads();             // everyone's; every warpgroup is done with tile j - 1's stage
    if (j + 1 < span.n_tiles) load_tiles(j + 1);
    cp_async_commit();

    const int64_t k0 = int64_t(j) * BN;
    if (!wg_rows || k0 > lim.wg_last) continue;  // the same for the whole warpgroup
    const uint32_t sk = skv + uint32_t(j % 2) * 2 * kWgTileBytes, sv = sk + kWgTileBytes;

    // S = Q·K_jᵀ: 16 k-steps of 16 over the head dim (panel ks / 4, 32 bytes a step inside it).
    float s[SN][4];
    float(&sf)[4 * SN] = reinterpret_cast<float(&)[4 * SN]>(s);
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < DH / 16; ++ks) {
      const uint32_t at = uint32_t(ks % 4) * 32;
      wgmma::mma_ss<F16>(sf, wgmma::sw128_desc(qa + uint32_t(ks / 4) * (BM * 128) + at, 16, 1024),
                         wgmma::sw128_desc(sk + uint32_t(ks / 4) * (BN * 128) + at, 16, 1024), ks > 0 ? 1 : 0);
    }
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_regs(sf);

    if (k0 + BN - 1 > lim.warp_first) {  // the diagonal (or the end of the written keys) crosses this tile
      const int rel[2] = {clamp_rel(lim.row[0] - k0, BN), clamp_rel(lim.row[1] - k0, BN)};
      mask_scores<SN>(s, rel, qd);
    }
    online_softmax<SN, NT>(s, m, l, o, sl);

    // O += P·V_j: P's 16-key steps as A fragments (k16 step kc: score tiles 2kc, 2kc + 1), V MN-major (16 key rows,
    // 2048 bytes a step; panel p: head dims 64p..+63).
    uint32_t pa[SN / 2][4];
#pragma unroll
    for (int kc = 0; kc < SN / 2; ++kc) {
      pa[kc][0] = pack16<F16>(s[2 * kc][0], s[2 * kc][1]);
      pa[kc][1] = pack16<F16>(s[2 * kc][2], s[2 * kc][3]);
      pa[kc][2] = pack16<F16>(s[2 * kc + 1][0], s[2 * kc + 1][1]);
      pa[kc][3] = pack16<F16>(s[2 * kc + 1][2], s[2 * kc + 1][3]);
    }
    fence_operands(o);
#pragma unroll
    for (int kc = 0; kc < SN / 2; ++kc) wgmma::fence_regs(pa[kc]);
    wgmma::fence();
#pragma unroll
    for (int kc = 0; kc < SN / 2; ++kc)
#pragma unroll
      for (int p = 0; p < DH / 64; ++p)
        wgmma::mma_rs<F16, 32, 1>(reinterpret_cast<float(&)[32]>(o[8 * p]), pa[kc],
                                  wgmma::sw128_desc(sv + uint32_t(p) * (BN * 128) + uint32_t(kc) * 2048, BN * 128,
                                                    1024),
                                  1);
    wgmma::commit();
    wgmma::wait<0>();
    fence_operands(o);
#pragma unroll
    for (int kc = 0; kc < SN / 2; ++kc) wgmma::fence_regs(pa[kc]);
  }
  cp_async_wait<0>();

  store_output<DH>(o, l, qg, out, d, h, t0 + row0 + g, qd);
}


// ---- the i16 cache ------------------------------------------------------------------------------------------------
//
// The same block of 128 new tokens with attention_prefill_kernel's i16 arithmetic (attention_i16_tiles.cuh): q and the
// softmax weights as fp16 hi + lo, the rows' integers as exact pairs holding v / 2 (split_i16x2_near), S = Qhi·Khi +
// Qhi·Klo + Qlo·Khi and O += Phi·Vhi + Phi·Vlo + Plo·Vhi for every 16 dims or keys, each score times twice its key's
// K scale, each weight times twice its key's V scale over the tile's power of two (o counts in units of it). Tiles of
// 32 keys (I16 below), so that Q's two planes fit: Q hi and lo (128 KB), the tile's K and V as hi and lo planes
// (64 KB), a staging area that cp.async fills with the next tile's int16 rows and scales (32 KB), split into the
// planes once a tile by the whole block: 224.5 KB, one block an SM.
//
// Stacked K (kStackK, the default; TERN_ATTN_PREFILL_I16_STACK=0 reads three m64n32k16 a k-step): the tile's K hi
// and lo planes one [64][256] panel tile (hi on rows 0-31, lo on 32-63), so that Qhi·Khi and Qhi·Klo are one
// m64n64k16 (columns j and j + 32 of its accumulators) and Qlo·Khi an m64n32k16 with its own accumulators (each chain
// one shape, as the PTX ISA asks of accumulators shared without a wgmma.fence): 7 KB of shared-memory operands a
// k-step where three m64n32k16 read 9 KB. The kernel keeps shared memory about half busy and the tensor pipe 38-40%;
// stacked, it took 1,064 µs at T = 4096 against the three products' 1,129-1,138 (−6%; H100, docs/benchmarks.md,
// fifty-fourth session). A score is (Qhi·Khi + Qlo·Khi) + Qhi·Klo: not the three products' bits.
struct I16 {
  static constexpr int kKeys = 32;
  static constexpr uint32_t kTile = kKeys * kWgDh * 2;           // 16 KB: one K or V tile, one plane
  static constexpr uint32_t kQ = 0;                              // Q hi, then Q lo (kWgQBytes each)
  static constexpr uint32_t kHi = 2 * kWgQBytes;                 // K hi, V hi (kStackK: K hi and lo stacked)
  static constexpr uint32_t kLo = kHi + 2 * kTile;               // K lo, V lo (kStackK: V hi, V lo)
  static constexpr uint32_t kStage = kLo + 2 * kTile;            // int16 K, V rows
  static constexpr uint32_t kScales = kStage + 2 * kTile;        // twice the rows' scales: K's 32, V's 32
  static constexpr uint32_t kStageScales = kScales + 2 * kKeys * 4;  // the staged rows' scales
  static constexpr size_t kSmem = 1024 + kStageScales + 2 * kKeys * 4;
};

template <bool kStackK>
__global__ void __launch_bounds__(kWgThreads, 1)
    attention_prefill_wgmma_i16_kernel(const float* q, const float* qg, const void* cache_k, const void* cache_v,
                                       const int* pos0_ptr, AttnDims d, float* out) {
  constexpr int DH = kWgDh, BM = kWgRows, BN = I16::kKeys, CH = DH / 8, NT = DH / 8, SN = BN / 8;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* const smem = smem_raw + ((1024 - smem_addr(smem_raw) % 1024) % 1024);
  const uint32_t s0 = smem_addr(smem);
  const int tid = threadIdx.x, wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, qd = lane % 4;
  const int h = blockIdx.x, kvh = h / (d.Hq / d.Hkv);

  pdl_wait();
  pdl_trigger();
  const BlockSpan span(d, pos0_ptr, BN);
  const int64_t t0 = span.t0, kv_end = span.kv_end;
  const int rows = span.rows;
  const uint16_t* Kh = static_cast<const uint16_t*>(cache_k) + int64_t(kvh) * d.capacity * DH;
  const uint16_t* Vh = static_cast<const uint16_t*>(cache_v) + int64_t(kvh) * d.capacity * DH;
  const float* Ks =
      row_scales<KvDtype::i16>(static_cast<const uint8_t*>(cache_k), d.Hkv, d.capacity, DH) + int64_t(kvh) * d.capacity;
  const float* Vs =
      row_scales<KvDtype::i16>(static_cast<const uint8_t*>(cache_v), d.Hkv, d.capacity, DH) + int64_t(kvh) * d.capacity;

  // Tile j's int16 K and V rows into the staging (panel layout), and their scales (threads 0..63); rows past kv_end
  // zero-filled, not read. The caller commits.
  auto stage_tile = [&](int j) {
    const int64_t k0 = int64_t(j) * BN;
    const int valid = int(kv_end - k0 < BN ? kv_end - k0 : BN);
    copy_key_rows<BN>(s0 + I16::kStage, s0 + I16::kStage + I16::kTile, Kh, Vh, k0, kv_end, tid);
    if (tid < 2 * BN) {
      const int r = tid % BN;
      const float* src = (tid < BN ? Ks : Vs) + k0;
      cp_async_4(s0 + I16::kStageScales + 4 * tid, r < valid ? src + r : src, r < valid ? 4u : 0u);
    }
  };
  // The staged tile into the planes (every thread its 16-byte chunks: the same offsets in the staging and the planes,
  // or with kStackK the stacked K tile at kHi and V's planes at kLo) and the scales, doubled.
  auto unstage = [&]() {
#pragma unroll
    for (int i = 0; i < 2 * BN * CH / kWgThreads; ++i) {
      const uint32_t at = uint32_t(tid + i * kWgThreads) * 16;
      const uint4 raw = *reinterpret_cast<const uint4*>(smem + I16::kStage + at);
      uint4 hi, lo;
      split_i16x2_near(raw.x, hi.x, lo.x);
      split_i16x2_near(raw.y, hi.y, lo.y);
      split_i16x2_near(raw.z, hi.z, lo.z);
      split_i16x2_near(raw.w, hi.w, lo.w);
      if constexpr (kStackK) {
        // K: panel at / 4 KB of the stacked tile (8 KB a panel), lo 32 rows below hi; V: its planes at kLo.
        const uint32_t k_hi = I16::kHi + at + (at & ~4095u);
        const uint32_t dh = i < BN * CH / kWgThreads ? k_hi : I16::kLo + at - I16::kTile;
        const uint32_t dl = i < BN * CH / kWgThreads ? k_hi + 4096 : I16::kLo + at;
        *reinterpret_cast<uint4*>(smem + dh) = hi;
        *reinterpret_cast<uint4*>(smem + dl) = lo;
      } else {
        *reinterpret_cast<uint4*>(smem + I16::kHi + at) = hi;
        *reinterpret_cast<uint4*>(smem + I16::kLo + at) = lo;
      }
    }
    if (tid < 2 * BN)
      reinterpret_cast<float*>(smem + I16::kScales)[tid] =
          2.0f * reinterpret_cast<const float*>(smem + I16::kStageScales)[tid];
  };

  stage_tile(0);
  cp_async_commit();
  // Q tile, fp32 -> fp16 hi and lo planes; rows past T are zero.
#pragma unroll 4
  for (int i = 0; i < BM * CH / kWgThreads; ++i) {
    const int x = tid + i * kWgThreads, r = x / CH, c = x % CH;
    uint4 hi = make_uint4(0u, 0u, 0u, 0u), lo = hi;
    if (r < rows) load8_split(q + ((t0 + r) * d.Hq + h) * DH + c * 8, hi, lo);
    *reinterpret_cast<uint4*>(smem + I16::kQ + panel_off<BM>(r, c)) = hi;
    *reinterpret_cast<uint4*>(smem + I16::kQ + kWgQBytes + panel_off<BM>(r, c)) = lo;
  }

  const float sl = rsqrtf(float(DH)) * kLog2e;
  const int wrow0 = 64 * wg, row0 = wrow0 + 16 * warp;  // this warpgroup's and this warp's first rows
  const KeyLimits lim(span.pos0 + t0, kv_end, wrow0, row0, g);
  const bool wg_rows = wrow0 < rows;  // a warpgroup of rows all past T computes nothing
  const uint32_t qh = s0 + I16::kQ + uint32_t(wrow0) * 128, ql = qh + kWgQBytes;
  // kStackK: the stacked K tile at kHi (32 KB), V hi and lo at kLo.
  const uint32_t kh = s0 + I16::kHi, kl = s0 + I16::kLo;
  const uint32_t vh = kStackK ? kl : kh + I16::kTile, vl = kl + I16::kTile;
  const float* k_scales = reinterpret_cast<const float*>(smem + I16::kScales);
  const float* v_scales = k_scales + BN;

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  int e_v = 0;  // the power of two (2^e_v) the output accumulators count in

  for (int j = 0; j < span.n_tiles; ++j) {
    cp_async_wait<0>();
    __syncthreads();  // tile j staged (everyone's copies); every warpgroup is done with tile j - 1's planes
    unstage();
    wgmma::fence_proxy_async();  // the planes (and Q) visible to the tensor cores
    __syncthreads();             // every thread's share of the planes written; the staging is free
    if (j + 1 < span.n_tiles) stage_tile(j + 1);
    cp_async_commit();

    const int64_t k0 = int64_t(j) * BN;
    if (!wg_rows || k0 > lim.wg_last) continue;

    // S = Qhi·Khi + Qhi·Klo + Qlo·Khi over 16 k-steps of 16 head dims.
    float s[SN][4];
    float(&sf)[4 * SN] = reinterpret_cast<float(&)[4 * SN]>(s);
    if constexpr (kStackK) {
      float st[2 * 4 * SN];  // columns 0-31: Qhi·Khi; 32-63: Qhi·Klo
      wgmma::fence();
#pragma unroll
      for (int ks = 0; ks < DH / 16; ++ks) {
        const uint32_t qa = uint32_t(ks / 4) * (BM * 128) + uint32_t(ks % 4) * 32;
        const uint64_t dk = wgmma::sw128_desc(kh + uint32_t(ks / 4) * (2 * BN * 128) + uint32_t(ks % 4) * 32, 16, 1024);
        wgmma::mma_ss<true>(st, wgmma::sw128_desc(qh + qa, 16, 1024), dk, ks > 0 ? 1 : 0);
        wgmma::mma_ss<true>(sf, wgmma::sw128_desc(ql + qa, 16, 1024), dk, ks > 0 ? 1 : 0);  // Qlo·Khi
      }
      wgmma::commit();
      wgmma::wait<0>();
      wgmma::fence_regs(st);
      wgmma::fence_regs(sf);
#pragma unroll
      for (int i = 0; i < 4 * SN; ++i) sf[i] = (st[i] + sf[i]) + st[i + 4 * SN];
    } else {
      wgmma::fence();
#pragma unroll
      for (int ks = 0; ks < DH / 16; ++ks) {
        const uint32_t qa = uint32_t(ks / 4) * (BM * 128) + uint32_t(ks % 4) * 32;
        const uint32_t ka = uint32_t(ks / 4) * (BN * 128) + uint32_t(ks % 4) * 32;
        const uint64_t dqh = wgmma::sw128_desc(qh + qa, 16, 1024), dkh = wgmma::sw128_desc(kh + ka, 16, 1024);
        wgmma::mma_ss<true>(sf, dqh, dkh, ks > 0 ? 1 : 0);
        wgmma::mma_ss<true>(sf, dqh, wgmma::sw128_desc(kl + ka, 16, 1024), 1);
        wgmma::mma_ss<true>(sf, wgmma::sw128_desc(ql + qa, 16, 1024), dkh, 1);
      }
      wgmma::commit();
      wgmma::wait<0>();
      wgmma::fence_regs(sf);
    }

    i16_scale_scores<SN>(s, k_scales, qd);
    if (k0 + BN - 1 > lim.warp_first) {
      const int rel[2] = {clamp_rel(lim.row[0] - k0, BN), clamp_rel(lim.row[1] - k0, BN)};
      mask_scores<SN>(s, rel, qd);
    }
    online_softmax<SN, NT>(s, m, l, o, sl);

    // O += Phi·Vhi + Phi·Vlo + Plo·Vhi: each weight times its key's doubled V scale over 2^e, as fp16 hi + lo.
    const int e = i16_tile_exponent<BN>(v_scales, lane);
    i16_rescale_o<NT>(o, e_v, e);
    uint32_t ph[SN / 2][4], pl[SN / 2][4];
#pragma unroll
    for (int kc = 0; kc < SN / 2; ++kc) split_scaled_weights<SN>(s, v_scales, e, kc, qd, ph[kc], pl[kc]);
    fence_operands(o);
#pragma unroll
    for (int kc = 0; kc < SN / 2; ++kc) {
      wgmma::fence_regs(ph[kc]);
      wgmma::fence_regs(pl[kc]);
    }
    wgmma::fence();
#pragma unroll
    for (int kc = 0; kc < SN / 2; ++kc)
#pragma unroll
      for (int p = 0; p < DH / 64; ++p) {
        const uint32_t va = uint32_t(p) * (BN * 128) + uint32_t(kc) * 2048;
        float(&op)[32] = reinterpret_cast<float(&)[32]>(o[8 * p]);
        const uint64_t dvh = wgmma::sw128_desc(vh + va, BN * 128, 1024);
        wgmma::mma_rs<true, 32, 1>(op, ph[kc], dvh, 1);
        wgmma::mma_rs<true, 32, 1>(op, ph[kc], wgmma::sw128_desc(vl + va, BN * 128, 1024), 1);
        wgmma::mma_rs<true, 32, 1>(op, pl[kc], dvh, 1);
      }
    wgmma::commit();
    wgmma::wait<0>();
    fence_operands(o);
#pragma unroll
    for (int kc = 0; kc < SN / 2; ++kc) {
      wgmma::fence_regs(ph[kc]);
      wgmma::fence_regs(pl[kc]);
    }
  }
  cp_async_wait<0>();
  i16_rescale_o<NT>(o, e_v, 0);  // back to units of 1
  store_output<DH>(o, l, qg, out, d, h, t0 + row0 + g, qd);
}

// TERN_ATTN_PREFILL_WGMMA=0: the mma.sync kernel for every prefill (for comparison); read once, then
// attn_prefill_set_wgmma's.
bool& prefill_wgmma_on() {
  static bool on = !env_is("TERN_ATTN_PREFILL_WGMMA", "0");
  return on;
}

// The i16 kernel's scores over the stacked K tile (kStackK) unless TERN_ATTN_PREFILL_I16_STACK=0; read once, then
// attn_prefill_set_i16_stack's.
bool& i16_stack_k() {
  static bool on = !env_is("TERN_ATTN_PREFILL_I16_STACK", "0");
  return on;
}

// Whether this binary holds the sm_90a kernels and the GPU is a Hopper with the shared memory they need: the 16-bit
// caches' kernels, the i16 cache's (set once).
bool wgmma_16bit_usable = false, wgmma_i16_usable = false;

bool setup_kernel(const void* k, size_t smem, int optin) {
  cudaFuncAttributes fa{};
  if (cudaFuncGetAttributes(&fa, k) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (fa.binaryVersion != 90 || fa.ptxVersion != 90 || smem > size_t(optin)) return false;
  TERN_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  TERN_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 int(cudaSharedmemCarveoutMaxShared)));
  return true;
}

}  // namespace

namespace attn {

void prefill_wgmma_setup(int optin) {
  if (gpu_path_portable()) return;
  int dev = 0, major = 0, minor = 0;
  TERN_CUDA(cudaGetDevice(&dev));
  TERN_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  TERN_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (major != 9 || minor != 0) return;
  const auto kernel = [](auto k) { return reinterpret_cast<const void*>(k); };
  wgmma_16bit_usable = setup_kernel(kernel(attention_prefill_wgmma_kernel<KvDtype::f16>), kWgSmem, optin) &&
                       setup_kernel(kernel(attention_prefill_wgmma_kernel<KvDtype::bf16>), kWgSmem, optin);
  wgmma_i16_usable = setup_kernel(kernel(attention_prefill_wgmma_i16_kernel<false>), I16::kSmem, optin) &&
                     setup_kernel(kernel(attention_prefill_wgmma_i16_kernel<true>), I16::kSmem, optin);
}

bool prefill_wgmma_takes(const AttnDims& d) {
  attention_setup();
  if (!prefill_wgmma_on() || d.dh != kWgDh) return false;
  if (d.kv == KvDtype::i16) return wgmma_i16_usable;
  return (d.kv == KvDtype::f16 || d.kv == KvDtype::bf16) && wgmma_16bit_usable;
}

void attention_prefill_wgmma(const float* q, const float* qg, const void* cache_k, const void* cache_v,
                             const int* pos0, const AttnDims& d, float* out, cudaStream_t stream) {
  TERN_CHECK(prefill_wgmma_takes(d), "attention_prefill_wgmma: needs a Hopper GPU, head dim ", kWgDh,
             " and an fp16, bf16 or i16 cache; got head dim ", d.dh, ", ", kv_dtype_name(d.kv));
  const int64_t tiles = (d.T + kWgRows - 1) / kWgRows;
  TERN_CHECK(tiles <= 65535, "attention: ", d.T, " tokens in one call exceed the grid limit");
  const dim3 grid(unsigned(d.Hq), unsigned(tiles));
  if (d.kv == KvDtype::i16)
    launch_pdl("attention_prefill (wgmma, i16)",
               i16_stack_k() ? attention_prefill_wgmma_i16_kernel<true> : attention_prefill_wgmma_i16_kernel<false>,
               grid, dim3(kWgThreads), I16::kSmem, stream, q, qg, cache_k, cache_v, pos0, d, out);
  else if (d.kv == KvDtype::f16)
    launch_pdl("attention_prefill (wgmma)", attention_prefill_wgmma_kernel<KvDtype::f16>, grid, dim3(kWgThreads),
               kWgSmem, stream, q, qg, cache_k, cache_v, pos0, d, out);
  else
    launch_pdl("attention_prefill (wgmma)", attention_prefill_wgmma_kernel<KvDtype::bf16>, grid, dim3(kWgThreads),
               kWgSmem, stream, q, qg, cache_k, cache_v, pos0, d, out);
}

}  // namespace attn

void attn_prefill_set_wgmma(bool on) { prefill_wgmma_on() = on; }
void attn_prefill_set_i16_stack(bool on) { i16_stack_k() = on; }
bool attn_prefill_i16_stack() { return i16_stack_k(); }
bool attn_prefill_wgmma() { return prefill_wgmma_on(); }

bool attn_prefill_wgmma_available(KvDtype kv) {
  attn::attention_setup();
  return kv == KvDtype::i16 ? wgmma_i16_usable : (kv == KvDtype::f16 || kv == KvDtype::bf16) && wgmma_16bit_usable;
}

}  // namespace tern::cuda
