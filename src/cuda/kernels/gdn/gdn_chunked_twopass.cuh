// The two-pass kernels of gdn_chunked (GdnChunkedKernel::twopass_tf32x3, twopass_mixed; dk = dv = 128, chunk 64),
// built on the tf32 mma.sync helpers of gdn_chunked_tc.cuh. Device code of one translation unit, kept in its own file
// for size: included by gdn_prefill.cu only (hence the anonymous namespace).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/kernels/gdn/gdn.cuh"
#include "cuda/kernels/gdn/gdn_chunked_tc.cuh"

namespace tern::cuda {
namespace {

// ---- chunked form in two passes (dk = dv = 128, chunk 64): chunk-parallel WY preparation, then the recurrence ------
// Pass 1 (gdn_wy_prep_kernel), one block per (v-head h, chunk), all chunks at once. With G the in-chunk cumulative
// log decay, β zero past the chunk's n tokens and K, Q, V zero there:
//   A[t,s] = β_t e^{G_t−G_s} k_t·k_s (s < t),  T = (I + A)⁻¹,
//   W = T·(β e^{G} ⊙ K),  U = T·(β ⊙ V),  P[t,s] = e^{G_t−G_s} q_t·k_s (s ≤ t)
// written to the workspace (fp32) with e^{G_t} and e^{G_{n−1}−G_t} (0 past n).
// Pass 2 (gdn_wy_seq_kernel), one block per (v-head, 32 value rows) walking the chunks in order, the state slice in
// registers (fp32 master) and in shared memory as tf32 hi/lo (the B operand of the next chunk):
//   V' = U − W·S₀ᵀ,  O = e^{G} ⊙ Q·S₀ᵀ + P·V',  Sᵀ ← e^{G_{n−1}} Sᵀ + (e^{G_{n−1}−G} ⊙ V')ᵀ·K.
// The next chunk's operands stream in with cp.async while the current one is processed.
namespace wy {

constexpr int kL = 64, kDk = 128, kDv = 128, kThreads = 256, kBV = 32;
constexpr int kLdA = kDk + 4;  // rows read as row-major A / n-major B fragments: 32 distinct banks
constexpr int kLdB = kDk + 8;  // rows read as k-major B fragments: 32 distinct banks
constexpr int kLdL = kL + 4;   // 64-wide row-major A operands (A, T, P)
constexpr int kLdV = kBV + 8;  // V' slice: k-major B and column-major A fragments conflict-free

// Workspace: [W: Hv·nc·64·128 | U: Hv·nc·64·128 | P: Hv·nc·64·64 | gates: Hv·nc·128] floats for nc chunks.
__host__ __device__ constexpr size_t chunk_floats_per_head() { return size_t(kL) * kDk + size_t(kL) * kDv + size_t(kL) * kL + 2 * kL; }
struct WsView {
  float *W, *U, *P, *gates;
};
__host__ __device__ inline WsView ws_view(float* ws, int Hv, int nc) {
  const size_t hc = size_t(Hv) * size_t(nc);
  WsView v;
  v.W = ws;
  v.U = v.W + hc * kL * kDk;
  v.P = v.U + hc * kL * kDv;
  v.gates = v.P + hc * kL * kL;
  return v;
}

constexpr size_t prep_smem_floats() { return size_t(kL) * kLdA + size_t(kL) * kLdB + 2 * size_t(kL) * kLdL + 5 * kL; }
constexpr size_t seq_smem_floats() {
  return 2 * size_t(kL) * kLdA + 2 * size_t(kL) * kLdB + 2 * size_t(kL) * kLdL + 2 * size_t(kL) * kLdV +
         2 * size_t(kBV) * kLdA + 2 * 2 * kL;
}

// cp.async.wait_group 0 with the 0 in the string: the wait of cp_async_wait<0>() (common/ptx.cuh, the 0 an "n"
// operand), kept here because that form moves an instruction across the wait in gdn_prefill.cu's code.
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

template <bool kSplit>
__device__ __forceinline__ void split(float v, uint32_t& hi, uint32_t& lo) {
  hi = tc::tf32_bits(v);
  lo = kSplit ? tc::tf32_bits(v - __uint_as_float(hi)) : 0u;
}

// Fragments (m16n8k8 tf32): lane (g = lane/4, t = lane%4). A: (g,t) (g+8,t) (g,t+4) (g+8,t+4); B: (k=t, n=g), (t+4, g).
// A rows 0..15, columns k0..k0+7 of a row-major X[m·ld + k].
template <bool kSplit>
__device__ __forceinline__ void lda_rm(uint32_t (&hi)[4], uint32_t (&lo)[4], const float* X, int ld, int k0) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  split<kSplit>(X[g * ld + k0 + t], hi[0], lo[0]);
  split<kSplit>(X[(g + 8) * ld + k0 + t], hi[1], lo[1]);
  split<kSplit>(X[g * ld + k0 + t + 4], hi[2], lo[2]);
  split<kSplit>(X[(g + 8) * ld + k0 + t + 4], hi[3], lo[3]);
}
// A from a column-major X[k·ld + m], each column k scaled by scale[k].
template <bool kSplit>
__device__ __forceinline__ void lda_cm(uint32_t (&hi)[4], uint32_t (&lo)[4], const float* X, int ld, int k0,
                                       const float* scale) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const float s0 = scale[k0 + t], s1 = scale[k0 + t + 4];
  split<kSplit>(s0 * X[(k0 + t) * ld + g], hi[0], lo[0]);
  split<kSplit>(s0 * X[(k0 + t) * ld + g + 8], hi[1], lo[1]);
  split<kSplit>(s1 * X[(k0 + t + 4) * ld + g], hi[2], lo[2]);
  split<kSplit>(s1 * X[(k0 + t + 4) * ld + g + 8], hi[3], lo[3]);
}
// B rows k0..k0+7, columns 0..7 of B(k, n) = X[n·ld + k] (n-major).
template <bool kSplit>
__device__ __forceinline__ void ldb_nm(uint32_t (&hi)[2], uint32_t (&lo)[2], const float* X, int ld, int k0) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  split<kSplit>(X[g * ld + k0 + t], hi[0], lo[0]);
  split<kSplit>(X[g * ld + k0 + t + 4], hi[1], lo[1]);
}
// The same from pre-split tf32 hi / lo arrays.
__device__ __forceinline__ void ldb_nm_pre(uint32_t (&hi)[2], uint32_t (&lo)[2], const float* Xh, const float* Xl,
                                           int ld, int k0) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  hi[0] = __float_as_uint(Xh[g * ld + k0 + t]);
  hi[1] = __float_as_uint(Xh[g * ld + k0 + t + 4]);
  lo[0] = __float_as_uint(Xl[g * ld + k0 + t]);
  lo[1] = __float_as_uint(Xl[g * ld + k0 + t + 4]);
}
// B(k, n) = X[k·ld + n] (k-major), row k scaled by scale[k] when scale is given.
template <bool kSplit>
__device__ __forceinline__ void ldb_km(uint32_t (&hi)[2], uint32_t (&lo)[2], const float* X, int ld, int k0,
                                       const float* scale) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  float v0 = X[(k0 + t) * ld + g], v1 = X[(k0 + t + 4) * ld + g];
  if (scale) {
    v0 *= scale[k0 + t];
    v1 *= scale[k0 + t + 4];
  }
  split<kSplit>(v0, hi[0], lo[0]);
  split<kSplit>(v1, hi[1], lo[1]);
}

// big += a_hi·b_hi; with kSplit also small += a_lo·b_hi + a_hi·b_lo (3xTF32; the two chains run independently).
template <bool kSplit>
__device__ __forceinline__ void mma3(float (&big)[4], float (&small)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                     const uint32_t (&bh)[2], const uint32_t (&bl)[2]) {
  if constexpr (kSplit) {
    tc::mma_tf32(small, al, bh);
    tc::mma_tf32(small, ah, bl);
  }
  tc::mma_tf32(big, ah, bh);
}

__device__ __forceinline__ int frow(int r) { return ((threadIdx.x & 31) >> 2) + 8 * (r >> 1); }
__device__ __forceinline__ int fcol(int r) { return 2 * (threadIdx.x & 3) + (r & 1); }

// One 16×16 block (rows of X, rows of Y) of X·Yᵀ over kDk, both row-major with ld kLdA.
template <bool kSplit>
__device__ __forceinline__ void gram16(float (&acc)[2][4], const float* X, const float* Y) {
  float big[2][4] = {}, small[2][4] = {};
#pragma unroll 4
  for (int ks = 0; ks < kDk / 8; ++ks) {
    uint32_t ah[4], al[4];
    lda_rm<kSplit>(ah, al, X, kLdA, 8 * ks);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      uint32_t bh[2], bl[2];
      ldb_nm<kSplit>(bh, bl, Y + 8 * nt * kLdA, kLdA, 8 * ks);
      mma3<kSplit>(big[nt], small[nt], ah, al, bh, bl);
    }
  }
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[nt][r] = big[nt][r] + small[nt][r];
}

// sT = (I + sA)⁻¹ for a strictly lower-triangular 64×64 sA (both [64][kLdL]; only the lower 16×16 blocks of sT are
// written): diagonal blocks by forward substitution in fp32, then T_ij = −T_ii Σ_{k=j}^{i−1} A_ik T_kj level by level
// (3xTF32). Called by the whole block; ends with a barrier.
__device__ void invert_unit_lower(const float* sA, float* sT) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp < 4) {  // warp b: block b; lane: column c = lane%16, half = lane/16 sums every other s
    const int b = warp, c = lane & 15, half = lane >> 4;
    const float* Ab = sA + 16 * b * kLdL + 16 * b;
    float x[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      float sum = 0.0f;
#pragma unroll
      for (int s2 = 0; s2 < r; ++s2)
        if ((s2 & 1) == half) sum += Ab[r * kLdL + s2] * x[s2];
      sum += __shfl_xor_sync(0xffffffffu, sum, 16);
      x[r] = (r == c ? 1.0f : 0.0f) - sum;
    }
    float* Tb = sT + 16 * b * kLdL + 16 * b;
#pragma unroll
    for (int r = 0; r < 16; ++r)
      if ((r >> 3) == half) Tb[r * kLdL + c] = x[r];
  }
  __syncthreads();
  for (int lev = 1; lev < 4; ++lev) {
    if (warp < 4 - lev) {
      const int j = warp, i = warp + lev;
      float x[2][4] = {};
      for (int kb = j; kb < i; ++kb)
        tc::mma_16x16_kmajor<true>(x, sA + 16 * i * kLdL + 16 * kb, kLdL, sT + 16 * kb * kLdL + 16 * j, kLdL, 2);
      float* Tij = sT + 16 * i * kLdL + 16 * j;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) Tij[frow(r) * kLdL + 8 * nt + fcol(r)] = x[nt][r];
      __syncwarp();
      float y[2][4] = {};
      tc::mma_16x16_kmajor<true>(y, sT + 16 * i * kLdL + 16 * i, kLdL, Tij, kLdL, 2);
      __syncwarp();
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) Tij[frow(r) * kLdL + 8 * nt + fcol(r)] = -y[nt][r];
    }
    __syncthreads();
  }
}

// Pass 1: grid (Hv, nc), 256 threads, prep_smem_floats() of dynamic shared memory (two blocks per SM).
// kOut3x: Q·Kᵀ (P) in 3xTF32 too (else plain tf32; every other product is 3xTF32).
template <bool kOut3x>
__global__ void __launch_bounds__(kThreads, 2) gdn_wy_prep_kernel(const float* qkv, const float* g_log,
                                                                  const float* beta, GdnDims d, float* ws) {
  extern __shared__ __align__(16) float smem[];
  float* sK = smem;               // [kL][kLdA] keys of the chunk (zero past n)
  float* sQV = sK + kL * kLdA;    // [kL][kLdA] queries, then [kL][kLdB] values
  float* sA = sQV + kL * kLdB;    // [kL][kLdL] A (lower blocks)
  float* sT = sA + kL * kLdL;     // [kL][kLdL] (I + A)⁻¹ (lower blocks)
  float* sG = sT + kL * kLdL;     // [kL] cumulative log decay
  float* sB = sG + kL;            // [kL] β (0 past n)
  float* sSc = sB + kL;           // [kL] β e^{G}
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int h = blockIdx.x, c = blockIdx.y, nc = gridDim.y, kh = h / (d.Hv / d.Hk);
  const int64_t c0 = int64_t(c) * kL, C = d.C();
  const int n = int(d.T - c0 < kL ? d.T - c0 : kL);
  const float* qsrc = qkv + c0 * C + int64_t(kh) * kDk;
  const float* ksrc = qsrc + int64_t(d.Hk) * kDk;
  const float* vsrc = qkv + c0 * C + 2LL * d.Hk * kDk + int64_t(h) * kDv;
  const WsView v = ws_view(ws, d.Hv, nc);
  const size_t hc = size_t(h) * nc + c;
  float* W = v.W + hc * kL * kDk;
  float* U = v.U + hc * kL * kDv;
  float* P = v.P + hc * kL * kL;
  float* gates = v.gates + hc * 2 * kL;

  pdl_wait();
  pdl_trigger();
  for (int e = tid; e < kL * kDk / 4; e += kThreads) {
    const int t = e / (kDk / 4), c4 = e % (kDk / 4);
    const bool ok = t < n;
    cp_async_16_if(&sK[t * kLdA + 4 * c4], ok ? ksrc + t * C + 4 * c4 : qkv, ok);
    cp_async_16_if(&sQV[t * kLdA + 4 * c4], ok ? qsrc + t * C + 4 * c4 : qkv, ok);
  }
  cp_async_commit();
  if (warp == 0) {
    float carry = 0.0f;
#pragma unroll
    for (int i = 0; i < kL / 32; ++i) {
      const int t = lane + 32 * i;
      float x = t < n ? g_log[(c0 + t) * d.Hv + h] : 0.0f;
      x = warp_inclusive_sum(x, lane);
      x += carry;
      sG[t] = x;
      sB[t] = t < n ? beta[(c0 + t) * d.Hv + h] : 0.0f;
      carry = __shfl_sync(0xffffffffu, x, 31);
    }
    for (int t = lane; t < kL; t += 32) {  // each lane reads back only the entries it wrote
      const float eg = expf(sG[t]);
      sSc[t] = sB[t] * eg;
      gates[t] = eg;
      gates[kL + t] = t < n ? expf(carry - sG[t]) : 0.0f;
    }
  }
  cp_async_wait_all();
  __syncthreads();

  // Grams: jobs 0..9 the lower 16×16 blocks of A (K·Kᵀ), 10..19 those of P (Q·Kᵀ, straight to the workspace).
  for (int job = warp; job < 20; job += kThreads / 32) {
    const bool is_p = job >= 10;
    const int idx = job % 10, bi = idx < 1 ? 0 : idx < 3 ? 1 : idx < 6 ? 2 : 3, bj = idx - bi * (bi + 1) / 2;
    float acc[2][4];
    if (is_p)
      gram16<kOut3x>(acc, sQV + 16 * bi * kLdA, sK + 16 * bj * kLdA);
    else
      gram16<true>(acc, sK + 16 * bi * kLdA, sK + 16 * bj * kLdA);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int t = 16 * bi + frow(2 * half), s0 = 16 * bj + 8 * nt + fcol(2 * half);
        float y[2];
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int s2 = s0 + q;
          const float x = acc[nt][2 * half + q];
          if (is_p)
            y[q] = (s2 <= t && t < n) ? expf(sG[t] - sG[s2]) * x : 0.0f;
          else
            y[q] = (s2 < t && t < n) ? sB[t] * expf(sG[t] - sG[s2]) * x : 0.0f;
        }
        if (is_p)
          *reinterpret_cast<float2*>(&P[t * kL + s0]) = make_float2(y[0], y[1]);
        else
          *reinterpret_cast<float2*>(&sA[t * kLdL + s0]) = make_float2(y[0], y[1]);
      }
  }
  __syncthreads();  // queries no longer read: the values take their place while T is computed
  for (int e = tid; e < kL * kDv / 4; e += kThreads) {
    const int t = e / (kDv / 4), c4 = e % (kDv / 4);
    const bool ok = t < n;
    cp_async_16_if(&sQV[t * kLdB + 4 * c4], ok ? vsrc + t * C + 4 * c4 : qkv, ok);
  }
  cp_async_commit();
  invert_unit_lower(sA, sT);
  cp_async_wait_all();
  __syncthreads();

  // W = T·(β e^{G} ⊙ K) (warps 0..3) and U = T·(β ⊙ V) (warps 4..7), warp: 32 columns, all 64 rows.
  {
    const bool is_u = warp >= 4;
    const int cg = warp & 3;
    const float* B = (is_u ? sQV : sK) + 32 * cg;
    const int ldb = is_u ? kLdB : kLdA;
    const float* scale = is_u ? sB : sSc;
    float* out = (is_u ? U : W) + 32 * cg;
#pragma unroll 1
    for (int mt = 0; mt < 4; ++mt) {
      float big[4][4] = {}, small[4][4] = {};
      for (int ks = 0; ks < 2 * (mt + 1); ++ks) {
        uint32_t ah[4], al[4];
        lda_rm<true>(ah, al, sT + 16 * mt * kLdL, kLdL, 8 * ks);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          uint32_t bh[2], bl[2];
          ldb_km<true>(bh, bl, B + 8 * nt, ldb, 8 * ks, scale);
          mma3<true>(big[nt], small[nt], ah, al, bh, bl);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int t = 16 * mt + frow(2 * half), col = 8 * nt + fcol(2 * half);
          *reinterpret_cast<float2*>(&out[t * kDk + col]) =
              make_float2(big[nt][2 * half] + small[nt][2 * half], big[nt][2 * half + 1] + small[nt][2 * half + 1]);
        }
    }
  }
}

// Pass 2: grid (dv/32, Hv), 256 threads, seq_smem_floats() of dynamic shared memory (one block per SM).
// kOut3x: Q·Sᵀ and P·V' (the output only) in 3xTF32 too; W·Sᵀ and the state update always are.
// Warp w, phase A: W·Sᵀ for rows 16(w%4).., value columns 16(w/4)..+15 (→ V' in place of U), and the output tiles
//   (rows 16(w%4), columns 16(w/4)..+7) and (rows 16(3 − w%4), columns 16(w/4)+8..+15): Q·Sᵀ, then P·V' in phase B
//   (the causal P·V' work is the same for every warp).
// Phase B: the state tile rows 16(w%2)..+15, key dims 32(w/2)..+31 (held in registers across chunks).
template <bool kOut3x>
__global__ void __launch_bounds__(kThreads, 1) gdn_wy_seq_kernel(const float* qkv, float* state, GdnDims d,
                                                                 const float* ws, float* o) {
  extern __shared__ __align__(16) float smem[];
  float* sW = smem;                  // [kL][kLdA]
  float* sQ = sW + kL * kLdA;        // [kL][kLdA]
  float* sK = sQ + kL * kLdA;        // [2][kL][kLdB]
  float* sP = sK + 2 * kL * kLdB;    // [2][kL][kLdL]
  float* sU = sP + 2 * kL * kLdL;    // [2][kL][kLdV]: U slice, then V' in place
  float* sSh = sU + 2 * kL * kLdV;   // [kBV][kLdA] state slice Sᵀ, tf32 hi
  float* sSl = sSh + kBV * kLdA;     // [kBV][kLdA] tf32 lo
  float* sGt = sSl + kBV * kLdA;     // [2][2·kL] e^{G}, e^{G_{n−1}−G}
  const int tid = threadIdx.x, warp = tid >> 5;
  const int h = blockIdx.y, j0 = blockIdx.x * kBV, kh = h / (d.Hv / d.Hk);
  const int nc = int((d.T + kL - 1) / kL);
  const int64_t C = d.C(), ldo = int64_t(d.Hv) * kDv;
  const float* qsrc = qkv + int64_t(kh) * kDk;
  const float* ksrc = qsrc + int64_t(d.Hk) * kDk;
  const WsView v = ws_view(const_cast<float*>(ws), d.Hv, nc);
  const size_t h0 = size_t(h) * nc;
  float* S = state + (int64_t(h) * kDv + j0) * kDk;

  // The state tile of the warp, fp32, before pdl_wait(): this layer's state is written only by this layer's GDN
  // kernels, and the kernel before this one (pass 1) does not touch it (see gdn_decode in gdn.cuh).
  const int sm = warp & 1, si = 32 * (warp >> 1);
  float st[4][4];
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float2 x = *reinterpret_cast<const float2*>(&S[(16 * sm + frow(2 * half)) * kDk + si + 8 * nt + fcol(0)]);
      st[nt][2 * half] = x.x;
      st[nt][2 * half + 1] = x.y;
    }
  auto store_state_split = [&] {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        uint32_t hi, lo;
        split<true>(st[nt][r], hi, lo);
        const int idx = (16 * sm + frow(r)) * kLdA + si + 8 * nt + fcol(r);
        sSh[idx] = __uint_as_float(hi);
        sSl[idx] = __uint_as_float(lo);
      }
  };
  auto load_wq = [&](int c) {
    const int64_t c0 = int64_t(c) * kL;
    const int n = int(d.T - c0 < kL ? d.T - c0 : kL);
    const float* Wc = v.W + (h0 + c) * kL * kDk;
    for (int e = tid; e < kL * kDk / 4; e += kThreads) {
      const int t = e / (kDk / 4), c4 = e % (kDk / 4);
      const bool ok = t < n;
      cp_async_16_if(&sW[t * kLdA + 4 * c4], Wc + t * kDk + 4 * c4, true);
      cp_async_16_if(&sQ[t * kLdA + 4 * c4], ok ? qsrc + (c0 + t) * C + 4 * c4 : qkv, ok);
    }
  };
  auto load_kpu = [&](int c, int b) {
    const int64_t c0 = int64_t(c) * kL;
    const int n = int(d.T - c0 < kL ? d.T - c0 : kL);
    float* K = sK + b * kL * kLdB;
    float* Pb = sP + b * kL * kLdL;
    float* Ub = sU + b * kL * kLdV;
    const float* Pc = v.P + (h0 + c) * kL * kL;
    const float* Uc = v.U + (h0 + c) * kL * kDv + j0;
    for (int e = tid; e < kL * kDk / 4; e += kThreads) {
      const int t = e / (kDk / 4), c4 = e % (kDk / 4);
      const bool ok = t < n;
      cp_async_16_if(&K[t * kLdB + 4 * c4], ok ? ksrc + (c0 + t) * C + 4 * c4 : qkv, ok);
    }
    for (int e = tid; e < kL * kL / 4; e += kThreads) {
      const int t = e / (kL / 4), c4 = e % (kL / 4);
      cp_async_16_if(&Pb[t * kLdL + 4 * c4], Pc + t * kL + 4 * c4, true);
    }
    for (int e = tid; e < kL * kBV / 4; e += kThreads) {
      const int t = e / (kBV / 4), c4 = e % (kBV / 4);
      cp_async_16_if(&Ub[t * kLdV + 4 * c4], Uc + t * kDv + 4 * c4, true);
    }
    if (tid < 2 * kL / 4) cp_async_16_if(&sGt[b * 2 * kL + 4 * tid], v.gates + (h0 + c) * 2 * kL + 4 * tid, true);
  };

  pdl_wait();
  pdl_trigger();
  store_state_split();
  load_wq(0);
  load_kpu(0, 0);
  cp_async_commit();

  const int mt = warp & 3, mq = 3 - mt, np = warp >> 2;  // phase A / output tiles (see above)
#pragma unroll 1
  for (int c = 0; c < nc; ++c) {
    const int b = c & 1;
    const int64_t c0 = int64_t(c) * kL;
    const int n = int(d.T - c0 < kL ? d.T - c0 : kL);
    cp_async_wait_all();
    __syncthreads();  // chunk c's operands and the state hi/lo are visible; chunk c−1 is done with buffer b^1
    if (c + 1 < nc) load_kpu(c + 1, b ^ 1);
    cp_async_commit();
    float* Ub = sU + b * kL * kLdV;
    const float* Kb = sK + b * kL * kLdB;
    const float* Pb = sP + b * kL * kLdL;
    const float* eG = sGt + b * 2 * kL;
    const float* dec = eG + kL;

    // Phase A: W·Sᵀ and Q·Sᵀ over the 128 key dims.
    float ob[2][4], os[2][4];
    {
      float wb[2][4] = {}, wsm[2][4] = {};
#pragma unroll
      for (int q = 0; q < 2; ++q)
#pragma unroll
        for (int r = 0; r < 4; ++r) ob[q][r] = os[q][r] = 0.0f;
#pragma unroll 4
      for (int ks = 0; ks < kDk / 8; ++ks) {
        uint32_t bh[2][2], bl[2][2];
#pragma unroll
        for (int q = 0; q < 2; ++q) ldb_nm_pre(bh[q], bl[q], sSh + (16 * np + 8 * q) * kLdA, sSl + (16 * np + 8 * q) * kLdA, kLdA, 8 * ks);
        uint32_t ah[4], al[4];
        lda_rm<true>(ah, al, sW + 16 * mt * kLdA, kLdA, 8 * ks);
        mma3<true>(wb[0], wsm[0], ah, al, bh[0], bl[0]);
        mma3<true>(wb[1], wsm[1], ah, al, bh[1], bl[1]);
        lda_rm<kOut3x>(ah, al, sQ + 16 * mt * kLdA, kLdA, 8 * ks);
        mma3<kOut3x>(ob[0], os[0], ah, al, bh[0], bl[0]);
        lda_rm<kOut3x>(ah, al, sQ + 16 * mq * kLdA, kLdA, 8 * ks);
        mma3<kOut3x>(ob[1], os[1], ah, al, bh[1], bl[1]);
      }
#pragma unroll
      for (int q = 0; q < 2; ++q)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int t = 16 * mt + frow(r), j = 16 * np + 8 * q + fcol(r);
          Ub[t * kLdV + j] -= wb[q][r] + wsm[q][r];  // V' = U − W·Sᵀ (this thread's elements only)
          ob[q][r] = eG[16 * (q ? mq : mt) + frow(r)] * (ob[q][r] + os[q][r]);
          os[q][r] = 0.0f;
        }
    }
    __syncthreads();  // V' complete; W and Q free
    if (c + 1 < nc) load_wq(c + 1);
    cp_async_commit();

    // Phase B1: O = e^{G}·Q·Sᵀ + P·V' (causal: k-steps up to the tile's diagonal block).
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int mr = q ? mq : mt, ntile = 2 * np + q;
      for (int ks = 0; ks < 2 * (mr + 1); ++ks) {
        uint32_t ah[4], al[4], bh[2], bl[2];
        lda_rm<kOut3x>(ah, al, Pb + 16 * mr * kLdL, kLdL, 8 * ks);
        ldb_km<kOut3x>(bh, bl, Ub + 8 * ntile, kLdV, 8 * ks, nullptr);
        mma3<kOut3x>(ob[q], os[q], ah, al, bh, bl);
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int t = 16 * mr + frow(2 * half), j = 8 * ntile + fcol(0);
        if (t < n)
          *reinterpret_cast<float2*>(&o[(c0 + t) * ldo + int64_t(h) * kDv + j0 + j]) =
              make_float2(ob[q][2 * half] + os[q][2 * half], ob[q][2 * half + 1] + os[q][2 * half + 1]);
      }
    }
    // Phase B2: Sᵀ ← e^{G_{n−1}} Sᵀ + (dec ⊙ V')ᵀ·K on the warp's tile.
    {
      const float gn = eG[n - 1];
      float sb[4][4], ss[4][4] = {};
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) sb[nt][r] = gn * st[nt][r];
#pragma unroll 2
      for (int ks = 0; ks < kL / 8; ++ks) {
        uint32_t ah[4], al[4];
        lda_cm<true>(ah, al, Ub + 16 * sm, kLdV, 8 * ks, dec);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          uint32_t bh[2], bl[2];
          ldb_km<true>(bh, bl, Kb + si + 8 * nt, kLdB, 8 * ks, nullptr);
          mma3<true>(sb[nt], ss[nt], ah, al, bh, bl);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) st[nt][r] = sb[nt][r] + ss[nt][r];
      store_state_split();  // read by the next chunk's phase A, after the barrier at the loop's top
    }
  }
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      *reinterpret_cast<float2*>(&S[(16 * sm + frow(2 * half)) * kDk + si + 8 * nt + fcol(0)]) =
          make_float2(st[nt][2 * half], st[nt][2 * half + 1]);
}

}  // namespace wy

}  // namespace
}  // namespace tern::cuda
