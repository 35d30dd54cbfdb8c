// Device helpers of the one-token integer (dp4a) products: qmv_dp4a.cu and the MoE kernels' T = 1 path
// (moe_dp4a.cu). Included by .cu files only.
//
// Activations: per group of 64 columns, m = max|x|, v = rint(x·(32639/m)) (16-bit), σ = m/32639, v = 256·hi + lo
// with hi, lo int8. For one 4-bit word (8 columns, nibbles LSB first) the activations are kept as
//   {even hi, odd hi, even lo, odd lo}: int8x4 of columns 0,2,4,6 / 1,3,5,7 (a uint4),
// so that w & 0x0F0F0F0F (even nibbles as bytes) and (w >> 4) & 0x0F0F0F0F (odd) meet them in four dp4a; Σ q·v of a
// group is exact in int32 and the group adds s·σ·Σq·v + b·σ·Σv in fp32.
//
// Wide (24-bit) activations, for the products whose inputs' rounding shows in the model's output: v = rint(x·(8355711/m))
// = 65536·hi + 256·mid + lo (int8 each), kept as {even hi, odd hi, even mid, odd mid} (a uint4) and {even lo, odd lo}
// (a uint2); six dp4a per word. The error per element is at most m/16.7M (16-bit: m/65278), below fp32 rounding of
// the sums; on weights at trained scales the 16-bit products' error alone moved the one-token decode's mean KL
// against transformers from 1e-5 to 1.4e-3 (docs/benchmarks.md).
//
// A group with m < 2^-100 (kMinGroupMax: all zeros, denormals, or values so small that Q/m would overflow fp32, as it
// does below ~2.5e-32 for the wide form and ~9.6e-35 for the 16-bit one, and σ would be denormal) quantises to v = 0
// with σ = m/Q, finite. Its values are dropped (each below 2^-100: no sum that holds a normal value keeps them; with
// the RMSNorm prologue the output's factor is at most 1/sqrt(eps)); every group at or above it has Q/m finite and σ
// normal.
#pragma once

#include <cstdint>

namespace tern::cuda::dp4a {

constexpr float kQMax = 32639.0f;  // |v| ≤ 32639 keeps hi = (v + 128) >> 8 within [-127, 127]
constexpr float kQMaxWide = 8355711.0f;  // 127·(65536 + 256 + 1): hi, mid and lo all within int8
constexpr int kQMaxWideInt = 8355711;
constexpr float kMinGroupMax = 0x1p-100f;  // groups with a smaller max|x| quantise to zeros (see above)
template <bool kWide>
__host__ __device__ constexpr float qmax() { return kWide ? kQMaxWide : kQMax; }

// Q/m, the factor that maps the group's x onto the integers; 0 (every v = 0) when m < kMinGroupMax.
__device__ __forceinline__ float quant_factor(float m, float q) { return m >= kMinGroupMax ? q / m : 0.0f; }

__device__ __forceinline__ uint32_t pack_bytes(int a, int b, int c, int d) {
  return (uint32_t(a) & 0xffu) | ((uint32_t(b) & 0xffu) << 8) | ((uint32_t(c) & 0xffu) << 16) | (uint32_t(d) << 24);
}

// max|v| over the 8 columns of this lane and the 7 other lanes of its group of 64 (lane & ~7 .. + 7).
__device__ __forceinline__ float group_max(const float v[8]) {
  float m = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) m = fmaxf(m, fabsf(v[e]));
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
  return fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
}

// Quantises the 8 columns v of one word; the 8 consecutive lanes (lane & ~7 .. + 7, all 32 lanes must call) are one
// group of 64. Returns the word's {even hi, odd hi, even lo, odd lo}; sumv = Σv of the word, m = the group's max|x|.
__device__ __forceinline__ uint4 quantize_word(const float v[8], int& sumv, float& m) {
  m = group_max(v);
  const float inv = quant_factor(m, kQMax);
  int hi[8], lo[8];
  sumv = 0;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const int q = max(-32639, min(32639, __float2int_rn(v[e] * inv)));
    sumv += q;
    hi[e] = (q + 128) >> 8;
    lo[e] = q - (hi[e] << 8);
  }
  return make_uint4(pack_bytes(hi[0], hi[2], hi[4], hi[6]), pack_bytes(hi[1], hi[3], hi[5], hi[7]),
                    pack_bytes(lo[0], lo[2], lo[4], lo[6]), pack_bytes(lo[1], lo[3], lo[5], lo[7]));
}

// The wide form of quantize_word: returns {even hi, odd hi, even mid, odd mid}, lo = {even lo, odd lo}.
__device__ __forceinline__ uint4 quantize_word_wide(const float v[8], int& sumv, float& m, uint2& lo_bytes) {
  m = group_max(v);
  const float inv = quant_factor(m, kQMaxWide);
  int hi[8], mid[8], lo[8];
  sumv = 0;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const int q = max(-kQMaxWideInt, min(kQMaxWideInt, __float2int_rn(v[e] * inv)));
    sumv += q;
    lo[e] = ((q + 128) & 255) - 128;  // q − lo is a multiple of 256
    const int r = (q - lo[e]) >> 8;
    mid[e] = ((r + 128) & 255) - 128;
    hi[e] = (r - mid[e]) >> 8;
  }
  lo_bytes = make_uint2(pack_bytes(lo[0], lo[2], lo[4], lo[6]), pack_bytes(lo[1], lo[3], lo[5], lo[7]));
  return make_uint4(pack_bytes(hi[0], hi[2], hi[4], hi[6]), pack_bytes(hi[1], hi[3], hi[5], hi[7]),
                    pack_bytes(mid[0], mid[2], mid[4], mid[6]), pack_bytes(mid[1], mid[3], mid[5], mid[7]));
}

// Shared-memory slot of activation word w: w XOR bits 3..4 of w. The one-token kernels read, per instruction, word
// 4·lane + k of a slice (qmv, gate_up: 64 bytes apart) or 2·lane + e (down: 32 bytes apart); in order, 4 or 2 lanes of
// each quarter-warp would hit the same banks. With the XOR the 8 lanes of a quarter-warp read 8 distinct 16-byte bank
// groups, and the writers (thread t, word t) stay conflict-free: the XOR permutes each aligned run of 8 words.
__device__ __forceinline__ int xs_slot(int w) { return w ^ ((w >> 3) & 3); }

// Passes of quantize_block for `words` words over blocks of `threads` threads.
constexpr int quantize_passes(int words, int threads) { return (words + threads - 1) / threads; }

// The whole block quantises x [words·8] (16-byte aligned) into shared memory: xs[xs_slot(w)] (the word's activations),
// xsum[w] (its Σv), xsig[w / 8] (σ of each group of 8 words). Thread t takes words t, t + blockDim.x, ... (P passes,
// words ≤ P·blockDim.x); whole warps run each pass (quantize_word's shuffles). Every pass's loads are issued before
// the first word is quantised: one L2 round trip, not P. With scale (norm_w, [words·8]) the block quantises x·scale
// and each thread adds its Σx² to ss, pass by pass (the RMSNorm factor is applied to the output by the caller). Ends
// without a barrier: __syncthreads() before reading xs. kWide: 24-bit activations, the lo bytes in xs_lo[xs_slot(w)].
template <int P, bool kWide = false>
__device__ __forceinline__ void quantize_block(const float* x, const float* scale, int words, uint4* xs, int* xsum,
                                               float* xsig, float& ss, uint2* xs_lo = nullptr) {
  float4 a[P], b[P], n0[P], n1[P];
#pragma unroll
  for (int pass = 0; pass < P; ++pass) {
    const int word = int(threadIdx.x) + pass * int(blockDim.x);
    a[pass] = b[pass] = n0[pass] = n1[pass] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (word < words) {
      a[pass] = reinterpret_cast<const float4*>(x)[2 * word];
      b[pass] = reinterpret_cast<const float4*>(x)[2 * word + 1];
      if (scale) {
        n0[pass] = reinterpret_cast<const float4*>(scale)[2 * word];
        n1[pass] = reinterpret_cast<const float4*>(scale)[2 * word + 1];
      }
    }
  }
#pragma unroll
  for (int pass = 0; pass < P; ++pass) {
    const int word = int(threadIdx.x) + pass * int(blockDim.x);
    if (pass * int(blockDim.x) >= words) break;  // uniform over the block: whole warps stay together
    const bool has = word < words;
    float v[8] = {a[pass].x, a[pass].y, a[pass].z, a[pass].w, b[pass].x, b[pass].y, b[pass].z, b[pass].w};
    if (has && scale) {
      const float n[8] = {n0[pass].x, n0[pass].y, n0[pass].z, n0[pass].w, n1[pass].x, n1[pass].y, n1[pass].z, n1[pass].w};
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        ss += v[e] * v[e];
        v[e] *= n[e];
      }
    }
    int sumv = 0;
    float m = 0.0f;
    uint2 lo = make_uint2(0u, 0u);
    const uint4 q = kWide ? quantize_word_wide(v, sumv, m, lo) : quantize_word(v, sumv, m);
    if (has) {
      xs[xs_slot(word)] = q;
      if constexpr (kWide) xs_lo[xs_slot(word)] = lo;
      xsum[word] = sumv;
      if ((word & 7) == 0) xsig[word / 8] = m / qmax<kWide>();
    }
  }
}

// Σ q·v over one word's 8 columns, as the hi and lo partial sums (dh·256 + dl is the exact dot).
__device__ __forceinline__ void dot_word(uint32_t w, const uint4& x, int& dh, int& dl) {
  const int ev = int(w & 0x0F0F0F0Fu), od = int((w >> 4) & 0x0F0F0F0Fu);
  dh = __dp4a(ev, int(x.x), dh);
  dh = __dp4a(od, int(x.y), dh);
  dl = __dp4a(ev, int(x.z), dl);
  dl = __dp4a(od, int(x.w), dl);
}

// The wide form: Σ q·v = (dh·256 + dm)·256 + dl (x: hi and mid as in dot_word, lo: the lo bytes).
__device__ __forceinline__ void dot_word_wide(uint32_t w, const uint4& x, const uint2& lo, int& dh, int& dm, int& dl) {
  const int ev = int(w & 0x0F0F0F0Fu), od = int((w >> 4) & 0x0F0F0F0Fu);
  dh = __dp4a(ev, int(x.x), dh);
  dh = __dp4a(od, int(x.y), dh);
  dm = __dp4a(ev, int(x.z), dm);
  dm = __dp4a(od, int(x.w), dm);
  dl = __dp4a(ev, int(lo.x), dl);
  dl = __dp4a(od, int(lo.y), dl);
}

// bf16 scale (low half) and bias (high half) of a packed pair.
__device__ __forceinline__ float scale_of(uint32_t sb) { return __uint_as_float(sb << 16); }
__device__ __forceinline__ float bias_of(uint32_t sb) { return __uint_as_float(sb & 0xffff0000u); }

}  // namespace tern::cuda::dp4a
