#include "cuda/gdn.cuh"

#include "core/check.h"
#include "cuda/cuda_common.cuh"

namespace tern::cuda {
namespace {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void gdn_prepare_kernel(float* qkv, const float* b, const float* a, const float* A_log, const float* dt_bias,
                                   GdnDims d, float* g_log, float* beta) {
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

constexpr int kRowsPerWarp = 4, kWarps = 4;  // a block owns 16 state rows of one v-head

// Each lane holds KPL consecutive key dims of kRowsPerWarp state rows in registers for the whole token loop.
template <int KPL>
__global__ void __launch_bounds__(kWarps * 32) gdn_recurrent_kernel(const float* qkv, const float* g_log,
                                                                    const float* beta, float* state, GdnDims d, float* o) {
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

}  // namespace

void gdn_prepare(float* qkv, const float* b, const float* a, const float* A_log, const float* dt_bias, const GdnDims& d,
                 float* g_log, float* beta, cudaStream_t stream) {
  if (d.T == 0) return;
  gdn_prepare_kernel<<<unsigned(d.T), 256, 0, stream>>>(qkv, b, a, A_log, dt_bias, d, g_log, beta);
  TERN_CUDA_LAUNCHED("gdn_prepare");
}

void gdn_recurrent(const float* qkv, const float* g_log, const float* beta, float* state, const GdnDims& d, float* o,
                   cudaStream_t stream) {
  TERN_CHECK(d.dv % (kRowsPerWarp * kWarps) == 0, "gdn: dv ", d.dv, " is not a multiple of ", kRowsPerWarp * kWarps);
  TERN_CHECK(d.Hk > 0 && d.Hv % d.Hk == 0, "gdn: Hv ", d.Hv, " is not a multiple of Hk ", d.Hk);
  const dim3 grid(unsigned(d.dv / (kRowsPerWarp * kWarps)), unsigned(d.Hv));
  switch (d.dk) {
    case 32: gdn_recurrent_kernel<1><<<grid, kWarps * 32, 0, stream>>>(qkv, g_log, beta, state, d, o); break;
    case 64: gdn_recurrent_kernel<2><<<grid, kWarps * 32, 0, stream>>>(qkv, g_log, beta, state, d, o); break;
    case 128: gdn_recurrent_kernel<4><<<grid, kWarps * 32, 0, stream>>>(qkv, g_log, beta, state, d, o); break;
    default: TERN_FAIL("gdn: key head dim ", d.dk, " not supported by the CUDA kernel (32, 64 or 128)");
  }
  TERN_CUDA_LAUNCHED("gdn_recurrent");
}

void gdn_gated_norm(const float* o, const float* z, const float* w, float eps, const GdnDims& d, float* out,
                    cudaStream_t stream) {
  if (d.T == 0) return;
  gdn_gated_norm_kernel<<<blocks_for(d.T * d.Hv, 8), 256, 0, stream>>>(o, z, w, eps, d, out);
  TERN_CUDA_LAUNCHED("gdn_gated_norm");
}

}  // namespace tern::cuda
