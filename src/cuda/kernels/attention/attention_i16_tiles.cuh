// The i16 cache's tiles (included by attention_decode.cu and attention_prefill.cu): a decode stage holds the K and
// V rows' int16 values as the cache holds them, copied by cp.async into the fp16 cache's swizzled [64][DH] layout (the
// same bytes, so the fp16 kernel's stages where q's planes leave room), and the rows' 64 + 64 scales. Each K or V fragment is split as
// it leaves shared memory (split_i16x2) into fp16 hi + lo with hi + lo = v / 2 exactly; q and the softmax weights are
// fp16 hi + lo pairs (split2_f16, ~22 significant bits). All four products are kept (hi·hi, hi·lo, lo·hi, lo·lo), so a
// score is q's pair against the cache's exact integers, and an output q's weights' pair against them.
//
// With at most 8 query rows (one token of up to 8 query heads per KV head: the decode step and the batched step at
// Qwen3.6's shape), q's hi and lo go on rows r and r + 8 of the mma's 16 (STACK): one mma takes both halves, two per
// 16×8×16 block where the planes take four, and the two rows are added in the thread that holds both. With more rows
// q's hi and lo are two planes, each product its own mma into its own accumulators, summed in the same order: a row's
// bits are the same either way.
#pragma once

#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "cuda/common/ptx.cuh"
#include "cuda/kernels/attention/attention_internal.cuh"
#include "cuda/kernels/attention/attention_tiles.cuh"

namespace tern::cuda {
namespace {

// A decode stage of an i16 cache: K [64][DH] int16 (swizzled as swz) at 0, V at kTile, then K's 64 row scales and
// V's (fp32; 0 for rows not read).
template <int DH>
struct I16Stage {
  static constexpr uint32_t kTile = kBlockKeys * DH * 2;
  static constexpr uint32_t kScales = 2 * kTile;
  static constexpr uint32_t kBytes = 2 * kTile + 2 * kBlockKeys * 4;
};

// 4 bytes from global `src` to shared `dst` (a shared-window address); src_bytes 0: 4 zeros, nothing read.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// This thread's share of copying tile rows [0, 64) of K and V (row stride DH values) and their scales into an
// I16Stage at `sstage`: the values as copy_tile_async copies 16-bit tiles, thread t the scale of row t % 64 of K
// (t < 64) or V. Rows >= valid_rows are zero-filled, not read. The caller commits.
template <int DH>
__device__ __forceinline__ void copy_stage_i16(uint32_t sstage, const uint16_t* k, const uint16_t* v, const float* ks,
                                               const float* vs, int valid_rows, int tid) {
  copy_tile_async<DH>(sstage, k, valid_rows, tid);
  copy_tile_async<DH>(sstage + I16Stage<DH>::kTile, v, valid_rows, tid);
  const int r = tid % kBlockKeys;
  const float* src = (tid < kBlockKeys ? ks : vs) + r;
  cp_async_4(sstage + I16Stage<DH>::kScales + 4 * tid, r < valid_rows ? src : ks, r < valid_rows ? 4u : 0u);
}

// (a & mask) ^ c in one instruction.
__device__ __forceinline__ uint32_t lop3_and_xor(uint32_t a, uint32_t mask, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0x6A;\n" : "=r"(d) : "r"(a), "r"(mask), "r"(c));
  return d;
}

// a · b + c on fp16 pairs (one rounding).
__device__ __forceinline__ uint32_t hfma2_bits(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Two int16 v (the low half first) -> fp16 pairs with hi + lo = v / 2 exactly: hi = 32·(v >> 6) (10 significant
// bits), lo = (v & 63) / 2 in [0, 31.5]. Each field goes into the mantissa of 1024 (v >> 6 in offset binary: its sign
// bit flipped, 1536 + (v >> 6)), and one fma takes it out: 32·(1536 + a) − 49152 and (1024 + b)/2 − 512, exact.
__device__ __forceinline__ void split_i16x2(uint32_t w, uint32_t& hi, uint32_t& lo) {
  const uint32_t hb = lop3_and_xor(w >> 6, 0x03ff03ffu, 0x66006600u);  // 0x6400 | ((v >> 6) + 512), 10 bits
  const uint32_t lb = lop3_and_or(w, 0x003f003fu, 0x64006400u);        // 0x6400 | (v & 63)
  hi = hfma2_bits(hb, 0x50005000u, 0xfa00fa00u);                       // · 32 − 49152
  lo = hfma2_bits(lb, 0x38003800u, 0xe000e000u);                       // · 0.5 − 512
}

// a + b and a − b on fp16 pairs (round to nearest even; never fused with a neighbouring product).
__device__ __forceinline__ uint32_t hadd2_bits(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("add.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ uint32_t hsub2_bits(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("sub.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// Two int16 v -> fp16 pairs with hi + lo = v / 2 exactly and lo small: hi = fp16(v / 2) (nearest even), lo = the rest
// (0 for |v| <= 2048, at most 4 in magnitude above). split_i16x2's pair (h, l) summed by Fast2Sum: hi = fl(h + l),
// lo = l − fl(hi − h), both steps exact because |h| >= 32 > |l| whenever h != 0 (h = 0: hi = l, lo = 0).
__device__ __forceinline__ void split_i16x2_near(uint32_t w, uint32_t& hi, uint32_t& lo) {
  uint32_t h, l;
  split_i16x2(w, h, l);
  hi = hadd2_bits(h, l);
  lo = hsub2_bits(l, hsub2_bits(hi, h));
}

template <int N>
__device__ __forceinline__ void split_i16_frag(const uint32_t (&b)[N], uint32_t (&hi)[N], uint32_t (&lo)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) split_i16x2(b[i], hi[i], lo[i]);
}

// c += a · (n-half h of a split fragment): its hi, then its lo (bh, bl: split_i16_frag of one ldmatrix_x4).
__device__ __forceinline__ void mma16_pair(float c[4], const uint32_t a[4], const uint32_t (&bh)[4],
                                           const uint32_t (&bl)[4], int h) {
  mma16<true>(c, a, bh[2 * h], bh[2 * h + 1]);
  mma16<true>(c, a, bl[2 * h], bl[2 * h + 1]);
}

// ---- the prefill: tiles staged as int16, then split into planes once a block -----------------------------------
//
// The prefill's 64 query rows a block read every K and V value four times (once a row group of warps), so it splits
// each value once, into an I16Tile's planes, from a staging area that cp.async fills while the block computes: the
// rows' int16 as copy_tile_async lays them out, then their 64 scales. The planes hold v / 2 as split_i16x2_near's
// pairs (hi = fp16(v / 2), lo the rest: at most 4, so the lo·lo products the prefill drops lose almost nothing), made
// by integer and fp16x2 instructions alone; the tile's scales are twice the rows' (exact), so a pair times its scale is
// v times the row's scale.
template <int DH>
struct I16Staging {
  static constexpr uint32_t kScales = kBlockKeys * DH * 2;
  static constexpr uint32_t kBytes = kScales + kBlockKeys * 4;
};

// This thread's share (of NTH) of copying tile rows [0, 64) (row stride DH values; `scales` the rows' scales) into
// the staging at `sdst` (a shared-window address): the values as copy_tile_async copies them, thread t < 64 row t's
// scale. Rows >= valid_rows are zero-filled, not read. The caller commits.
template <int DH, int NTH>
__device__ __forceinline__ void stage_tile_i16(uint32_t sdst, const uint16_t* src, const float* scales, int valid_rows,
                                               int tid) {
  copy_tile_async<DH, NTH>(sdst, src, valid_rows, tid);
  if (tid < kBlockKeys)
    cp_async_4(sdst + I16Staging<DH>::kScales + 4 * tid, tid < valid_rows ? scales + tid : scales,
               tid < valid_rows ? 4u : 0u);
}

// The chunks and scale that this thread's stage_tile_i16 copied (its cp.async waited for) from the staging at `stg`
// into the I16Tile at `dst` (generic pointers): v as hi and lo planes (split_i16x2_near), the scale times 2. The
// staging is then free for this thread's next stage_tile_i16; the tile is complete once every thread has done this.
template <int DH, int NTH>
__device__ __forceinline__ void unstage_tile_i16(const uint8_t* stg, uint8_t* dst, int tid) {
  constexpr int CH = DH / 8, RP = NTH / CH;
  const int c = tid % CH, r0 = tid / CH;
#pragma unroll 4
  for (int i = 0; i < kBlockKeys / RP; ++i) {
    const uint32_t at = swz<DH>(r0 + i * RP, c);
    const uint4 raw = *reinterpret_cast<const uint4*>(stg + at);
    uint4 hi, lo;
    split_i16x2_near(raw.x, hi.x, lo.x);
    split_i16x2_near(raw.y, hi.y, lo.y);
    split_i16x2_near(raw.z, hi.z, lo.z);
    split_i16x2_near(raw.w, hi.w, lo.w);
    *reinterpret_cast<uint4*>(dst + at) = hi;
    *reinterpret_cast<uint4*>(dst + I16Tile<DH>::kPlane + at) = lo;
  }
  if (tid < kBlockKeys)
    reinterpret_cast<float*>(dst + I16Tile<DH>::kScales)[tid] =
        2.0f * reinterpret_cast<const float*>(stg + I16Staging<DH>::kScales)[tid];
}

// The i16 decode's query rows r < R (r = t·G + hg: token t, head kvh·G + hg; q the sequence's [T, Hq, DH] fp32) as
// fp16 hi + lo (load8_split) into sQ: STACK (R <= 8) hi on row r and lo on row r + 8 of [16][DH]; else hi on row r of
// [16·RW][DH] and lo on row r of the plane at sQ + q_lo. Rows past R are zero.
template <int DH, int RW, bool STACK>
__device__ __forceinline__ void decode_load_q_i16(uint8_t* sQ, uint32_t q_lo, const float* q, int Hq, int kvh, int G,
                                                  int R, int tid) {
  constexpr int CH = DH / 8, ROWS = STACK ? 8 : 16 * RW;
  for (int i = tid; i < ROWS * CH; i += 128) {
    const int r = i / CH, c = i % CH;
    uint4 hi = make_uint4(0u, 0u, 0u, 0u), lo = hi;
    if (r < R) load8_split(q + ((int64_t(r / G) * Hq + kvh * G + r % G) * DH + c * 8), hi, lo);
    *reinterpret_cast<uint4*>(sQ + swz<DH>(r, c)) = hi;
    if constexpr (STACK)
      *reinterpret_cast<uint4*>(sQ + swz<DH>(r + 8, c)) = lo;
    else
      *reinterpret_cast<uint4*>(sQ + q_lo + swz<DH>(r, c)) = lo;
  }
}

// S[16 rows][SN·8 keys] = Q[rows q_row0..] · K[keys k_row0..]ᵀ / 2 over an I16Stage's K tile at sk, not yet times the
// keys' scales: per 16 dims, Qhi·Khi, Qhi·Klo into the hi rows' sums and Qlo·Khi, Qlo·Klo into the lo rows', then
// hi + lo. STACK: Q hi on rows 0-7 and lo on 8-15 of sq (one mma for both); the rows 8-15 of s are then undefined
// (i16_scale_scores_half makes them −inf). Else Q hi at sq and lo at sq + q_lo, each row's own.
template <int DH, int SN, bool STACK>
__device__ __forceinline__ void scores_qk_i16(float (&s)[SN][4], uint32_t sq, uint32_t q_lo, int q_row0, uint32_t sk,
                                              int k_row0, int lane) {
  const LdmOffsets<DH> qo(q_row0, lane, (lane >> 3) & 1, lane >> 4);
  const LdmOffsets<DH> ko(k_row0, lane, lane >> 4, (lane >> 3) & 1);
  float t[STACK ? 1 : SN][4];  // the planes' lo sums
#pragma unroll
  for (int n = 0; n < SN; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
  for (int n = 0; n < (STACK ? 1 : SN); ++n) t[n][0] = t[n][1] = t[n][2] = t[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < DH / 16; ++kk) {
    uint32_t ah[4], al[4];
    ldmatrix_x4(ah, sq + qo.at(kk, 0));
    if constexpr (!STACK) ldmatrix_x4(al, sq + q_lo + qo.at(kk, 0));
#pragma unroll
    for (int p = 0; p < SN / 2; ++p) {
      uint32_t b[4], bh[4], bl[4];
      ldmatrix_x4(b, sk + ko.at(kk, 16 * p));
      split_i16_frag(b, bh, bl);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mma16_pair(s[2 * p + h], ah, bh, bl, h);
        if constexpr (!STACK) mma16_pair(t[2 * p + h], al, bh, bl, h);
      }
    }
  }
#pragma unroll
  for (int n = 0; n < SN; ++n) {
    if constexpr (STACK) {
      s[n][0] += s[n][2];
      s[n][1] += s[n][3];
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) s[n][i] += t[n][i];
    }
  }
}

// Each score of this thread (columns 8n + 2qd + e of the slice) times twice its key's K scale (the tile's values are
// v / 2); STACK: rows 8-15 (padding) become −inf.
template <int SN, bool STACK>
__device__ __forceinline__ void i16_scale_scores_half(float (&s)[SN][4], const float* k_scales, int qd) {
#pragma unroll
  for (int n = 0; n < SN; ++n) {
    const float2 sc = *reinterpret_cast<const float2*>(k_scales + 8 * n + 2 * qd);
    const float x = 2.0f * sc.x, y = 2.0f * sc.y;
    s[n][0] *= x;
    s[n][1] *= y;
    s[n][2] = STACK ? -INFINITY : s[n][2] * x;
    s[n][3] = STACK ? -INFINITY : s[n][3] * y;
  }
}

// O[16 rows][DH] += P[16 rows][SN·8 keys] · V[keys v_row0..][DH] over an I16Stage's V tile at sv (v_scales: its
// scales from key v_row0): each weight p times twice its key's scale over 2^e (the tile's values are v / 2; e:
// i16_tile_exponent, o counts in units of 2^e) as fp16 hi + lo (split2_f16). Per 16 keys, Phi·Vhi, Phi·Vlo into the
// output's sums and Plo·Vhi, Plo·Vlo into the tile's lo sums, added to the output at the tile's end. STACK: a row's
// hi weights on row g and lo on row g + 8 (the rows 8-15 of o hold the lo sums until then, 0 before and after).
template <int DH, int SN, bool STACK>
__device__ __forceinline__ void accumulate_pv_i16(float (&o)[DH / 8][4], const float (&p)[SN][4], uint32_t sv,
                                                  const float* v_scales, int e, int v_row0, int lane) {
  const int qd = lane & 3;
  const LdmOffsets<DH> vo(v_row0, lane, (lane >> 3) & 1, lane >> 4);
  uint32_t ah[SN / 2][4], al[SN / 2][4];
#pragma unroll
  for (int kk = 0; kk < SN / 2; ++kk) {
    // this thread's keys: 16kk + 2qd + {0, 1} (p[2kk]) and 16kk + 8 + 2qd + {0, 1} (p[2kk + 1])
    const float2 f0 = *reinterpret_cast<const float2*>(v_scales + 16 * kk + 2 * qd);
    const float2 f1 = *reinterpret_cast<const float2*>(v_scales + 16 * kk + 8 + 2 * qd);
    const float w00 = pow2_scale(f0.x, 1 - e), w01 = pow2_scale(f0.y, 1 - e);
    const float w10 = pow2_scale(f1.x, 1 - e), w11 = pow2_scale(f1.y, 1 - e);
    split2_f16(p[2 * kk][0] * w00, p[2 * kk][1] * w01, ah[kk][0], al[kk][0]);
    split2_f16(p[2 * kk + 1][0] * w10, p[2 * kk + 1][1] * w11, ah[kk][2], al[kk][2]);
    if constexpr (!STACK) {
      split2_f16(p[2 * kk][2] * w00, p[2 * kk][3] * w01, ah[kk][1], al[kk][1]);
      split2_f16(p[2 * kk + 1][2] * w10, p[2 * kk + 1][3] * w11, ah[kk][3], al[kk][3]);
    }
  }
  if constexpr (STACK) {
#pragma unroll
    for (int kk = 0; kk < SN / 2; ++kk) {
      const uint32_t a[4] = {ah[kk][0], al[kk][0], ah[kk][2], al[kk][2]};
#pragma unroll
      for (int np = 0; np < DH / 16; ++np) {
        uint32_t b[4], bh[4], bl[4];
        ldmatrix_x4_trans(b, sv + vo.at(np, 16 * kk));
        split_i16_frag(b, bh, bl);
#pragma unroll
        for (int h = 0; h < 2; ++h) mma16_pair(o[2 * np + h], a, bh, bl, h);
      }
    }
#pragma unroll
    for (int n = 0; n < DH / 8; ++n) {
      o[n][0] += o[n][2];
      o[n][1] += o[n][3];
      o[n][2] = o[n][3] = 0.0f;
    }
  } else {
#pragma unroll
    for (int np = 0; np < DH / 16; ++np) {
      float t[2][4] = {};
#pragma unroll
      for (int kk = 0; kk < SN / 2; ++kk) {
        uint32_t b[4], bh[4], bl[4];
        ldmatrix_x4_trans(b, sv + vo.at(np, 16 * kk));
        split_i16_frag(b, bh, bl);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          mma16_pair(o[2 * np + h], ah[kk], bh, bl, h);
          mma16_pair(t[h], al[kk], bh, bl, h);
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < 4; ++i) o[2 * np + h][i] += t[h][i];
    }
  }
}

}  // namespace
}  // namespace tern::cuda
