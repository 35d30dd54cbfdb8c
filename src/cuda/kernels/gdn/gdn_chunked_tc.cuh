// The one-pass tensor-core kernels of gdn_chunked (GdnChunkedKernel::tf32, tf32x3; dk = 128, chunk 64) and the tf32
// mma.sync helpers that the two-pass kernels (gdn_chunked_twopass.cuh) build on; its warp scan of the cumulative decay
// serves every chunked kernel. Device code of one translation unit, kept in its own file for size: included by
// gdn_prefill.cu only (hence the anonymous namespace).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/common/launch.cuh"
#include "cuda/kernels/gdn/gdn.cuh"

namespace tern::cuda {
namespace {

// Inclusive prefix sum over the lanes of a warp: lane L gets x of lanes 0..L (the chunk's cumulative log decay).
__device__ __forceinline__ float warp_inclusive_sum(float x, int lane) {
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const float y = __shfl_up_sync(0xffffffffu, x, off);
    if (lane >= off) x += y;
  }
  return x;
}

// ---- chunked form on tensor cores (dk = 128, chunk 64) ----------------------------------------------------------
// A block owns one v-head h and BV state rows (value dims j0..j0+BV-1) and walks the chunks in order with its state
// slice Sᵀ[BV][dk] in shared memory (fp32). Per chunk of n ≤ 64 tokens (rows past n are zero):
//   G  = in-chunk cumulative log decay;  A[t,s] = β_t e^{G_t−G_s} k_t·k_s (s < t);  P[t,s] = e^{G_t−G_s} q_t·k_s (s ≤ t)
//   R  = β ⊙ (V − e^{G} ⊙ K·S₀ᵀ),  Oi = e^{G} ⊙ Q·S₀ᵀ                         (phase G: one pass over K, Q)
//   T  = (I + A)⁻¹ by blocks of 16: diagonal blocks by forward substitution (fp32), then
//        T_ij = −T_ii Σ_{k=j}^{i−1} A_ik T_kj level by level                       (phase I)
//   Δ  = T·R                                                                       (phase D)
//   O  = Oi + P·Δ;  Sᵀ ← e^{G_{n−1}} Sᵀ + (e^{G_{n−1}−G} ⊙ Δ)ᵀ·K                    (phase OS)
// Every product is a warp-level mma.sync m16n8k8 on tf32 operands with fp32 accumulation; with kSplit each fp32
// operand is split into tf32 hi + lo and three products are summed (≈ fp32 accuracy, "3xTF32").
// The recurrence across chunks is sequential; the in-chunk matrices (A, P, T) depend only on the head and are
// recomputed by each of the dv/BV blocks of a head.
namespace tc {

constexpr int kL = 64;         // chunk
constexpr int kDk = 128;       // key head dim
constexpr int kThreads = 256;  // 8 warps
constexpr int kLdK = kDk + 4;  // rows of sK, sQ, sS: A row-major / B n-major fragment loads hit 32 distinct banks
constexpr int kLdL = kL + 4;   // rows of sA, sP, sT, sVd

template <int BV>
constexpr int ld_v() { return BV + 8; }  // rows of sR, sD, sOi: B k-major loads and C-fragment stores conflict-free

template <int BV>
constexpr size_t smem_floats() {
  return size_t(2 * kL + BV) * kLdK + size_t(3 * kL + BV) * kLdL + size_t(4 * kL) * ld_v<BV>() + 4 * kL;
}

__device__ __forceinline__ uint32_t tf32_bits(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

template <bool kSplit>
struct FragA {
  uint32_t hi[4], lo[kSplit ? 4 : 1];
};
template <bool kSplit>
struct FragB {
  uint32_t hi[2], lo[kSplit ? 2 : 1];
};

template <bool kSplit, int N>
__device__ __forceinline__ void to_tf32(const float (&v)[N], uint32_t (&hi)[N], uint32_t (&lo)[kSplit ? N : 1]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    hi[i] = tf32_bits(v[i]);
    if constexpr (kSplit) lo[i] = tf32_bits(v[i] - __uint_as_float(hi[i]));
  }
}

// A fragment of the 16×8 block at rows 0..15, columns k0..k0+7 of A(m, k) = A[m·lda + k].
template <bool kSplit>
__device__ __forceinline__ void load_a(FragA<kSplit>& f, const float* A, int lda, int k0) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const float v[4] = {A[g * lda + k0 + t], A[(g + 8) * lda + k0 + t], A[g * lda + k0 + t + 4],
                      A[(g + 8) * lda + k0 + t + 4]};
  to_tf32<kSplit>(v, f.hi, f.lo);
}

// B fragment of the 8×8 block at rows k0..k0+7, columns 0..7 of B(k, n) = B[n·ldb + k] (kNMajor) or B[k·ldb + n].
template <bool kSplit, bool kNMajor>
__device__ __forceinline__ void load_b(FragB<kSplit>& f, const float* B, int ldb, int k0) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  float v[2];
  if constexpr (kNMajor) {
    v[0] = B[g * ldb + k0 + t];
    v[1] = B[g * ldb + k0 + t + 4];
  } else {
    v[0] = B[(k0 + t) * ldb + g];
    v[1] = B[(k0 + t + 4) * ldb + g];
  }
  to_tf32<kSplit>(v, f.hi, f.lo);
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// d += a·b (16×8 += 16×8 · 8×8), as 3 products (the small cross terms first) when kUse, else hi·hi only.
template <bool kUse, bool kSa, bool kSb>
__device__ __forceinline__ void mma(float (&d)[4], const FragA<kSa>& a, const FragB<kSb>& b) {
  if constexpr (kUse) {
    static_assert(kSa && kSb, "3xTF32 needs both operands split");
    mma_tf32(d, a.lo, b.hi);
    mma_tf32(d, a.hi, b.lo);
  }
  mma_tf32(d, a.hi, b.hi);
}

// Which products use 3xTF32 (bit set) or plain tf32: the kernel's kPrec template argument.
constexpr int kPrecGram = 1;   // K·Kᵀ and Q·Kᵀ
constexpr int kPrecState = 2;  // K·Sᵀ, Q·Sᵀ and the state update
constexpr int kPrecSolve = 4;  // the off-diagonal inverse blocks and Δ = T·R
constexpr int kPrecOut = 8;    // P·Δ
constexpr int kPrecAll = 15;

// acc (a 16×16 block: n-tiles 0, 1) += A(0..15, 0..8·ksteps) · B(0..8·ksteps, 0..15), B k-major (B[k·ldb + n]).
template <bool kSplit>
__device__ __forceinline__ void mma_16x16_kmajor(float (&acc)[2][4], const float* A, int lda, const float* B, int ldb,
                                                 int ksteps) {
  for (int ks = 0; ks < ksteps; ++ks) {
    FragA<kSplit> fa;
    load_a(fa, A, lda, 8 * ks);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      FragB<kSplit> fb;
      load_b<kSplit, false>(fb, B + 8 * nt, ldb, 8 * ks);
      mma<kSplit>(acc[nt], fa, fb);
    }
  }
}

// Element r (0..3) of a lane's C fragment sits at row g + 8·(r/2), column 2t + r%2 of its 16×8 tile.
__device__ __forceinline__ int frag_row(int r) { return ((threadIdx.x & 31) >> 2) + 8 * (r >> 1); }
__device__ __forceinline__ int frag_col(int r) { return 2 * (threadIdx.x & 3) + (r & 1); }

template <int BV, int kPrec>
__global__ void __launch_bounds__(kThreads) gdn_chunked_tc_kernel(const float* qkv, const float* g_log,
                                                                  const float* beta, float* state, GdnDims d,
                                                                  float* o) {
  static_assert(BV % 16 == 0 && BV >= 16 && BV <= 32, "value slice of 16 or 32 rows");
  constexpr int kLdV = ld_v<BV>();
  constexpr int kNs = BV / 8;   // n-tiles over the slice's value dims
  constexpr int kBv16 = BV / 16;
  constexpr bool kSplitGram = kPrec & kPrecGram, kSplitState = kPrec & kPrecState;
  constexpr bool kSplitSolve = kPrec & kPrecSolve, kSplitOut = kPrec & kPrecOut;
  extern __shared__ __align__(16) float smem[];
  float* sK = smem;                // [kL][kLdK] keys of the chunk (zero rows past n)
  float* sQ = sK + kL * kLdK;      // [kL][kLdK] queries
  float* sS = sQ + kL * kLdK;      // [BV][kLdK] state rows j0.. of head h (Sᵀ slice, fp32)
  float* sA = sS + BV * kLdK;      // [kL][kLdL] A (lower blocks only)
  float* sP = sA + kL * kLdL;      // [kL][kLdL] P (lower blocks only)
  float* sT = sP + kL * kLdL;      // [kL][kLdL] (I + A)⁻¹ (lower blocks only)
  float* sVd = sT + kL * kLdL;     // [BV][kLdL] e^{G_{n−1}−G_s} Δ[s][j], transposed
  float* sR = sVd + BV * kLdL;     // [kL][kLdV] right-hand side R
  float* sD = sR + kL * kLdV;      // [kL][kLdV] Δ
  float* sOi = sD + kL * kLdV;     // [kL][kLdV] inter-chunk output e^{G}·Q·S₀ᵀ
  float* sV = sOi + kL * kLdV;     // [kL][kLdV] the chunk's values of the slice (zero rows past n)
  float* sG = sV + kL * kLdV;      // [kL] inclusive cumulative log decay (past n: G_{n−1})
  float* sEG = sG + kL;            // [kL] e^{G_t}
  float* sB = sEG + kL;            // [kL] β_t (0 past n)
  float* sDec = sB + kL;           // [kL] e^{G_{n−1}−G_t} (0 past n)

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int h = blockIdx.y, kh = h / (d.Hv / d.Hk), j0 = blockIdx.x * BV;
  const int64_t C = d.C(), ldo = int64_t(d.Hv) * d.dv;
  const int64_t q_off = int64_t(kh) * kDk, k_off = int64_t(d.Hk) * kDk + q_off;
  const int64_t v_off = 2LL * d.Hk * kDk + int64_t(h) * d.dv + j0;
  float* S = state + (int64_t(h) * d.dv + j0) * kDk;

  // The next chunk's inputs are loaded into registers while the current one is processed (phases I, D, OS):
  // keys and queries (8 float4 each per thread), the slice's values, and (warp 0) the gates.
  constexpr int kKqIters = kL * kDk / 4 / kThreads, kVIters = kL * BV / 4 / kThreads;
  static_assert(kKqIters * kThreads * 4 == kL * kDk && kVIters * kThreads * 4 == kL * BV, "whole float4 tiles");
  float4 pk[kKqIters], pq[kKqIters], pv[kVIters];
  float pg[kL / 32], pb[kL / 32];
  auto fetch = [&](int64_t c) {
    const int64_t nn = d.T - c < kL ? d.T - c : kL;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int it = 0; it < kKqIters; ++it) {
      const int e = tid + it * kThreads, t = e / (kDk / 4), c4 = e % (kDk / 4);
      const float* row = qkv + (c + t) * C;
      pk[it] = t < nn ? *reinterpret_cast<const float4*>(row + k_off + 4 * c4) : zero;
      pq[it] = t < nn ? *reinterpret_cast<const float4*>(row + q_off + 4 * c4) : zero;
    }
#pragma unroll
    for (int it = 0; it < kVIters; ++it) {
      const int e = tid + it * kThreads, t = e / (BV / 4), c4 = e % (BV / 4);
      pv[it] = t < nn ? *reinterpret_cast<const float4*>(qkv + (c + t) * C + v_off + 4 * c4) : zero;
    }
    if (warp == 0) {
#pragma unroll
      for (int i = 0; i < kL / 32; ++i) {
        const int t = lane + 32 * i;
        pg[i] = t < nn ? g_log[(c + t) * d.Hv + h] : 0.0f;
        pb[i] = t < nn ? beta[(c + t) * d.Hv + h] : 0.0f;
      }
    }
  };

  pdl_wait();
  pdl_trigger();
  for (int e = tid; e < BV * kDk / 4; e += kThreads) {
    const int j = e / (kDk / 4), c = e % (kDk / 4);
    *reinterpret_cast<float4*>(&sS[j * kLdK + 4 * c]) = *reinterpret_cast<const float4*>(&S[j * kDk + 4 * c]);
  }
  fetch(0);

  for (int64_t c0 = 0; c0 < d.T; c0 += kL) {
    const int n = int(d.T - c0 < kL ? d.T - c0 : kL);
    // L. the chunk's keys, queries and values (zero past n) from the prefetch registers; β and the cumulative decay
#pragma unroll
    for (int it = 0; it < kKqIters; ++it) {
      const int e = tid + it * kThreads, t = e / (kDk / 4), c4 = e % (kDk / 4);
      *reinterpret_cast<float4*>(&sK[t * kLdK + 4 * c4]) = pk[it];
      *reinterpret_cast<float4*>(&sQ[t * kLdK + 4 * c4]) = pq[it];
    }
#pragma unroll
    for (int it = 0; it < kVIters; ++it) {
      const int e = tid + it * kThreads, t = e / (BV / 4), c4 = e % (BV / 4);
      *reinterpret_cast<float4*>(&sV[t * kLdV + 4 * c4]) = pv[it];
    }
    if (warp == 0) {
      float carry = 0.0f;
#pragma unroll
      for (int i = 0; i < kL / 32; ++i) {
        const int t = lane + 32 * i;
        float x = pg[i];  // 0 past n
        x = warp_inclusive_sum(x, lane);
        x += carry;
        sG[t] = x;
        sB[t] = pb[i];
        carry = __shfl_sync(0xffffffffu, x, 31);
      }
      for (int t = lane; t < kL; t += 32) {  // each lane reads back only the entries it wrote
        sEG[t] = expf(sG[t]);
        sDec[t] = t < n ? expf(carry - sG[t]) : 0.0f;
      }
    }
    __syncthreads();

    // G. warp w: row block bi = w/2 of K (w even) or Q (w odd) times [K rows 0..16(bi+1) | S slice rows]ᵀ
    {
      const int bi = warp >> 1;
      const bool is_q = warp & 1;
      const float* rows = (is_q ? sQ : sK) + 16 * bi * kLdK;
      const int nk = 2 * (bi + 1);  // n-tiles of the gram part (8 tokens each)
      float acc[8 + kNs][4];
#pragma unroll
      for (int nt = 0; nt < 8 + kNs; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll 2
      for (int ks = 0; ks < kDk / 8; ++ks) {
        FragA<kSplitGram || kSplitState> fa;
        load_a(fa, rows, kLdK, 8 * ks);
#pragma unroll
        for (int nt = 0; nt < 8 + kNs; ++nt) {
          if (nt < 8) {
            if (nt >= nk) continue;
            FragB<kSplitGram> fb;
            load_b<kSplitGram, true>(fb, sK + 8 * nt * kLdK, kLdK, 8 * ks);
            mma<kSplitGram>(acc[nt], fa, fb);
          } else {
            FragB<kSplitState> fb;
            load_b<kSplitState, true>(fb, sS + 8 * (nt - 8) * kLdK, kLdK, 8 * ks);
            mma<kSplitState>(acc[nt], fa, fb);
          }
        }
      }
#pragma unroll
      for (int nt = 0; nt < 8 + kNs; ++nt) {
        if (nt < 8 && nt >= nk) continue;
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int t = 16 * bi + frag_row(r);
          const float x = acc[nt][r];
          if (nt < 8) {
            const int s2 = 8 * nt + frag_col(r);
            if (!is_q)
              sA[t * kLdL + s2] = (s2 < t && t < n) ? sB[t] * expf(sG[t] - sG[s2]) * x : 0.0f;
            else
              sP[t * kLdL + s2] = (s2 <= t && t < n) ? expf(sG[t] - sG[s2]) * x : 0.0f;
          } else {
            const int j = 8 * (nt - 8) + frag_col(r);
            if (!is_q)
              sR[t * kLdV + j] = t < n ? sB[t] * (sV[t * kLdV + j] - sEG[t] * x) : 0.0f;
            else
              sOi[t * kLdV + j] = sEG[t] * x;
          }
        }
      }
    }
    __syncthreads();
    if (c0 + kL < d.T) fetch(c0 + kL);  // in flight during phases I, D and OS

    // I1. diagonal blocks T_bb = (I + A_bb)⁻¹: warp b, lane (column c = lane%16, half = lane/16 sums every other s)
    if (warp < 4) {
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
    // I2. off-diagonal blocks, level lev = i − j: X = Σ_{k=j}^{i−1} A_ik T_kj, then T_ij = −T_ii X
    for (int lev = 1; lev < 4; ++lev) {
      if (warp < 4 - lev) {
        const int j = warp, i = warp + lev;
        float x[2][4] = {};
        for (int kb = j; kb < i; ++kb)
          mma_16x16_kmajor<kSplitSolve>(x, sA + 16 * i * kLdL + 16 * kb, kLdL, sT + 16 * kb * kLdL + 16 * j, kLdL, 2);
        float* Tij = sT + 16 * i * kLdL + 16 * j;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int r = 0; r < 4; ++r) Tij[frag_row(r) * kLdL + 8 * nt + frag_col(r)] = x[nt][r];
        __syncwarp();
        float y[2][4] = {};
        mma_16x16_kmajor<kSplitSolve>(y, sT + 16 * i * kLdL + 16 * i, kLdL, Tij, kLdL, 2);
        __syncwarp();
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int r = 0; r < 4; ++r) Tij[frag_row(r) * kLdL + 8 * nt + frag_col(r)] = -y[nt][r];
      }
      __syncthreads();
    }

    // D. Δ = T·R in 16×16 blocks (bi, bj); also Vd = (e^{G_{n−1}−G} ⊙ Δ)ᵀ
    for (int job = warp; job < 4 * kBv16; job += kThreads / 32) {
      const int bi = job / kBv16, bj = job % kBv16;
      float acc[2][4] = {};
      mma_16x16_kmajor<kSplitSolve>(acc, sT + 16 * bi * kLdL, kLdL, sR + 16 * bj, kLdV, 2 * (bi + 1));
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int t = 16 * bi + frag_row(r), j = 16 * bj + 8 * nt + frag_col(r);
          sD[t * kLdV + j] = acc[nt][r];
          sVd[j * kLdL + t] = sDec[t] * acc[nt][r];
        }
    }
    __syncthreads();

    // OS. outputs O = Oi + P·Δ (16×16 blocks, jobs 0..4·BV/16) and the state Sᵀ ← e^{G_{n−1}}Sᵀ + Vd·K (16×32 blocks)
    {
      constexpr int kOJobs = 4 * kBv16, kSJobs = kBv16 * 4;
      const float gn = sEG[n - 1];
      for (int job = warp; job < kOJobs + kSJobs; job += kThreads / 32) {
        if (job < kOJobs) {
          const int bi = job / kBv16, bj = job % kBv16;
          float acc[2][4];
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int r = 0; r < 4; ++r)
              acc[nt][r] = sOi[(16 * bi + frag_row(r)) * kLdV + 16 * bj + 8 * nt + frag_col(r)];
          mma_16x16_kmajor<kSplitOut>(acc, sP + 16 * bi * kLdL, kLdL, sD + 16 * bj, kLdV, 2 * (bi + 1));
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const int t = 16 * bi + frag_row(2 * half), j = 16 * bj + 8 * nt + frag_col(0);
              if (t < n)
                *reinterpret_cast<float2*>(&o[(c0 + t) * ldo + int64_t(h) * d.dv + j0 + j]) =
                    make_float2(acc[nt][2 * half], acc[nt][2 * half + 1]);
            }
        } else {
          const int mi = (job - kOJobs) / 4, ni = (job - kOJobs) % 4;  // rows j 16mi.., key dims i 32ni..
          float acc[4][4];
#pragma unroll
          for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int r = 0; r < 4; ++r)
              acc[nt][r] = gn * sS[(16 * mi + frag_row(r)) * kLdK + 32 * ni + 8 * nt + frag_col(r)];
#pragma unroll 2
          for (int ks = 0; ks < kL / 8; ++ks) {
            FragA<kSplitState> fa;
            load_a(fa, sVd + 16 * mi * kLdL, kLdL, 8 * ks);
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
              FragB<kSplitState> fb;
              load_b<kSplitState, false>(fb, sK + 32 * ni + 8 * nt, kLdK, 8 * ks);
              mma<kSplitState>(acc[nt], fa, fb);
            }
          }
#pragma unroll
          for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int r = 0; r < 4; ++r)
              sS[(16 * mi + frag_row(r)) * kLdK + 32 * ni + 8 * nt + frag_col(r)] = acc[nt][r];
        }
      }
    }
    __syncthreads();
  }
  for (int e = tid; e < BV * kDk / 4; e += kThreads) {
    const int j = e / (kDk / 4), c = e % (kDk / 4);
    *reinterpret_cast<float4*>(&S[j * kDk + 4 * c]) = *reinterpret_cast<const float4*>(&sS[j * kLdK + 4 * c]);
  }
}

}  // namespace tc

}  // namespace
}  // namespace tern::cuda
