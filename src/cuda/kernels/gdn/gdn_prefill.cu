// The prefill plan's Gated DeltaNet kernels (gdn.cuh): the q/k norms and gates (gdn_prepare, or gdn_gates after
// conv1d_silu_qknorm), the recurrence token by token (gdn_recurrent, for chunks under 64 tokens) or in the chunked
// form (gdn_chunked: the fp32 SIMT kernel here, the one-pass tensor-core kernels in gdn_chunked_tc.cuh, the two-pass
// ones in gdn_chunked_twopass.cuh), and the gated RMSNorm. The decode plan runs them too for head shapes that
// gdn_decode (gdn_decode.cu) does not take. One translation unit for all of them: a module with dynamic shared memory
// gives each of its kernels the 1 KB reserved shared-memory window (sm_90), and the small kernels keep theirs.
#include "cuda/kernels/gdn/gdn.cuh"

#include <algorithm>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/warp_reduce.cuh"
#include "cuda/kernels/gdn/gdn_chunked_tc.cuh"
#include "cuda/kernels/gdn/gdn_chunked_twopass.cuh"

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
  const int64_t ba = t * d.ba_stride();
  for (int h = threadIdx.x; h < d.Hv; h += blockDim.x) {
    const float x = a[ba + h] + dt_bias[h];
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    g_log[t * d.Hv + h] = -expf(A_log[h]) * sp;
    beta[t * d.Hv + h] = 1.0f / (1.0f + expf(-b[ba + h]));
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
  const int64_t ba = (i / d.Hv) * d.ba_stride() + h;
  const float x = a[ba] + dt_bias[h];
  const float sp = x > 20.0f ? x : log1pf(expf(x));
  g_log[i] = -expf(A_log[h]) * sp;
  beta[i] = 1.0f / (1.0f + expf(-b[ba]));
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
  const float* zh = z + (task / d.Hv) * d.z_stride() + (task % d.Hv) * d.dv;  // z of token t, head h
  float ss = 0.0f;
  for (int i = lane; i < d.dv; i += 32) ss += o[base + i] * o[base + i];
  const float inv = rsqrtf(warp_sum(ss) / float(d.dv) + eps);
  for (int i = lane; i < d.dv; i += 32) {
    const float zz = zh[i];
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
        x = warp_inclusive_sum(x, lane);
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

}  // namespace

bool gdn_chunked_tc_supported(const GdnDims& d, int chunk) {
  return chunk == tc::kL && d.dk == tc::kDk && d.dv % 32 == 0 && d.Hk > 0 && d.Hv % d.Hk == 0;
}

namespace {

// The device's opt-in shared memory per block (0 when unknown). Read once, outside any capture.
int smem_optin() { return smem_optin_bytes(); }

}  // namespace

bool gdn_chunked_tc_fits() { return size_t(smem_optin()) >= tc::smem_floats<16>() * sizeof(float); }

namespace {

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

}  // namespace tern::cuda
