// The prepared forms of a prefill product's input x, one 8-column word at a time: the device functions that write
// them, shared by the kernels that prepare x (qmatmul.cu's matmul_prepare_x, qmatmul_int8.cu's matmul_quantize_x,
// qmatmul_wgmma.cu's matmul_prepare_x_f16x2) and the RMSNorm that writes them directly (norm.cu's rmsnorm_prepare).
// Layouts: qmatmul.cuh (split bf16 hi + lo), qmatmul_wgmma.cuh (fp16 hi + lo) and qmatmul_int8.cuh (16-bit integers
// per group of 64).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/kernels/qmv/dp4a_tile.cuh"

namespace tern::cuda::xform {

// ---- bf16 hi + lo (matmul_prepare_x) ---------------------------------------------------------------------------

// Two bf16 (lo, hi) in one register, rounded to nearest even.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ float bf16x2_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16x2_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

// 8 consecutive x values -> one 16-byte chunk of the MMA layout: bf16 pairs (0,4) (1,5) (2,6) (3,7).
__device__ __forceinline__ uint4 pack_chunk(const float4 lo, const float4 hi) {
  return make_uint4(pack_bf16x2(lo.x, hi.x), pack_bf16x2(lo.y, hi.y), pack_bf16x2(lo.z, hi.z),
                    pack_bf16x2(lo.w, hi.w));
}

// Values a and b (elements e and e + 4 of a chunk) -> hi and lo bf16 pairs; returns x'(a) + x'(b), x' = hi + lo
// (each exact in fp32: hi holds the top 8 significant bits, lo the next 8 at most 9 binades lower).
__device__ __forceinline__ float split_pair(float a, float b, uint32_t& hi, uint32_t& lo) {
  hi = pack_bf16x2(a, b);
  const float ha = bf16x2_lo(hi), hb = bf16x2_hi(hi);
  lo = pack_bf16x2(a - ha, b - hb);
  return (ha + bf16x2_lo(lo)) + (hb + bf16x2_hi(lo));
}

// 8 consecutive x values (p: 0..3, q: 4..7) -> the hi and lo chunks of the MMA layout; returns their Σx' (a fixed
// order: the kernel and matmul_prepare_x get the same bits).
__device__ __forceinline__ float split_chunk(const float4 p, const float4 q, uint4& hi, uint4& lo) {
  const float s0 = split_pair(p.x, q.x, hi.x, lo.x), s1 = split_pair(p.y, q.y, hi.y, lo.y);
  const float s2 = split_pair(p.z, q.z, hi.z, lo.z), s3 = split_pair(p.w, q.w, hi.w, lo.w);
  return (s0 + s1) + (s2 + s3);
}

// Sum over the 8 lanes l ^ {1, 2, 4} (a group's 8 chunks); every lane gets the same bits. All lanes must call it.
__device__ __forceinline__ float sum8(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  return v;
}

// Word c (8 columns) of a row of the split layout (matmul_prepared_row_bytes(cols) bytes at `row`): its hi and lo
// chunks, and (first word of a group) the group's Σx'. All 32 lanes must call it (sum8); `in` says whether to store.
__device__ __forceinline__ void store_split_word(unsigned char* row, int64_t cols, int64_t c, const float (&v)[8],
                                                 bool in) {
  uint4 hi, lo;
  const float4 p = make_float4(v[0], v[1], v[2], v[3]), q = make_float4(v[4], v[5], v[6], v[7]);
  const float sum = sum8(split_chunk(p, q, hi, lo));
  if (in) {
    reinterpret_cast<uint4*>(row + (c / 8) * 256)[c % 8] = hi;
    reinterpret_cast<uint4*>(row + (c / 8) * 256 + 128)[c % 8] = lo;
    if (c % 8 == 0) reinterpret_cast<float*>(row + cols * 4)[c / 8] = sum;
  }
}

// ---- fp16 with a per-token scale: one term (matmul_prepare_x_f16) or hi + lo (matmul_prepare_x_f16x2) -----------

// A row's scale from its largest |x|, m: σ = 2^(E − 15) for m < 2^E (m = 0: E = 0), an exact scaling of the row into
// (−2^15, 2^15); returns 1/σ, and σ in sigma.
__device__ __forceinline__ float f16_row_scale(float m, float& sigma) {
  int e = 0;
  frexpf(m, &e);
  sigma = ldexpf(1.0f, e - 15);
  return ldexpf(1.0f, 15 - e);
}

// Word c (8 columns, already x's values v) of a row of the fp16 layout (Pair: matmul_f16x2_row_bytes(cols) bytes at
// `row`, else matmul_f16_row_bytes(cols)): hi = fp16(v/σ) as pairs (0,4) (1,5) (2,6) (3,7), with Pair also lo =
// fp16(v/σ − hi) (the subtraction exact), per group 128 bytes of hi then 128 of lo; and (first word of a group) the
// group's sum of what the MMAs see, Σhi or Σ(hi + lo). inv = 1/σ. All 32 lanes must call it (sum8); `in` says whether
// to store.
template <bool Pair>
__device__ __forceinline__ void store_f16_word(unsigned char* row, int64_t cols, int64_t c, const float (&v)[8],
                                               float inv, bool in) {
  uint32_t h[4], l[4];
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float a = v[k] * inv, b = v[k + 4] * inv;
    const __half2 hv = __floats2half2_rn(a, b);
    const float ha = __low2float(hv), hb = __high2float(hv);
    h[k] = *reinterpret_cast<const uint32_t*>(&hv);
    if constexpr (Pair) {
      const __half2 lv = __floats2half2_rn(a - ha, b - hb);
      l[k] = *reinterpret_cast<const uint32_t*>(&lv);
      sum += (ha + __low2float(lv)) + (hb + __high2float(lv));
    } else {
      sum += ha + hb;
    }
  }
  sum = sum8(sum);
  if (!in) return;
  if constexpr (Pair) {
    reinterpret_cast<uint4*>(row + (c / 8) * 256)[c % 8] = make_uint4(h[0], h[1], h[2], h[3]);
    reinterpret_cast<uint4*>(row + (c / 8) * 256 + 128)[c % 8] = make_uint4(l[0], l[1], l[2], l[3]);
  } else {
    reinterpret_cast<uint4*>(row)[c] = make_uint4(h[0], h[1], h[2], h[3]);
  }
  if (c % 8 == 0) reinterpret_cast<float*>(row + cols * (Pair ? 4 : 2))[c / 8] = sum;
}

// σ into its place in a row of the fp16 layout, after the groups' sums.
template <bool Pair>
__device__ __forceinline__ void store_f16_sigma(unsigned char* row, int64_t cols, float sigma) {
  reinterpret_cast<float*>(row + cols * (Pair ? 4 : 2))[cols / 64] = sigma;
}

// ---- 16-bit integers per group of 64 (matmul_quantize_x) -------------------------------------------------------

// One word's 16-bit form stored: the word, and (first lane of each group) σ and σ·Σv in the row's tail.
__device__ __forceinline__ void store_q16_word(unsigned char* row, int64_t cols, int64_t w, uint4 word, float sig,
                                               int sumv) {
  reinterpret_cast<uint4*>(row)[w] = word;
  if (w % 8 == 0) {
    float* tail = reinterpret_cast<float*>(row + (cols / 64) * 128);  // σ [G], then σ·Σv [G]
    tail[w / 8] = sig;
    tail[cols / 64 + w / 8] = sig * float(sumv);
  }
}

// σ of a group: m/32639 truncated to 22 significant bits (the kernel's fold relies on it; 2^-22 relative is far
// below the rounding of v).
__device__ __forceinline__ float group_sigma(float m) { return __uint_as_float(__float_as_uint(m / dp4a::kQMax) & ~3u); }

__device__ __forceinline__ int byte_at(uint32_t word, int i) { return int(int8_t((word >> (8 * i)) & 0xffu)); }

// r = x − σ·v for the 8 columns of a word stored as {even hi, odd hi, even lo, odd lo} (v = 256·hi + lo). One fma per
// column: |r| ≤ ~σ/2, so its own rounding is 2^-24 of that.
__device__ __forceinline__ void word_residual(const float (&x)[8], uint4 word, float sig, float (&r)[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int even = 256 * byte_at(word.x, i) + byte_at(word.z, i), odd = 256 * byte_at(word.y, i) + byte_at(word.w, i);
    r[2 * i] = fmaf(-sig, float(even), x[2 * i]);
    r[2 * i + 1] = fmaf(-sig, float(odd), x[2 * i + 1]);
  }
}

// The sum of a word's Σv over the 8 lanes of its group.
__device__ __forceinline__ int group_sum(int v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v + __shfl_xor_sync(0xffffffffu, v, 4);
}

// Word w's 16-bit form into `row` (when `in`); returns the word, and its group's σ in sig. All 32 lanes must call it
// (the group's max and Σv).
__device__ __forceinline__ uint4 quantize_q16_word(unsigned char* row, int64_t cols, int64_t w, const float (&v)[8],
                                                   bool in, float& sig) {
  int sumv = 0;
  float m = 0.0f;
  const uint4 word = dp4a::quantize_word(v, sumv, m);
  sig = group_sigma(m);
  sumv = group_sum(sumv);
  if (in) store_q16_word(row, cols, w, word, sig, sumv);
  return word;
}

// Word w of a row: its 16-bit form into `out` and (residual set) the residual's into `residual` (rows of
// matmul_q16_row_bytes(cols)). All 32 lanes must call it; `in` says whether to store.
__device__ __forceinline__ void store_q16_words(unsigned char* out, unsigned char* residual, int64_t cols, int64_t w,
                                                const float (&v)[8], bool in) {
  float sig, rsig;
  const uint4 word = quantize_q16_word(out, cols, w, v, in, sig);
  if (residual) {  // uniform over the grid
    float res[8];
    word_residual(v, word, sig, res);
    quantize_q16_word(residual, cols, w, res, in, rsig);
  }
}

}  // namespace tern::cuda::xform
