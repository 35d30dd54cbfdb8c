#include "cuda/kernels/gdn/gdn.cuh"

#include <cooperative_groups.h>

#include <algorithm>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/warp_reduce.cuh"

namespace tern::cuda {
namespace {


__global__ void gdn_prepare_kernel(float* qkv, const float* b, const float* a, const float* A_log, const float* dt_bias,
                                   GdnDims d, float* g_log, float* beta) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  float* row = qkv + t * d.C();
  for (int task = warp; task < 2 * d.Hk; task += nw) {  // q heads then k heads, contiguous
    float* v = row + int64_t(task) * d.dk;
    float ss = 0.0f;
    for (int i = lane; i < d.dk; i += 32) ss += v[i] * v[i];
    float inv = rsqrtf(warp_sum(ss) + 1e-6f);
    if (task < d.Hk) inv *= rsqrtf(float(d.dk));
    for (int i = lane; i < d.dk; i += 32) v[i] *= inv;
  }
  for (int h = threadIdx.x; h < d.Hv; h += blockDim.x) {
    const float x = a[t * d.Hv + h] + dt_bias[h];
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    g_log[t * d.Hv + h] = -expf(A_log[h]) * sp;
    beta[t * d.Hv + h] = 1.0f / (1.0f + expf(-b[t * d.Hv + h]));
  }
}

// The gates alone (prefill with conv1d_silu_qknorm): thread per (t, h).
__global__ void gdn_gates_kernel(const float* b, const float* a, const float* A_log, const float* dt_bias, GdnDims d,
                                 float* g_log, float* beta) {
  pdl_wait();
  pdl_trigger();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= d.T * d.Hv) return;
  const int h = int(i % d.Hv);
  const float x = a[i] + dt_bias[h];
  const float sp = x > 20.0f ? x : log1pf(expf(x));
  g_log[i] = -expf(A_log[h]) * sp;
  beta[i] = 1.0f / (1.0f + expf(-b[i]));
}

constexpr int kRowsPerWarp = 4, kWarps = 4;  // a block owns 16 state rows of one v-head

// Each lane holds KPL consecutive key dims of kRowsPerWarp state rows in registers for the whole token loop.
template <int KPL>
__global__ void __launch_bounds__(kWarps * 32) gdn_recurrent_kernel(const float* qkv, const float* g_log,
                                                                    const float* beta, float* state, GdnDims d, float* o) {
  pdl_wait();
  pdl_trigger();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int h = blockIdx.y;
  const int kh = h / (d.Hv / d.Hk);
  const int row0 = (blockIdx.x * kWarps + warp) * kRowsPerWarp;
  float* S = state + (int64_t(h) * d.dv + row0) * d.dk + lane * KPL;
  float s[kRowsPerWarp][KPL];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int i = 0; i < KPL; ++i) s[r][i] = S[r * d.dk + i];
  const int64_t C = d.C();
  const int64_t q_off = int64_t(kh) * d.dk + lane * KPL, k_off = int64_t(d.Hk) * d.dk + q_off;
  const int64_t v_off = 2LL * d.Hk * d.dk + int64_t(h) * d.dv + row0;
  for (int64_t t = 0; t < d.T; ++t) {
    const float* row = qkv + t * C;
    float q[KPL], k[KPL];
#pragma unroll
    for (int i = 0; i < KPL; ++i) {
      q[i] = row[q_off + i];
      k[i] = row[k_off + i];
    }
    const float g = expf(g_log[t * d.Hv + h]), b = beta[t * d.Hv + h];
    float qk = 0.0f, ks[kRowsPerWarp], qs[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < KPL; ++i) qk += q[i] * k[i];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      ks[r] = 0.0f;
      qs[r] = 0.0f;
#pragma unroll
      for (int i = 0; i < KPL; ++i) {
        ks[r] += s[r][i] * k[i];
        qs[r] += s[r][i] * q[i];
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      qk += __shfl_xor_sync(0xffffffffu, qk, off);
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        ks[r] += __shfl_xor_sync(0xffffffffu, ks[r], off);
        qs[r] += __shfl_xor_sync(0xffffffffu, qs[r], off);
      }
    }
    float out[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const float delta = b * (row[v_off + r] - g * ks[r]);
#pragma unroll
      for (int i = 0; i < KPL; ++i) s[r][i] = g * s[r][i] + k[i] * delta;
      out[r] = g * qs[r] + qk * delta;
    }
    if (lane < kRowsPerWarp) {
      float v = out[0];
#pragma unroll
      for (int r = 1; r < kRowsPerWarp; ++r)
        if (lane == r) v = out[r];
      o[t * int64_t(d.Hv) * d.dv + int64_t(h) * d.dv + row0 + lane] = v;
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int i = 0; i < KPL; ++i) S[r * d.dk + i] = s[r][i];
}

__global__ void gdn_gated_norm_kernel(const float* o, const float* z, const float* w, float eps, GdnDims d, float* out) {
  pdl_wait();
  pdl_trigger();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t task = int64_t(blockIdx.x) * (blockDim.x / 32) + warp;  // (t, h)
  if (task >= d.T * d.Hv) return;
  const int64_t base = task * d.dv;
  float ss = 0.0f;
  for (int i = lane; i < d.dv; i += 32) ss += o[base + i] * o[base + i];
  const float inv = rsqrtf(warp_sum(ss) / float(d.dv) + eps);
  for (int i = lane; i < d.dv; i += 32) {
    const float zz = z[base + i];
    out[base + i] = o[base + i] * inv * w[i] * (zz / (1.0f + expf(-zz)));
  }
}


// ---- chunked form ----------------------------------------------------------------------------------------------
// A block owns one v-head and kChunkDv state rows (value dims) of it; it walks the chunks in order, holding its state
// slice in shared memory. The in-chunk matrices A and P depend only on the head and are recomputed per slice.
constexpr int kChunkDv = 32, kChunkThreads = 256;  // the forward substitution maps 8 warps × 4 columns × 8 lanes
constexpr int kMaxChunk = 64;  // the 16×16 threads × 4×4 register tiles of step 2 span 64 token rows

__host__ __device__ inline size_t gdn_chunked_smem_floats(int chunk, int dk) {
  // sK, sQ [kMaxChunk][dk+1]; sS [kChunkDv][dk+1]; sA, sP [chunk][chunk+1]; sU, sW [chunk][kChunkDv]; sG, sB, sD [chunk]
  return size_t(2 * kMaxChunk + kChunkDv) * size_t(dk + 1) + 2 * size_t(chunk) * size_t(chunk + 1) +
         2 * size_t(chunk) * kChunkDv + 3 * size_t(chunk);
}

template <int KC>  // dk = 32·KC
__global__ void __launch_bounds__(kChunkThreads) gdn_chunked_kernel(const float* qkv, const float* g_log,
                                                                    const float* beta, float* state, GdnDims d,
                                                                    float* o, int chunk) {
  pdl_wait();
  pdl_trigger();
  extern __shared__ float smem[];
  constexpr int dk = 32 * KC;
  const int ldk = dk + 1, lda = chunk + 1;
  float* sK = smem;                      // [kMaxChunk][ldk] keys of the chunk
  float* sQ = sK + kMaxChunk * ldk;      // [kMaxChunk][ldk] queries
  float* sS = sQ + kMaxChunk * ldk;      // [kChunkDv][ldk] state rows j0.. of head h
  float* sA = sS + kChunkDv * ldk;       // [chunk][lda] β_t e^{G_t−G_s} k_t·k_s, s < t (else 0)
  float* sP = sA + chunk * lda;          // [chunk][lda] e^{G_t−G_s} q_t·k_s, s ≤ t (else 0)
  float* sU = sP + chunk * lda;          // [chunk][kChunkDv] right-hand side, then the deltas Δ
  float* sW = sU + chunk * kChunkDv;     // [chunk][kChunkDv] e^{G_t} q_t·S₀ (inter-chunk output)
  float* sG = sW + chunk * kChunkDv;     // [chunk] inclusive cumulative log decay
  float* sB = sG + chunk;                // [chunk] β
  float* sD = sB + chunk;                // [chunk] e^{G_{n−1}−G_s}
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int h = blockIdx.y, kh = h / (d.Hv / d.Hk);
  const int j0 = blockIdx.x * kChunkDv;
  const int64_t C = d.C(), ldo = int64_t(d.Hv) * d.dv;
  const int64_t q_off = int64_t(kh) * dk, k_off = int64_t(d.Hk) * dk + q_off;
  const int64_t v_off = 2LL * d.Hk * dk + int64_t(h) * d.dv + j0;
  float* S = state + (int64_t(h) * d.dv + j0) * dk;
  for (int e = tid; e < kChunkDv * dk; e += kChunkThreads) sS[(e / dk) * ldk + e % dk] = S[e];
  for (int64_t c0 = 0; c0 < d.T; c0 += chunk) {
    const int n = int(d.T - c0 < chunk ? d.T - c0 : chunk);
    // 1. the chunk's keys, queries, β and cumulative decay
    for (int e = tid; e < n * dk; e += kChunkThreads) {
      const int t = e / dk, i = e % dk;
      const float* row = qkv + (c0 + t) * C;
      sK[t * ldk + i] = row[k_off + i];
      sQ[t * ldk + i] = row[q_off + i];
    }
    if (warp == 0) {
      float carry = 0.0f;
      for (int base = 0; base < n; base += 32) {
        const int t = base + lane;
        float x = t < n ? g_log[(c0 + t) * d.Hv + h] : 0.0f;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
          const float y = __shfl_up_sync(0xffffffffu, x, off);
          if (lane >= off) x += y;
        }
        x += carry;
        if (t < n) {
          sG[t] = x;
          sB[t] = beta[(c0 + t) * d.Hv + h];
        }
        carry = __shfl_sync(0xffffffffu, x, 31);
      }
      __syncwarp();
      for (int t = lane; t < n; t += 32) sD[t] = expf(carry - sG[t]);
    }
    __syncthreads();
    // 2. A and P over token pairs; U = β(v − e^{G}·S₀k) and W = e^{G}·S₀q over (token, value dim)
    {  // thread (tt, ss) owns the 4×4 pairs t = tt + 16a, s = ss + 16b (rows past n hold stale data, never stored)
      const int tt = tid / 16, ss = tid % 16;
      float a[4][4] = {}, p[4][4] = {};
      for (int i = 0; i < dk; ++i) {
        float kt[4], qt[4], ks[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          kt[r] = sK[(tt + 16 * r) * ldk + i];
          qt[r] = sQ[(tt + 16 * r) * ldk + i];
          ks[r] = sK[(ss + 16 * r) * ldk + i];
        }
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            a[r][c] += kt[r] * ks[c];
            p[r][c] += qt[r] * ks[c];
          }
      }
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int t = tt + 16 * r, s2 = ss + 16 * c;
          if (t >= n || s2 >= n) continue;
          const float dec = s2 <= t ? expf(sG[t] - sG[s2]) : 0.0f;
          sA[t * lda + s2] = s2 < t ? sB[t] * dec * a[r][c] : 0.0f;
          sP[t * lda + s2] = dec * p[r][c];
        }
    }
    {  // thread (tt, jj) owns t = tt + 16a, j = jj + 16b
      const int tt = tid / 16, jj = tid % 16;
      float ks[4][2] = {}, qs[4][2] = {};
      for (int i = 0; i < dk; ++i) {
        float kt[4], qt[4], sj[2];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          kt[r] = sK[(tt + 16 * r) * ldk + i];
          qt[r] = sQ[(tt + 16 * r) * ldk + i];
        }
        sj[0] = sS[jj * ldk + i];
        sj[1] = sS[(jj + 16) * ldk + i];
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            ks[r][c] += kt[r] * sj[c];
            qs[r][c] += qt[r] * sj[c];
          }
      }
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int t = tt + 16 * r, j = jj + 16 * c;
          if (t >= n) continue;
          const float eg = expf(sG[t]);
          sU[t * kChunkDv + j] = sB[t] * (qkv[(c0 + t) * C + v_off + j] - eg * ks[r][c]);
          sW[t * kChunkDv + j] = eg * qs[r][c];
        }
    }
    __syncthreads();
    // 3. forward substitution (I + A)Δ = U, column by column: warp w owns columns 4w..4w+3, 8 lanes per column
    {
      const int j = warp * 4 + lane / 8, sub = lane % 8;
      for (int t = 1; t < n; ++t) {
        float acc = 0.0f;
        for (int s = sub; s < t; s += 8) acc += sA[t * lda + s] * sU[s * kChunkDv + j];
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        acc += __shfl_xor_sync(0xffffffffu, acc, 2);
        acc += __shfl_xor_sync(0xffffffffu, acc, 4);
        if (sub == 0) sU[t * kChunkDv + j] -= acc;
        __syncwarp();
      }
    }
    __syncthreads();
    // 4. outputs o = W + P·Δ and the end-of-chunk state S = e^{G_{n−1}}·S₀ + Σ_s e^{G_{n−1}−G_s} δ_s k_sᵀ
    for (int e = tid; e < n * kChunkDv; e += kChunkThreads) {
      const int t = e / kChunkDv, j = e % kChunkDv;
      float acc = sW[t * kChunkDv + j];
      for (int s = 0; s <= t; ++s) acc += sP[t * lda + s] * sU[s * kChunkDv + j];
      o[(c0 + t) * ldo + int64_t(h) * d.dv + j0 + j] = acc;
    }
    const float gn = expf(sG[n - 1]);
    {  // thread (warp, lane) owns rows j = warp + 8r and key dims i = lane + 32c
      float acc[4][KC];
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < KC; ++c) acc[r][c] = gn * sS[(warp + 8 * r) * ldk + lane + 32 * c];
      for (int s2 = 0; s2 < n; ++s2) {
        float u[4], k[KC];
#pragma unroll
        for (int r = 0; r < 4; ++r) u[r] = sD[s2] * sU[s2 * kChunkDv + warp + 8 * r];
#pragma unroll
        for (int c = 0; c < KC; ++c) k[c] = sK[s2 * ldk + lane + 32 * c];
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
          for (int c = 0; c < KC; ++c) acc[r][c] += u[r] * k[c];
      }
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < KC; ++c) sS[(warp + 8 * r) * ldk + lane + 32 * c] = acc[r][c];
    }
    __syncthreads();
  }
  for (int e = tid; e < kChunkDv * dk; e += kChunkThreads) S[e] = sS[(e / dk) * ldk + e % dk];
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
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
          const float y = __shfl_up_sync(0xffffffffu, x, off);
          if (lane >= off) x += y;
        }
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

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
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
    cp_async16(&sK[t * kLdA + 4 * c4], ok ? ksrc + t * C + 4 * c4 : qkv, ok);
    cp_async16(&sQV[t * kLdA + 4 * c4], ok ? qsrc + t * C + 4 * c4 : qkv, ok);
  }
  cp_async_commit();
  if (warp == 0) {
    float carry = 0.0f;
#pragma unroll
    for (int i = 0; i < kL / 32; ++i) {
      const int t = lane + 32 * i;
      float x = t < n ? g_log[(c0 + t) * d.Hv + h] : 0.0f;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const float y = __shfl_up_sync(0xffffffffu, x, off);
        if (lane >= off) x += y;
      }
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
    cp_async16(&sQV[t * kLdB + 4 * c4], ok ? vsrc + t * C + 4 * c4 : qkv, ok);
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
      cp_async16(&sW[t * kLdA + 4 * c4], Wc + t * kDk + 4 * c4, true);
      cp_async16(&sQ[t * kLdA + 4 * c4], ok ? qsrc + (c0 + t) * C + 4 * c4 : qkv, ok);
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
      cp_async16(&K[t * kLdB + 4 * c4], ok ? ksrc + (c0 + t) * C + 4 * c4 : qkv, ok);
    }
    for (int e = tid; e < kL * kL / 4; e += kThreads) {
      const int t = e / (kL / 4), c4 = e % (kL / 4);
      cp_async16(&Pb[t * kLdL + 4 * c4], Pc + t * kL + 4 * c4, true);
    }
    for (int e = tid; e < kL * kBV / 4; e += kThreads) {
      const int t = e / (kBV / 4), c4 = e % (kBV / 4);
      cp_async16(&Ub[t * kLdV + 4 * c4], Uc + t * kDv + 4 * c4, true);
    }
    if (tid < 2 * kL / 4) cp_async16(&sGt[b * 2 * kL + 4 * tid], v.gates + (h0 + c) * 2 * kL + 4 * tid, true);
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

// ---- decode: conv + SiLU, q/k norms, gates, delta rule and gated norm in one kernel ------------------------------
// A "group" is everything one key head kh needs: its q/k channels, the kRatio = 2 v-heads that share it, their
// 2·dv = 256 state rows and v/z channels. A group is CS blocks (a cluster of CS on sm_90; CS = 1 before), block
// `rank` owning group rows [rank·kRows, (rank+1)·kRows) (row r = v-head kh·2 + r/dv, value dim r%dv), NW warps of
// RPW rows each; a lane holds key dims 4·lane..4·lane+3 of its warp's rows in registers for all T tokens.
// Every block recomputes the conv + SiLU of the group's 256 q/k channels (the L2 norms need whole heads) and of its
// own v channels. Conv state: the q/k entries are read by every block of the group and written only by rank 0,
// after the group barrier that follows every block's reads; a block's v entries are read and written by it alone.
constexpr int kDecodeMaxT = 8, kDecodeMaxTaps = 8, kDecodeDk = 128, kDecodeDv = 128, kDecodeRatio = 2;

template <int CS, int NW, int RPW, int kTaps>
__global__ void __launch_bounds__(NW * 32) gdn_decode_kernel(GdnDecodeArgs a) {
  namespace cg = cooperative_groups;
  constexpr int kRows = NW * RPW;                      // state rows of this block
  constexpr int kQk = 2 * kDecodeDk;                   // q and k channels of the key head
  constexpr int kCh = kQk + kRows;                     // conv channels this block computes
  constexpr int kHeads = kRows > kDecodeDv ? kRows / kDecodeDv : 1;  // v-heads the block touches
  constexpr int kWarpsPerHead = kDecodeDv / RPW;       // partial sums of squares per v-head (over the group)
  static_assert(CS * kRows == kDecodeRatio * kDecodeDv, "a group covers the 2·dv rows of one key head");
  static_assert(kDecodeDv % kRows == 0 || kRows % kDecodeDv == 0, "blocks hold whole heads or slices of one head");
  static_assert(kDecodeDv % RPW == 0, "warps lie inside one head");
  __shared__ __align__(16) float s_x[kDecodeMaxT][kCh];  // conv+SiLU outputs [t][q 128 | k 128 | v kRows]
  __shared__ float s_conv_new[kTaps - 1][kCh];           // the new conv state of those channels
  __shared__ float s_o[kDecodeMaxT][kRows];              // delta-rule outputs
  __shared__ float s_sq[kDecodeMaxT][NW];                // Σ o² per (token, warp), read across the group
  __shared__ float s_decay[kDecodeMaxT][kHeads], s_beta[kDecodeMaxT][kHeads], s_inv[kDecodeMaxT][kHeads];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int rank = blockIdx.x, kh = blockIdx.y;
  const int T = int(a.d.T), Hk = a.d.Hk, Hv = a.d.Hv, Ck = a.Ck;
  const int64_t C = a.d.C(), ld = a.ld_proj;
  const int row0 = rank * kRows;                       // first group row of the block
  const int head0 = kh * kDecodeRatio + row0 / kDecodeDv;  // first v-head of the block
  const int j00 = row0 % kDecodeDv;                     // first value dim of the block inside head0
  // The warp's rows: v-head head0 + wslot, value dims wj0..wj0+RPW-1.
  const int wslot = (j00 + warp * RPW) / kDecodeDv, wj0 = (j00 + warp * RPW) % kDecodeDv;
  const int wh = head0 + wslot;

  // State rows, before pdl_wait(): see gdn.cuh (only this layer's own GDN kernels write them).
  float* S = a.rec_state + (int64_t(wh) * kDecodeDv + wj0) * kDecodeDk + 4 * lane;
  float4 s[RPW];
#pragma unroll
  for (int r = 0; r < RPW; ++r) s[r] = *reinterpret_cast<const float4*>(S + r * kDecodeDk);

  // Channel of local conv index lc: q (0..127), k (128..255), then the block's v rows.
  auto channel = [&](int lc) -> int64_t {
    if (lc < kDecodeDk) return int64_t(kh) * kDecodeDk + lc;
    if (lc < kQk) return int64_t(Hk) * kDecodeDk + int64_t(kh) * kDecodeDk + (lc - kDecodeDk);
    return 2LL * Hk * kDecodeDk + int64_t(kh) * kDecodeRatio * kDecodeDv + row0 + (lc - kQk);
  };
  // Conv weights of the thread's channels lc = tid + q·NT (launch constants: before pdl_wait too).
  constexpr int kNt = NW * 32, kChPerThread = (kCh + kNt - 1) / kNt;
  float cw[kChPerThread][kTaps];
#pragma unroll
  for (int q = 0; q < kChPerThread; ++q) {
    const int lc = tid + q * kNt;
    const int64_t c = lc < kCh ? channel(lc) : 0;
#pragma unroll
    for (int j = 0; j < kTaps; ++j) cw[q][j] = lc < kCh && j < Ck ? a.conv_w[c * Ck + j] : 0.0f;
  }

  pdl_wait();
  pdl_trigger();

  // Every global input after the wait is requested up front: conv state and inputs, gates, z of the outputs.
  float win[kChPerThread][kTaps], xin[kChPerThread][kDecodeMaxT];
#pragma unroll
  for (int q = 0; q < kChPerThread; ++q) {
    const int lc = tid + q * kNt;
    const int64_t c = lc < kCh ? channel(lc) : 0;
#pragma unroll
    for (int j = 0; j < kTaps; ++j) win[q][j] = lc < kCh && j < Ck - 1 ? a.conv_state[j * C + c] : 0.0f;
#pragma unroll
    for (int t = 0; t < kDecodeMaxT; ++t) xin[q][t] = lc < kCh && t < T ? a.proj[t * ld + c] : 0.0f;
  }
  float gate_a = 0.0f, gate_b = 0.0f;
  if (tid < T * kHeads) {
    const int t = tid / kHeads, h = head0 + tid % kHeads;
    const float* row = a.proj + t * ld + C + int64_t(Hv) * kDecodeDv;  // [b (Hv) | a (Hv)]
    gate_b = row[h];
    gate_a = row[Hv + h];
  }
  constexpr int kOutPerThread = (kDecodeMaxT * kRows + kNt - 1) / kNt;
  float zin[kOutPerThread];
#pragma unroll
  for (int q = 0; q < kOutPerThread; ++q) {
    const int i = tid + q * kNt, t = i / kRows, r = i % kRows;
    const int64_t col = int64_t(head0) * kDecodeDv + j00 + r;  // the block's rows are consecutive columns
    zin[q] = i < T * kRows ? a.proj[t * ld + C + col] : 0.0f;
  }

  // 1. conv + SiLU over the T tokens, window in registers (taps unrolled to kTaps, guarded by Ck).
#pragma unroll
  for (int q = 0; q < kChPerThread; ++q) {
    const int lc = tid + q * kNt;
    if (lc >= kCh) continue;
#pragma unroll
    for (int t = 0; t < kDecodeMaxT; ++t) {
      if (t >= T) break;
      float u = 0.0f;
#pragma unroll
      for (int j = 0; j < kTaps; ++j) {
        if (j == Ck - 1) win[q][j] = xin[q][t];
        if (j < Ck) u += cw[q][j] * win[q][j];
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
  if (tid < T * kHeads) {
    const int t = tid / kHeads, hs = tid % kHeads, h = head0 + hs;
    const float x = gate_a + a.dt_bias[h];
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    s_decay[t][hs] = expf(-expf(a.A_log[h]) * sp);
    s_beta[t][hs] = 1.0f / (1.0f + expf(-gate_b));
  }
  __syncthreads();
  // 3. L2 norms of q (scaled by 1/√dk) and k, a warp per (token, q|k)
  for (int task = warp; task < 2 * T; task += NW) {
    float* v = &s_x[task / 2][(task % 2) * kDecodeDk];
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < kDecodeDk / 32; ++i) ss += v[lane + 32 * i] * v[lane + 32 * i];
    float inv = rsqrtf(warp_sum(ss) + 1e-6f);
    if (task % 2 == 0) inv *= rsqrtf(float(kDecodeDk));
#pragma unroll
    for (int i = 0; i < kDecodeDk / 32; ++i) v[lane + 32 * i] *= inv;
  }
  __syncthreads();
  // 4. the delta rule, token by token: with ks = S_old·k, qs = S_old·q (one pass over the state),
  //    δ = β(v − e^g·ks), S = e^g·S + δ kᵀ, o = e^g·qs + (q·k)·δ.
  for (int t = 0; t < T; ++t) {
    const float4 q = *reinterpret_cast<const float4*>(&s_x[t][4 * lane]);
    const float4 k = *reinterpret_cast<const float4*>(&s_x[t][kDecodeDk + 4 * lane]);
    float qk = q.x * k.x + q.y * k.y + q.z * k.z + q.w * k.w;
    float ks[RPW], qs[RPW];
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      ks[r] = s[r].x * k.x + s[r].y * k.y + s[r].z * k.z + s[r].w * k.w;
      qs[r] = s[r].x * q.x + s[r].y * q.y + s[r].z * q.z + s[r].w * q.w;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      qk += __shfl_xor_sync(0xffffffffu, qk, off);
#pragma unroll
      for (int r = 0; r < RPW; ++r) {
        ks[r] += __shfl_xor_sync(0xffffffffu, ks[r], off);
        qs[r] += __shfl_xor_sync(0xffffffffu, qs[r], off);
      }
    }
    const float g = s_decay[t][wslot], b = s_beta[t][wslot];
    float sq = 0.0f, mine = 0.0f;
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      const float delta = b * (s_x[t][kQk + warp * RPW + r] - g * ks[r]);
      s[r].x = g * s[r].x + k.x * delta;
      s[r].y = g * s[r].y + k.y * delta;
      s[r].z = g * s[r].z + k.z * delta;
      s[r].w = g * s[r].w + k.w * delta;
      const float o = g * qs[r] + qk * delta;
      sq += o * o;
      if (lane == r) mine = o;
    }
    if (lane < RPW) s_o[t][warp * RPW + lane] = mine;
    if (lane == 0) s_sq[t][warp] = sq;
  }
#pragma unroll
  for (int r = 0; r < RPW; ++r) *reinterpret_cast<float4*>(S + r * kDecodeDk) = s[r];

  // 5. group barrier: every block's partial sums are written and its conv-state reads are done
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (CS > 1) cg::this_cluster().sync(); else __syncthreads();
#else
  if constexpr (CS > 1) __trap();  // never launched: the host takes the cluster path only for sm_90 binaries
  __syncthreads();
#endif
  auto partials = [&](int block) -> const float* {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (CS > 1) return cg::this_cluster().map_shared_rank(&s_sq[0][0], block);
#endif
    return &s_sq[0][0];
  };
  // 6. per (token, v-head of the block): inv = rsqrt(mean(o²) + eps) over the head's dv rows (kWarpsPerHead warps)
  for (int task = warp; task < T * kHeads; task += NW) {
    const int t = task / kHeads, hs = task % kHeads;
    const int gw0 = (head0 - kh * kDecodeRatio + hs) * kWarpsPerHead;  // first group warp of the head
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < (kWarpsPerHead + 31) / 32; ++i) {
      if (lane + 32 * i >= kWarpsPerHead) break;
      const int gw = gw0 + lane + 32 * i;
      ss += partials(gw / NW)[t * NW + gw % NW];
    }
    ss = warp_sum(ss);
    if (lane == 0) s_inv[t][hs] = rsqrtf(ss / float(kDecodeDv) + a.eps);
  }
  __syncthreads();
  // 7. gated norm out, and the conv state (q/k channels by rank 0 only)
#pragma unroll
  for (int q = 0; q < kOutPerThread; ++q) {
    const int i = tid + q * kNt, t = i / kRows, r = i % kRows;
    if (i >= T * kRows) break;
    const int hs = (j00 + r) / kDecodeDv, j = (j00 + r) % kDecodeDv;
    const int64_t col = int64_t(head0 + hs) * kDecodeDv + j;
    const float zz = zin[q];
    a.out[t * int64_t(Hv) * kDecodeDv + col] = s_o[t][r] * s_inv[t][hs] * a.norm_w[j] * (zz / (1.0f + expf(-zz)));
  }
  for (int lc = tid; lc < kCh; lc += NW * 32) {
    if (lc < kQk && rank != 0) continue;
    const int64_t c = channel(lc);
    for (int j = 0; j < Ck - 1; ++j) a.conv_state[j * C + c] = s_conv_new[j][lc];
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (CS > 1) cg::this_cluster().sync();  // keep s_sq alive until every block of the cluster read it
#endif
}

// sm_90: clusters of blocks (GdnDecodeArgs::Kernel; automatic: clusters of 4 × 16 warps × 4 rows, 64 blocks); before:
// one block of 32 warps × 8 rows per key head.
constexpr int kDecodeClusterCS = 8, kDecodeClusterNW = 8, kDecodeClusterRPW = 4;
constexpr int kDecodePortableNW = 32, kDecodePortableRPW = 8;

}  // namespace

void gdn_prepare(float* qkv, const float* b, const float* a, const float* A_log, const float* dt_bias, const GdnDims& d,
                 float* g_log, float* beta, cudaStream_t stream) {
  if (d.T == 0) return;
  launch_pdl("gdn_prepare", gdn_prepare_kernel, dim3(unsigned(d.T)), dim3(256), 0, stream, qkv, b, a, A_log, dt_bias, d,
             g_log, beta);
}

void gdn_gates(const float* b, const float* a, const float* A_log, const float* dt_bias, const GdnDims& d, float* g_log,
               float* beta, cudaStream_t stream) {
  if (d.T == 0) return;
  launch_pdl("gdn_gates", gdn_gates_kernel, dim3(blocks_for(d.T * d.Hv, 256)), dim3(256), 0, stream, b, a, A_log,
             dt_bias, d, g_log, beta);
}

void gdn_recurrent(const float* qkv, const float* g_log, const float* beta, float* state, const GdnDims& d, float* o,
                   cudaStream_t stream) {
  TERN_CHECK(d.dv % (kRowsPerWarp * kWarps) == 0, "gdn: dv ", d.dv, " is not a multiple of ", kRowsPerWarp * kWarps);
  TERN_CHECK(d.Hk > 0 && d.Hv % d.Hk == 0, "gdn: Hv ", d.Hv, " is not a multiple of Hk ", d.Hk);
  const dim3 grid(unsigned(d.dv / (kRowsPerWarp * kWarps)), unsigned(d.Hv)), block(kWarps * 32);
  switch (d.dk) {
    case 32: launch_pdl("gdn_recurrent", gdn_recurrent_kernel<1>, grid, block, 0, stream, qkv, g_log, beta, state, d, o); break;
    case 64: launch_pdl("gdn_recurrent", gdn_recurrent_kernel<2>, grid, block, 0, stream, qkv, g_log, beta, state, d, o); break;
    case 128: launch_pdl("gdn_recurrent", gdn_recurrent_kernel<4>, grid, block, 0, stream, qkv, g_log, beta, state, d, o); break;
    default: TERN_FAIL("gdn: key head dim ", d.dk, " not supported by the CUDA kernel (32, 64 or 128)");
  }
}

namespace {

// Raises kKernel's dynamic shared memory limit once per kernel (a static per template instance), so that it is never
// called while a stream captures (the first call of each kernel is eager).
template <auto kKernel>
void allow_smem_once(size_t bytes) {
  static const bool done = [&] {
    TERN_CUDA(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    return true;
  }();
  (void)done;
}

void gdn_chunked_simt(const float* qkv, const float* g_log, const float* beta, float* state, const GdnDims& d,
                      float* o, cudaStream_t stream, int chunk) {
  TERN_CHECK(chunk >= 1 && chunk <= kMaxChunk, "gdn_chunked: chunk ", chunk, " outside 1..", kMaxChunk);
  TERN_CHECK(d.dv % kChunkDv == 0, "gdn_chunked: dv ", d.dv, " is not a multiple of ", kChunkDv);
  TERN_CHECK(d.dk == 32 || d.dk == 64 || d.dk == 128, "gdn_chunked: key head dim ", d.dk, " not supported (32, 64 or 128)");
  const size_t smem = gdn_chunked_smem_floats(chunk, d.dk) * sizeof(float);
  const dim3 grid(unsigned(d.dv / kChunkDv), unsigned(d.Hv));
  const size_t smem_max = gdn_chunked_smem_floats(kMaxChunk, d.dk) * sizeof(float);  // the largest chunk's need
  auto launch = [&](auto kernel) {
    launch_pdl("gdn_chunked", kernel, grid, dim3(kChunkThreads), smem, stream, qkv, g_log, beta, state, d, o, chunk);
  };
  switch (d.dk) {
    case 32: allow_smem_once<gdn_chunked_kernel<1>>(smem_max); launch(gdn_chunked_kernel<1>); break;
    case 64: allow_smem_once<gdn_chunked_kernel<2>>(smem_max); launch(gdn_chunked_kernel<2>); break;
    default: allow_smem_once<gdn_chunked_kernel<4>>(smem_max); launch(gdn_chunked_kernel<4>); break;
  }
}

template <int BV, int kPrec>
void gdn_chunked_tc(const float* qkv, const float* g_log, const float* beta, float* state, const GdnDims& d, float* o,
                    cudaStream_t stream) {
  const size_t smem = tc::smem_floats<BV>() * sizeof(float);
  allow_smem_once<tc::gdn_chunked_tc_kernel<BV, kPrec>>(smem);
  launch_pdl("gdn_chunked (tensor cores)", tc::gdn_chunked_tc_kernel<BV, kPrec>, dim3(unsigned(d.dv / BV), unsigned(d.Hv)), dim3(tc::kThreads), smem,
             stream, qkv, g_log, beta, state, d, o);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool gdn_chunked_tc_supported(const GdnDims& d, int chunk) {
  return chunk == tc::kL && d.dk == tc::kDk && d.dv % 32 == 0 && d.Hk > 0 && d.Hv % d.Hk == 0;
}

namespace {

// The device's opt-in shared memory per block (0 when unknown). Read once, outside any capture.
int smem_optin() {
  static const int v = [] {
    int dev = 0, x = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&x, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return x;
  }();
  return v;
}

size_t twopass_chunk_bytes(const GdnDims& d) { return size_t(d.Hv) * wy::chunk_floats_per_head() * sizeof(float); }

// T in segments of as many chunks as the workspace holds: per segment, pass 1 over all its chunks, then pass 2.
template <bool kOut3x>
void gdn_chunked_twopass(const float* qkv, const float* g_log, const float* beta, float* state, const GdnDims& d,
                         float* o, cudaStream_t stream, void* workspace, size_t workspace_bytes) {
  const size_t per_chunk = twopass_chunk_bytes(d);
  TERN_CHECK(workspace && workspace_bytes >= per_chunk, "gdn_chunked: the two-pass kernels need a workspace of at "
             "least ", per_chunk, " bytes (got ", workspace_bytes, "; see gdn_chunked_workspace_bytes)");
  TERN_CHECK(aligned16(workspace), "gdn_chunked: workspace not 16-byte aligned");
  const size_t prep_smem = wy::prep_smem_floats() * sizeof(float), seq_smem = wy::seq_smem_floats() * sizeof(float);
  allow_smem_once<wy::gdn_wy_prep_kernel<kOut3x>>(prep_smem);
  allow_smem_once<wy::gdn_wy_seq_kernel<kOut3x>>(seq_smem);
  const int64_t max_chunks = int64_t(workspace_bytes / per_chunk);
  const int64_t seg_tokens = std::min<int64_t>(max_chunks, 65535) * wy::kL;
  const int64_t C = d.C(), ldo = int64_t(d.Hv) * d.dv;
  float* ws = static_cast<float*>(workspace);
  for (int64_t s0 = 0; s0 < d.T; s0 += seg_tokens) {
    GdnDims ds = d;
    ds.T = std::min(seg_tokens, d.T - s0);
    const unsigned nc = unsigned((ds.T + wy::kL - 1) / wy::kL);
    const float* q = qkv + s0 * C;
    launch_pdl("gdn_chunked (two-pass: WY)", wy::gdn_wy_prep_kernel<kOut3x>, dim3(unsigned(d.Hv), nc),
               dim3(wy::kThreads), prep_smem, stream, q, g_log + s0 * d.Hv, beta + s0 * d.Hv, ds, ws);
    launch_pdl("gdn_chunked (two-pass: recurrence)", wy::gdn_wy_seq_kernel<kOut3x>,
               dim3(unsigned(d.dv / wy::kBV), unsigned(d.Hv)), dim3(wy::kThreads), seq_smem, stream, q, state, ds,
               static_cast<const float*>(ws), o + s0 * ldo);
  }
}

}  // namespace

bool gdn_chunked_twopass_supported(const GdnDims& d, int chunk) {
  return chunk == wy::kL && d.dk == wy::kDk && d.dv == wy::kDv && d.Hk > 0 && d.Hv % d.Hk == 0 &&
         size_t(smem_optin()) >= wy::seq_smem_floats() * sizeof(float);
}

size_t gdn_chunked_workspace_bytes(const GdnDims& d, int chunk) {
  if (!gdn_chunked_twopass_supported(d, chunk)) return 0;
  return size_t((std::max<int64_t>(d.T, 1) + wy::kL - 1) / wy::kL) * twopass_chunk_bytes(d);
}

void gdn_chunked(const float* qkv, const float* g_log, const float* beta, float* state, const GdnDims& d, float* o,
                 cudaStream_t stream, int chunk, GdnChunkedKernel kernel, void* workspace, size_t workspace_bytes) {
  if (d.T == 0) return;
  TERN_CHECK(d.Hk > 0 && d.Hv % d.Hk == 0, "gdn_chunked: Hv ", d.Hv, " is not a multiple of Hk ", d.Hk);
  // Slices of 32 value rows need 177 KB of shared memory per block (sm_90: 227 KB); 16 rows need 152 KB (A100).
  const int optin = smem_optin();
  const bool fits32 = size_t(optin) >= tc::smem_floats<32>() * sizeof(float);
  const bool fits16 = size_t(optin) >= tc::smem_floats<16>() * sizeof(float);
  if (kernel == GdnChunkedKernel::automatic) {
    if (gdn_chunked_twopass_supported(d, chunk) && workspace && workspace_bytes >= twopass_chunk_bytes(d) &&
        aligned16(workspace) && aligned16(qkv) && aligned16(state) && aligned16(o))
      kernel = GdnChunkedKernel::twopass_tf32x3;
    else
      kernel = gdn_chunked_tc_supported(d, chunk) && fits16 ? GdnChunkedKernel::tf32x3 : GdnChunkedKernel::simt;
  }
  if (kernel == GdnChunkedKernel::simt) return gdn_chunked_simt(qkv, g_log, beta, state, d, o, stream, chunk);
  if (kernel == GdnChunkedKernel::twopass_tf32x3 || kernel == GdnChunkedKernel::twopass_mixed) {
    TERN_CHECK(gdn_chunked_twopass_supported(d, chunk), "gdn_chunked: the two-pass kernels need chunk 64, dk = dv = "
               "128 and ", wy::seq_smem_floats() * sizeof(float), " bytes of shared memory per block (chunk ", chunk,
               ", dk ", d.dk, ", dv ", d.dv, ", device ", optin, ")");
    TERN_CHECK(aligned16(qkv) && aligned16(state) && aligned16(o), "gdn_chunked: qkv, state and o must be 16-byte aligned");
    if (kernel == GdnChunkedKernel::twopass_tf32x3)
      return gdn_chunked_twopass<true>(qkv, g_log, beta, state, d, o, stream, workspace, workspace_bytes);
    return gdn_chunked_twopass<false>(qkv, g_log, beta, state, d, o, stream, workspace, workspace_bytes);
  }
  TERN_CHECK(gdn_chunked_tc_supported(d, chunk), "gdn_chunked: the tensor-core kernel needs chunk 64, dk 128 and dv a "
             "multiple of 32 (chunk ", chunk, ", dk ", d.dk, ", dv ", d.dv, ")");
  TERN_CHECK(aligned16(qkv) && aligned16(state) && aligned16(o), "gdn_chunked: qkv, state and o must be 16-byte aligned");
  TERN_CHECK(fits16, "gdn_chunked: the tensor-core kernel needs ", tc::smem_floats<16>() * sizeof(float),
             " bytes of shared memory per block; the device offers ", optin);
  switch (kernel) {
    case GdnChunkedKernel::tf32:
      if (fits32) return gdn_chunked_tc<32, 0>(qkv, g_log, beta, state, d, o, stream);
      return gdn_chunked_tc<16, 0>(qkv, g_log, beta, state, d, o, stream);
    case GdnChunkedKernel::tf32x3_slice16: return gdn_chunked_tc<16, tc::kPrecAll>(qkv, g_log, beta, state, d, o, stream);
    default:
      if (fits32) return gdn_chunked_tc<32, tc::kPrecAll>(qkv, g_log, beta, state, d, o, stream);
      return gdn_chunked_tc<16, tc::kPrecAll>(qkv, g_log, beta, state, d, o, stream);
  }
}

void gdn_gated_norm(const float* o, const float* z, const float* w, float eps, const GdnDims& d, float* out,
                    cudaStream_t stream) {
  if (d.T == 0) return;
  launch_pdl("gdn_gated_norm", gdn_gated_norm_kernel, dim3(blocks_for(d.T * d.Hv, 8)), dim3(256), 0, stream, o, z, w,
             eps, d, out);
}

namespace {

// One gdn_decode launch of shape (CS blocks per key head in a cluster, NW warps, RPW rows per warp); CS = 1: plain.
template <int CS, int NW, int RPW, int kTaps>
void launch_decode(const GdnDecodeArgs& a, cudaStream_t stream) {
  auto kernel = gdn_decode_kernel<CS, NW, RPW, kTaps>;
  if constexpr (CS == 1) {
    launch_pdl("gdn_decode", kernel, dim3(1, unsigned(a.d.Hk)), dim3(NW * 32), 0, stream, a);
  } else {
    if constexpr (CS > 8) {  // non-portable cluster size: allowed once, outside any capture (the first call is eager)
      static const bool allowed = [&] {
        TERN_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
        return true;
      }();
      (void)allowed;
    }
    launch_cluster_pdl("gdn_decode (cluster)", kernel, dim3(CS, unsigned(a.d.Hk)), dim3(NW * 32), CS, 0, stream, a);
  }
}

}  // namespace

bool gdn_decode_supported(const GdnDims& d) {
  return d.dk == kDecodeDk && d.dv == kDecodeDv && d.Hk > 0 && d.Hv == kDecodeRatio * d.Hk;
}

void gdn_decode(const GdnDecodeArgs& a, cudaStream_t stream) {
  const GdnDims& d = a.d;
  if (d.T == 0) return;
  TERN_CHECK(d.T >= 1 && d.T <= kDecodeMaxT, "gdn_decode: ", d.T, " tokens (1..", kDecodeMaxT, ")");
  TERN_CHECK(gdn_decode_supported(d),
             "gdn_decode: needs dk = dv = 128 and Hv = 2·Hk (got dk ", d.dk, ", dv ", d.dv, ", Hk ", d.Hk, ", Hv ",
             d.Hv, ")");
  TERN_CHECK(a.Ck >= 1 && a.Ck <= kDecodeMaxTaps, "gdn_decode: conv width ", a.Ck, " not in [1, ", kDecodeMaxTaps,
             "]");
  TERN_CHECK(a.ld_proj >= d.C() + int64_t(d.Hv) * d.dv + 2 * d.Hv, "gdn_decode: ld_proj ", a.ld_proj, " too small");
  TERN_CHECK(a.proj && a.conv_w && (a.Ck == 1 || a.conv_state) && a.rec_state && a.A_log && a.dt_bias && a.norm_w &&
                 a.out,
             "gdn_decode: null pointer");
  TERN_CHECK(reinterpret_cast<uintptr_t>(a.rec_state) % 16 == 0, "gdn_decode: state not 16-byte aligned");
  using K = GdnDecodeArgs::Kernel;
  // The cluster shapes run when the binary chosen for this device is sm_90+ (not a JIT of the sm_80 PTX). Decided
  // once, outside any capture (no stream work).
  static const bool cluster_ok = [] {
    cudaFuncAttributes fa{};
    if (cudaFuncGetAttributes(&fa, gdn_decode_kernel<kDecodeClusterCS, kDecodeClusterNW, kDecodeClusterRPW, 4>) !=
        cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return fa.binaryVersion >= 90;
  }();
  K kind = a.force_portable ? K::portable : a.kernel;
  if (kind == K::automatic) kind = K::cluster4_w16;  // fastest in the workbench (H200, 2026-12-01: 5.2 µs vs 6.2 for cluster8_w8)
  if (!cluster_ok) kind = K::portable;
  const bool short_conv = a.Ck <= 4;  // the model's width 4: fewer registers
  switch (kind) {
    case K::cluster8_w16:
      return short_conv ? launch_decode<8, 16, 2, 4>(a, stream) : launch_decode<8, 16, 2, 8>(a, stream);
    case K::cluster16_w8:
      return short_conv ? launch_decode<16, 8, 2, 4>(a, stream) : launch_decode<16, 8, 2, 8>(a, stream);
    case K::cluster4_w16:
      return short_conv ? launch_decode<4, 16, 4, 4>(a, stream) : launch_decode<4, 16, 4, 8>(a, stream);
    case K::portable:
      return short_conv ? launch_decode<1, kDecodePortableNW, kDecodePortableRPW, 4>(a, stream)
                        : launch_decode<1, kDecodePortableNW, kDecodePortableRPW, 8>(a, stream);
    default:
      return short_conv ? launch_decode<kDecodeClusterCS, kDecodeClusterNW, kDecodeClusterRPW, 4>(a, stream)
                        : launch_decode<kDecodeClusterCS, kDecodeClusterNW, kDecodeClusterRPW, 8>(a, stream);
  }
}

}  // namespace tern::cuda
