// The device helpers shared by the attention kernels (prefill, decode, attn_prepare; included only by the attention
// .cu files): cp.async and ldmatrix over swizzled 16-bit tiles, the 16-bit mma, pack16, the fp8 cache's row helpers
// (scales, quantise, dequantise), the score masks, the online softmax and P·V. All in the anonymous namespace, as
// when they shared one file with the kernels: each file compiles its own inlined copies.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/common/cuda_common.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/kernels/attention/attention.cuh"
#include "cuda/kernels/attention/attention_internal.cuh"

namespace tern::cuda {
namespace {

// ---- small device helpers (the cp.async, ldmatrix and bf16 mma wrappers are common/ptx.cuh's) ------------------

// Waits until at most n (0..3) committed groups are pending.
__device__ __forceinline__ void cp_async_wait_dyn(int n) {
  if (n <= 0) cp_async_wait<0>();
  else if (n == 1) cp_async_wait<1>();
  else if (n == 2) cp_async_wait<2>();
  else cp_async_wait<3>();
}

// The 16-bit element type of q and the softmax weights on the tensor cores, and of the K/V tiles in shared memory:
// F16 = true is fp16 (11 significant bits; magnitudes past 65504 saturate to ±65504 when stored, NaN stays NaN:
// pack16), false bf16 (8 bits). The kernels take the cache's type (AttnDims::kv) as a template parameter KV: fp16 and
// fp8 caches compute in fp16 (kF16), a bf16 cache in bf16.
template <KvDtype KV>
constexpr bool kF16 = KV != KvDtype::bf16;
template <KvDtype KV>
constexpr bool kFp8 = KV == KvDtype::fp8;
// The i16 cache (16-bit integers and a scale per row): the kernels then hold q and the softmax weights as fp16 hi + lo
// pairs (hi = fp16(x), lo = fp16(x − hi): about 22 significant bits where fp16 keeps 11) and the rows' integers v as
// exact pairs that hold v / 2 (attention_i16_tiles.cuh), and sum the pairs' products on the tensor cores. The prefill
// splits each K and V tile once a block into two planes (I16Tile; split_i16x2_near: hi = fp16(v / 2), lo at most 4)
// and sums hi·hi + hi·lo + lo·hi (lo·lo dropped); the decode splits each fragment as it leaves its tile of int16
// (split_i16x2) and keeps all four products. Each score is multiplied by twice its key's K scale, and each softmax
// weight by twice its key's V scale over the tile's power of two (the output accumulators then count in that power
// of two, rescaled when it changes).
template <KvDtype KV>
constexpr bool kI16 = KV == KvDtype::i16;
// Whether the rows carry an fp32 scale each (fp8, i16), and the 16-bit tiles' planes in shared memory (i16: 2).
template <KvDtype KV>
constexpr bool kScaled = kv_row_scaled(KV);
template <KvDtype KV>
constexpr int kPlanes = kI16<KV> ? 2 : 1;
// A cache row's element: 16 bits (an i16 cache's int16 as its bits), or an e4m3 byte.
template <KvDtype KV>
using CacheElem = std::conditional_t<kFp8<KV>, uint8_t, uint16_t>;
//
// c[16×8] += a[16×16] · b[16×8], 16-bit inputs, fp32 accumulators. Fragments (g = lane/4, c = lane%4):
//   a0 (g, 2c..2c+1), a1 (g+8, 2c..), a2 (g, 2c+8..), a3 (g+8, 2c+8..);  b0 (k 2c..2c+1, n g), b1 (k 2c+8.., n g);
//   c0 (g, 2c), c1 (g, 2c+1), c2 (g+8, 2c), c3 (g+8, 2c+1).
template <bool F16>
__device__ __forceinline__ void mma16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  if constexpr (F16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    mma_bf16_16816_volatile(c, a, b0, b1);
  }
}

// Two floats -> a packed 16-bit pair (round to nearest even), `lo` in the low half (the lower column); every 16-bit
// value of this file (the KV cache, q, the softmax weights) is made here. fp16 is .satfinite (PTX 8.1, sm_80+): a
// magnitude past 65504, ±inf included, becomes ±65504, and NaN stays NaN so that it reaches the output (a clamp by
// fmaxf/fminf would make it a finite -65504: fmaxf drops NaN). bf16, with fp32's exponent range, only rounds.
template <bool F16>
__device__ __forceinline__ uint32_t pack16(float lo, float hi) {
  if constexpr (F16) {
    uint32_t r;
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  } else {
    return cvt_bf16x2(lo, hi);
  }
}

// Byte offset of 16-byte chunk c of row r in a [rows][DH] 16-bit tile. The chunk index is XOR-swizzled with r % 8, so
// the 8 rows an ldmatrix reads at one logical chunk land in 8 distinct bank groups (no conflicts, no padding).
template <int DH>
__device__ __forceinline__ uint32_t swz(int r, int c) {
  return uint32_t(r * (DH * 2) + ((c ^ (r & 7)) << 4));
}

// 8 fp32 values (a, b) -> one 16-byte chunk of 16-bit values.
template <bool F16>
__device__ __forceinline__ uint4 pack8_as16(const float4 a, const float4 b) {
  return make_uint4(pack16<F16>(a.x, a.y), pack16<F16>(a.z, a.w), pack16<F16>(b.x, b.y), pack16<F16>(b.z, b.w));
}

// 8 fp32 values at src -> one 16-byte chunk of 16-bit values.
template <bool F16>
__device__ __forceinline__ uint4 load8_as16(const float* src) {
  return pack8_as16<F16>(reinterpret_cast<const float4*>(src)[0], reinterpret_cast<const float4*>(src)[1]);
}

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// ---- the fp8 cache (KvDtype::fp8; attention.cuh has the format, core/fp8.h the CPU twin) ----------------------

// The rows' scales of a scaled cache (fp8, i16) [Hkv, capacity, DH] values: [Hkv, capacity] fp32 after them.
template <KvDtype KV, typename Byte>  // Byte: uint8_t or const uint8_t
__device__ __forceinline__ auto row_scales(Byte* cache, int Hkv, int64_t capacity, int dh) {
  using Float = std::conditional_t<std::is_const_v<Byte>, const float, float>;
  return reinterpret_cast<Float*>(cache + int64_t(Hkv) * capacity * dh * kv_value_bytes(KV));
}

// The scale of a row whose largest magnitude is amax (NaN already dropped by fmaxf): amax / 448, ±inf as FLT_MAX.
__device__ __forceinline__ float fp8_row_scale(float amax) { return __fdiv_rn(fminf(amax, FLT_MAX), 448.0f); }

// The largest magnitude of the DH-value row that a group of CH = DH/8 lanes holds (8 values each), NaN ignored; every
// lane of the warp must call it (the shuffles span the group).
template <int DH>
__device__ __forceinline__ float row_amax(const float (&v)[8]) {
  constexpr int CH = DH / 8;
  float a = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) a = fmaxf(a, fabsf(v[e]));
#pragma unroll
  for (int off = CH / 2; off > 0; off >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, off));
  return a;
}

// 8 values of a row -> 8 e4m3 bytes, value e at byte e: e4m3(x / scale), round to nearest even, satfinite (±448; NaN
// stays NaN). A zero scale (a row of zeros) stores x itself: ±0, or NaN.
__device__ __forceinline__ uint2 quantize8_fp8(const float (&v)[8], float scale) {
  uint32_t w[2] = {0u, 0u};
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float x = scale > 0.0f ? __fdiv_rn(v[e], scale) : v[e];
    w[e / 4] |= uint32_t(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)) << (8 * (e % 4));
  }
  return make_uint2(w[0], w[1]);
}

// Lane c's 8 values of row `pos` of KV head `head` into an fp8 cache of `capacity` rows per head, and the row's
// scale (lane 0 of the row's group).
template <int DH>
__device__ __forceinline__ void store_fp8_chunk(void* cache, int Hkv, int64_t capacity, int head, int64_t pos, int c,
                                                const float (&x)[8], float scale) {
  uint8_t* bytes = static_cast<uint8_t*>(cache);
  const int64_t row = int64_t(head) * capacity + pos;
  *reinterpret_cast<uint2*>(bytes + row * DH + 8 * c) = quantize8_fp8(x, scale);
  if (c == 0) row_scales<KvDtype::fp8>(bytes, Hkv, capacity, DH)[row] = scale;
}

// Two e4m3 bytes (the lower one first) and their row's scale -> a packed fp16 pair: fp16(float(e4m3) · scale), the
// product rounded to fp32 and then to fp16 (pack16: nearest even, satfinite, NaN kept). e4m3 -> fp16 is exact.
__device__ __forceinline__ uint32_t dequant2_f16(uint32_t two, float scale) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two), __NV_E4M3);
  const float2 f = __half22float2(__half2(h));
  return pack16<true>(f.x * scale, f.y * scale);
}

// 8 e4m3 bytes (value e at byte e) -> one 16-byte chunk of 8 fp16 values.
__device__ __forceinline__ uint4 dequant8_f16(uint32_t lo, uint32_t hi, float scale) {
  return make_uint4(dequant2_f16(lo & 0xffffu, scale), dequant2_f16(lo >> 16, scale), dequant2_f16(hi & 0xffffu, scale),
                    dequant2_f16(hi >> 16, scale));
}

// ---- the i16 cache (KvDtype::i16; attention.cuh has the format, core/kv_i16.h the CPU twin) -------------------

// Whether any of the DH-value row that a group of CH = DH/8 lanes holds is NaN (every lane of the warp must call it).
template <int DH>
__device__ __forceinline__ bool row_has_nan(const float (&v)[8]) {
  constexpr int CH = DH / 8;
  int nan = 0;
#pragma unroll
  for (int e = 0; e < 8; ++e) nan |= v[e] != v[e];
#pragma unroll
  for (int off = CH / 2; off > 0; off >>= 1) nan |= __shfl_xor_sync(0xffffffffu, nan, off);
  return nan != 0;
}

// The i16 scale of a row whose largest magnitude is amax (NaN dropped by fmaxf): amax / 32767, ±inf counted as
// FLT_MAX; NaN when the row holds a NaN (the whole row then reads back NaN, so that it reaches the output).
__device__ __forceinline__ float i16_row_scale(float amax, bool nan) {
  return nan ? __int_as_float(0x7fc00000) : __fdiv_rn(fminf(amax, FLT_MAX), 32767.0f);
}

// 8 values of a row -> 8 int16 (value e at half e): rint(x / scale) (nearest even), clamped to ±32767; 0 where the
// scale is 0 (a row of zeros) or NaN.
__device__ __forceinline__ uint4 quantize8_i16(const float (&v)[8], float scale) {
  uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    int x = 0;
    if (scale > 0.0f) x = __float2int_rn(fminf(fmaxf(__fdiv_rn(v[e], scale), -32767.0f), 32767.0f));
    w[e / 2] |= (uint32_t(x) & 0xffffu) << (16 * (e % 2));
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Lane c's 8 values of row `pos` of KV head `head` into an i16 cache of `capacity` rows per head, and the row's scale
// (lane 0 of the row's group).
template <int DH>
__device__ __forceinline__ void store_i16_chunk(void* cache, int Hkv, int64_t capacity, int head, int64_t pos, int c,
                                                const float (&x)[8], float scale) {
  uint8_t* bytes = static_cast<uint8_t*>(cache);
  const int64_t row = int64_t(head) * capacity + pos;
  *reinterpret_cast<uint4*>(bytes + (row * DH + 8 * c) * 2) = quantize8_i16(x, scale);
  if (c == 0) row_scales<KvDtype::i16>(bytes, Hkv, capacity, DH)[row] = scale;
}

// Two floats -> their fp16 hi + lo pairs (lower column in the low half): hi = fp16(x) (pack16: nearest even,
// satfinite, NaN kept), lo = fp16(x − hi), the difference exact in fp32.
__device__ __forceinline__ void split2_f16(float a, float b, uint32_t& hi, uint32_t& lo) {
  hi = pack16<true>(a, b);
  const float2 h = __half22float2(*reinterpret_cast<const __half2*>(&hi));
  lo = pack16<true>(a - h.x, b - h.y);
}

// 8 fp32 values -> the 16-byte chunks of their hi and lo planes.
__device__ __forceinline__ void split8_f16(const float (&v)[8], uint4& hi, uint4& lo) {
  split2_f16(v[0], v[1], hi.x, lo.x);
  split2_f16(v[2], v[3], hi.y, lo.y);
  split2_f16(v[4], v[5], hi.z, lo.z);
  split2_f16(v[6], v[7], hi.w, lo.w);
}

// x · 2^k, exact unless the result is subnormal (k any int; the factor as a float where it is one).
__device__ __forceinline__ float pow2_scale(float x, int k) {
  return k >= -126 && k <= 127 ? x * __int_as_float((k + 127) << 23) : ldexpf(x, k);
}

// An i16 K or V tile in shared memory (the prefill's; attention_i16_tiles.cuh, unstage_tile_i16): the rows' integers
// v as exact fp16 pairs holding v / 2 (split_i16x2_near: hi = fp16(v / 2), lo = the rest, at most 4), hi [64][DH] at
// the tile's base, lo [64][DH] after it (both swizzled), then twice the 64 rows' scales (fp32; 0 for rows not read).
template <int DH>
struct I16Tile {
  static constexpr uint32_t kPlane = kBlockKeys * DH * 2;             // the lo plane's offset
  static constexpr uint32_t kScales = 2 * kPlane;                     // the scales' offset
  static constexpr uint32_t kBytes = 2 * kPlane + kBlockKeys * 4;     // the tile's bytes (a multiple of 256)
};

// The exponent e of a V tile's power of two 2^e (max over the tile's KEYS (64 or 32) scales = m·2^e, m in [0.5, 1); 0
// for a tile of zero or NaN scales): every lane of the warp calls it, and every warp of the block gets the same.
template <int KEYS = kBlockKeys>
__device__ __forceinline__ int i16_tile_exponent(const float* scales, int lane) {
  static_assert(KEYS == 64 || KEYS == 32, "a lane's scale or two");
  float mx = fmaxf(0.0f, scales[lane]);
  if constexpr (KEYS == 64) mx = fmaxf(mx, scales[lane + 32]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  int e = 0;
  if (mx > 0.0f) frexpf(mx, &e);
  return e;
}

// The output accumulators from units of 2^e_cur to units of 2^e (the next V tile's power of two); e_cur becomes e.
// HALVES = 1: rows g only (o[n][0..1]; the stacked rows g + 8 are 0 here).
template <int NT, int HALVES = 2>
__device__ __forceinline__ void i16_rescale_o(float (&o)[NT][4], int& e_cur, int e) {
  if (e == e_cur) return;
  const int k = e_cur - e;
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int i = 0; i < 2 * HALVES; ++i) o[n][i] = pow2_scale(o[n][i], k);
  e_cur = e;
}

// Each score of this thread (columns 8n + 2qd + e of the slice) times its key's K scale (k_scales: the slice's first).
template <int SN>
__device__ __forceinline__ void i16_scale_scores(float (&s)[SN][4], const float* k_scales, int qd) {
#pragma unroll
  for (int n = 0; n < SN; ++n) {
    const float2 sc = *reinterpret_cast<const float2*>(k_scales + 8 * n + 2 * qd);
    s[n][0] *= sc.x;
    s[n][1] *= sc.y;
    s[n][2] *= sc.x;
    s[n][3] *= sc.y;
  }
}

// One online-softmax step for a warp's 16 rows (this thread: rows g and g+8, hf = 0/1) over SN·8 new scores s (raw
// q·k, −inf where masked). m: running raw max; l: this thread's partial row sum (its own columns; the 4 threads of a
// row are summed at the end); o: the output accumulators, rescaled. On return s holds p = 2^(s·sl − m·sl).
// HALVES = 1: rows g only (the i16 decode's stacked rows, whose rows g + 8 hold no query: their scores −inf and their
// accumulators 0, so the step would leave m = −inf, l = 0 and o = 0 as they are; s's rows g + 8 stay −inf, not p:
// accumulate_pv_i16<STACK> reads rows g only); or rows g + 8 that hold no query row at all (decode_tile's SKIP), whose
// m, l, o and s are then left as they are and read by nothing.
template <int SN, int NT, int HALVES = 2>
__device__ __forceinline__ void online_softmax(float (&s)[SN][4], float (&m)[2], float (&l)[2], float (&o)[NT][4],
                                               float sl) {
#pragma unroll
  for (int hf = 0; hf < HALVES; ++hf) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < SN; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * hf], s[n][2 * hf + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[hf], mx);
    const float base = m_new == -INFINITY ? 0.0f : m_new * sl;  // a row with no key yet: everything stays 0
    const float corr = exp2f(m[hf] * sl - base);                 // 0 when m was −inf
    m[hf] = m_new;
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < SN; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = exp2f(fmaf(s[n][2 * hf + e], sl, -base));
        s[n][2 * hf + e] = p;
        sum += p;
      }
    }
    l[hf] = l[hf] * corr + sum;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      o[n][2 * hf] *= corr;
      o[n][2 * hf + 1] *= corr;
    }
  }
}

// Per-lane byte offsets for ldmatrix over swizzled tiles. A logical chunk c = 8·hi + lo (lo < 8) of row r sits at
// r·2·DH + 128·hi + 16·(lo ^ (r & 7)); the lanes' rows are ≡ lane (mod 8) in every use below, so the lane-dependent
// part only depends on lo, and the 4 even values of lo give 4 base offsets; the rest are immediates.
template <int DH>
struct LdmOffsets {
  uint32_t base[4];
  // rows: row0 + (lane & 7) + 8·row_bit; chunk low part: 2·i + chunk_bit, i < 4.
  __device__ __forceinline__ LdmOffsets(int row0, int lane, int row_bit, int chunk_bit) {
    const int r = row0 + (lane & 7) + 8 * row_bit;
#pragma unroll
    for (int i = 0; i < 4; ++i) base[i] = uint32_t(r * DH * 2 + (((2 * i + chunk_bit) ^ (r & 7)) << 4));
  }
  // Offset of the 8×8 matrix at logical chunk 2·k (k < DH/16) and `rows` rows further down (a multiple of 8).
  __device__ __forceinline__ uint32_t at(int k, int rows) const {
    return base[k & 3] + uint32_t((k >> 2) * 128 + rows * DH * 2);
  }
};

// S[16 rows][SN·8 keys] = Q[rows q_row0..+15] · K[keys k_row0..]ᵀ over DH dims (both swizzled 16-bit tiles in smem).
template <int DH, int SN, bool F16>
__device__ __forceinline__ void scores_qk(float (&s)[SN][4], uint32_t sq, int q_row0, uint32_t sk, int k_row0,
                                          int lane) {
  // Q matrices: (rows 0-7, dims 16kk..+7), (rows 8-15, same), (rows 0-7, dims +8..+15), (rows 8-15, +8..)
  const LdmOffsets<DH> qo(q_row0, lane, (lane >> 3) & 1, lane >> 4);
  // K matrices: (keys 16p+0-7, dims 16kk..+7), (same keys, +8..+15), (keys 16p+8-15, 16kk..), (keys +8-15, +8..)
  const LdmOffsets<DH> ko(k_row0, lane, lane >> 4, (lane >> 3) & 1);
#pragma unroll
  for (int n = 0; n < SN; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < DH / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4(a, sq + qo.at(kk, 0));
#pragma unroll
    for (int p = 0; p < SN / 2; ++p) {
      uint32_t b[4];
      ldmatrix_x4(b, sk + ko.at(kk, 16 * p));
      mma16<F16>(s[2 * p], a, b[0], b[1]);
      mma16<F16>(s[2 * p + 1], a, b[2], b[3]);
    }
  }
}

// O[16 rows][DH] += P[16 rows][SN·8 keys] · V[keys v_row0..][DH], P from the score accumulators (rounded to 16 bits).
template <int DH, int SN, bool F16>
__device__ __forceinline__ void accumulate_pv(float (&o)[DH / 8][4], const float (&p)[SN][4], uint32_t sv, int v_row0,
                                              int lane) {
  // .trans matrices: (keys 0-7, dims 16np..+7), (keys 8-15, same dims), (keys 0-7, dims +8..), (keys 8-15, +8..)
  const LdmOffsets<DH> vo(v_row0, lane, (lane >> 3) & 1, lane >> 4);
#pragma unroll
  for (int kk = 0; kk < SN / 2; ++kk) {
    uint32_t a[4];
    a[0] = pack16<F16>(p[2 * kk][0], p[2 * kk][1]);
    a[1] = pack16<F16>(p[2 * kk][2], p[2 * kk][3]);
    a[2] = pack16<F16>(p[2 * kk + 1][0], p[2 * kk + 1][1]);
    a[3] = pack16<F16>(p[2 * kk + 1][2], p[2 * kk + 1][3]);
#pragma unroll
    for (int np = 0; np < DH / 16; ++np) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, sv + vo.at(np, 16 * kk));
      mma16<F16>(o[2 * np], a, b[0], b[1]);
      mma16<F16>(o[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// scores_qk over hi + lo planes (the i16 cache's prefill): Q hi at sq, lo at sq + q_lo; an i16 K tile (I16Tile) at sk,
// whose rows' integers the pairs hold exactly. S = Qhi·Khi + Qhi·Klo + Qlo·Khi, in that order for every 16 dims, fp32
// accumulators; not yet times the keys' scales (i16_scale_scores).
template <int DH, int SN>
__device__ __forceinline__ void scores_qk_split(float (&s)[SN][4], uint32_t sq, uint32_t q_lo, int q_row0, uint32_t sk,
                                                int k_row0, int lane) {
  constexpr uint32_t k_lo = I16Tile<DH>::kPlane;
  const LdmOffsets<DH> qo(q_row0, lane, (lane >> 3) & 1, lane >> 4);
  const LdmOffsets<DH> ko(k_row0, lane, lane >> 4, (lane >> 3) & 1);
#pragma unroll
  for (int n = 0; n < SN; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < DH / 16; ++kk) {
    uint32_t ah[4], al[4];
    ldmatrix_x4(ah, sq + qo.at(kk, 0));
    ldmatrix_x4(al, sq + q_lo + qo.at(kk, 0));
#pragma unroll
    for (int p = 0; p < SN / 2; ++p) {
      uint32_t bh[4], bl[4];
      ldmatrix_x4(bh, sk + ko.at(kk, 16 * p));
      ldmatrix_x4(bl, sk + k_lo + ko.at(kk, 16 * p));
      mma16<true>(s[2 * p], ah, bh[0], bh[1]);
      mma16<true>(s[2 * p], ah, bl[0], bl[1]);
      mma16<true>(s[2 * p], al, bh[0], bh[1]);
      mma16<true>(s[2 * p + 1], ah, bh[2], bh[3]);
      mma16<true>(s[2 * p + 1], ah, bl[2], bl[3]);
      mma16<true>(s[2 * p + 1], al, bh[2], bh[3]);
    }
  }
}

// out = O / l · sigmoid(gate) for this thread's rows t_first and t_first + 8 of query head h (those past d.T dropped):
// l summed over the 4 threads of a row; o the accumulators of the DH / 8 column tiles of 8 (this thread's columns
// 8n + 2qd, + 1). The epilogue of both prefill kernels.
template <int DH>
__device__ __forceinline__ void store_output(const float (&o)[DH / 8][4], const float (&l)[2], const float* qg,
                                             float* out, const AttnDims& d, int h, int64_t t_first, int qd) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float lt = l[hf];
    lt += __shfl_xor_sync(0xffffffffu, lt, 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    const float inv = 1.0f / lt;
    const int64_t t = t_first + 8 * hf;
    if (t < d.T) {
      const float* gate = qg + (t * d.Hq + h) * 2 * DH + DH;
      float* dst = out + (t * d.Hq + h) * DH;
#pragma unroll
      for (int n = 0; n < DH / 8; ++n) {
        const int col = 8 * n + 2 * qd;
        const float2 gv = *reinterpret_cast<const float2*>(gate + col);
        *reinterpret_cast<float2*>(dst + col) =
            make_float2(o[n][2 * hf] * inv * sigmoidf(gv.x), o[n][2 * hf + 1] * inv * sigmoidf(gv.y));
      }
    }
  }
}

// The A fragments (fp16 hi + lo, split2_f16) of keys 16kk..16kk + 15 of the weights p (the C fragments of SN key
// tiles of 8), each times its key's scale over 2^e (scales: the tile's keys' scales from its first key): this
// thread's keys 16kk + 2qd + {0, 1} (p[2kk]) and 16kk + 8 + 2qd + {0, 1} (p[2kk + 1]).
template <int SN>
__device__ __forceinline__ void split_scaled_weights(const float (&p)[SN][4], const float* scales, int e, int kk,
                                                     int qd, uint32_t (&ah)[4], uint32_t (&al)[4]) {
  const float2 f0 = *reinterpret_cast<const float2*>(scales + 16 * kk + 2 * qd);
  const float2 f1 = *reinterpret_cast<const float2*>(scales + 16 * kk + 8 + 2 * qd);
  const float w00 = pow2_scale(f0.x, -e), w01 = pow2_scale(f0.y, -e);
  const float w10 = pow2_scale(f1.x, -e), w11 = pow2_scale(f1.y, -e);
  split2_f16(p[2 * kk][0] * w00, p[2 * kk][1] * w01, ah[0], al[0]);
  split2_f16(p[2 * kk][2] * w00, p[2 * kk][3] * w01, ah[1], al[1]);
  split2_f16(p[2 * kk + 1][0] * w10, p[2 * kk + 1][1] * w11, ah[2], al[2]);
  split2_f16(p[2 * kk + 1][2] * w10, p[2 * kk + 1][3] * w11, ah[3], al[3]);
}

// accumulate_pv over an i16 V tile (I16Tile at sv; v_scales: its scales from key v_row0): each weight p times its
// key's scale over 2^e (e: i16_tile_exponent; o counts in units of 2^e), as fp16 hi + lo pairs (split2_f16), against
// the rows' integers. O += Phi·Vhi + Phi·Vlo + Plo·Vhi, in that order for every 16 keys.
template <int DH, int SN>
__device__ __forceinline__ void accumulate_pv_split(float (&o)[DH / 8][4], const float (&p)[SN][4], uint32_t sv,
                                                    const float* v_scales, int e, int v_row0, int lane) {
  constexpr uint32_t v_lo = I16Tile<DH>::kPlane;
  const int qd = lane & 3;
  const LdmOffsets<DH> vo(v_row0, lane, (lane >> 3) & 1, lane >> 4);
#pragma unroll
  for (int kk = 0; kk < SN / 2; ++kk) {
    uint32_t ah[4], al[4];
    split_scaled_weights<SN>(p, v_scales, e, kk, qd, ah, al);
#pragma unroll
    for (int np = 0; np < DH / 16; ++np) {
      uint32_t bh[4], bl[4];
      ldmatrix_x4_trans(bh, sv + vo.at(np, 16 * kk));
      ldmatrix_x4_trans(bl, sv + v_lo + vo.at(np, 16 * kk));
      mma16<true>(o[2 * np], ah, bh[0], bh[1]);
      mma16<true>(o[2 * np], ah, bl[0], bl[1]);
      mma16<true>(o[2 * np], al, bh[0], bh[1]);
      mma16<true>(o[2 * np + 1], ah, bh[2], bh[3]);
      mma16<true>(o[2 * np + 1], ah, bl[2], bl[3]);
      mma16<true>(o[2 * np + 1], al, bh[2], bh[3]);
    }
  }
}

// Masks (−inf) the scores of keys past each row's last visible key. rel_limit[hf]: that key minus the first key of
// the slice (clamped to [-1, SN·8]); this thread's columns are 8n + 2c + e.
template <int SN>
__device__ __forceinline__ void mask_scores(float (&s)[SN][4], const int (&rel_limit)[2], int qd) {
#pragma unroll
  for (int n = 0; n < SN; ++n)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (8 * n + 2 * qd + e > rel_limit[hf]) s[n][2 * hf + e] = -INFINITY;
}

__device__ __forceinline__ int clamp_rel(int64_t x, int hi) { return x < -1 ? -1 : x > hi ? hi : int(x); }

// This thread's share (of NTH threads) of copying rows [0, 64) of a [rows][DH] 16-bit tile from global (row stride
// DH) into a swizzled smem tile: rows tid/CH + i·(NTH/CH), chunk tid%CH. Rows >= valid_rows are zero-filled, not read.
template <int DH, int NTH = 128>
__device__ __forceinline__ void copy_tile_async(uint32_t dst, const uint16_t* src, int valid_rows, int tid) {
  constexpr int CH = DH / 8, RP = NTH / CH;
  const int c = tid % CH, r0 = tid / CH;
  const uint16_t* s = src + r0 * DH + c * 8;
#pragma unroll
  for (int i = 0; i < kBlockKeys / RP; ++i) {
    const int r = r0 + i * RP;
    cp_async_16(dst + swz<DH>(r, c), s + i * RP * DH, r < valid_rows ? 16u : 0u);
  }
}

// copy_tile_async for an fp8 cache: this thread's share of rows [0, 64) of an e4m3 tile (row stride DH bytes, `scale`
// the rows' scales) dequantised to fp16 (dequant8_f16) into the same swizzled 16-bit smem tile at `dst` (a generic
// pointer): 16 values a load, rows tid/CH + i·(128/CH), chunks 2·(tid%CH) and +1. Rows >= valid_rows are zero-filled,
// not read. Plain loads and stores, each thread's loads issued before its first store; the callers' cp_async waits
// (of nothing) and __syncthreads order them as they order the copies.
template <int DH>
__device__ __forceinline__ void copy_tile_fp8(uint8_t* dst, const uint8_t* src, const float* scale, int valid_rows,
                                              int tid) {
  constexpr int CH = DH / 16, RP = 128 / CH, N = kBlockKeys / RP;
  const int c = tid % CH, r0 = tid / CH;
  uint4 raw[N];
  float sc[N];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int r = r0 + i * RP;
    raw[i] = make_uint4(0u, 0u, 0u, 0u);
    sc[i] = 0.0f;
    if (r < valid_rows) {
      raw[i] = *reinterpret_cast<const uint4*>(src + int64_t(r) * DH + 16 * c);
      sc[i] = scale[r];
    }
  }
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int r = r0 + i * RP;
    *reinterpret_cast<uint4*>(dst + swz<DH>(r, 2 * c)) = dequant8_f16(raw[i].x, raw[i].y, sc[i]);
    *reinterpret_cast<uint4*>(dst + swz<DH>(r, 2 * c + 1)) = dequant8_f16(raw[i].z, raw[i].w, sc[i]);
  }
}

// 8 fp32 values at src -> this chunk's hi and lo planes (the i16 cache's q rows).
__device__ __forceinline__ void load8_split(const float* src, uint4& hi, uint4& lo) {
  const float4 a = reinterpret_cast<const float4*>(src)[0], b = reinterpret_cast<const float4*>(src)[1];
  const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  split8_f16(v, hi, lo);
}

}  // namespace
}  // namespace tern::cuda
