#include "cuda/kernels/norm/norm.cuh"

#include "core/check.h"
#include "cuda/common/warp_reduce.cuh"
#include "cuda/kernels/qmatmul/qmatmul.cuh"
#include "cuda/kernels/qmatmul/qmatmul_int8.cuh"
#include "cuda/kernels/qmatmul/qmatmul_wgmma.cuh"
#include "cuda/kernels/qmatmul/x_forms.cuh"
#include "cuda/weights/dmat_device.cuh"

namespace tern::cuda {
namespace {

template <WeightFormat F>
__global__ void embed_kernel(DMat e, const int* tokens, float* out) {
  const int64_t t = blockIdx.x;
  const int64_t row = tokens[t];
  float* o = out + t * e.cols;
  for (int64_t c = threadIdx.x * 8; c < e.cols; c += blockDim.x * 8) {
    float v[8];
    dmat_load8<F>(e, 0, row, c, v);
#pragma unroll
    for (int j = 0; j < 8; ++j) o[c + j] = v[j];
  }
}

// The block's sum (Max: max) of v: each warp's (warp_sum, warp_max), then the warps' in order, the same in every
// thread (deterministic). red: 32 floats of shared memory.
template <bool Max>
__device__ __forceinline__ float block_reduce(float v, float* red) {
  if constexpr (Max) {
    v = warp_max(v);
  } else {
    v = warp_sum(v);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = 0.0f;
  for (int i = 0; i < nw; ++i) {
    if constexpr (Max) {
      r = fmaxf(r, red[i]);
    } else {
      r += red[i];
    }
  }
  return r;
}
__device__ __forceinline__ float block_sum(float v, float* red) { return block_reduce<false>(v, red); }
__device__ __forceinline__ float block_max(float v, float* red) { return block_reduce<true>(v, red); }

__global__ void rmsnorm_kernel(const float* x, const float* w, float eps, int64_t D, float* out) {
  __shared__ float red[32];
  const float* xr = x + int64_t(blockIdx.x) * D;
  float* o = out + int64_t(blockIdx.x) * D;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) ss += xr[i] * xr[i];
  const float inv = rsqrtf(block_sum(ss, red) / float(D) + eps);
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) o[i] = xr[i] * inv * w[i];
}

// rmsnorm_kernel on 16-byte pieces (D % 4 == 0, aligned rows): a 4K-token prefill's norm reads 33.5 MB and writes as
// much, twice per layer; the scalar loop ran at ~2.3 TB/s (28 µs).
__global__ void rmsnorm4_kernel(const float* x, const float* w, float eps, int64_t D, float* out) {
  __shared__ float red[32];
  const float4* xr = reinterpret_cast<const float4*>(x + int64_t(blockIdx.x) * D);
  const float4* w4 = reinterpret_cast<const float4*>(w);
  float4* o = reinterpret_cast<float4*>(out + int64_t(blockIdx.x) * D);
  const int64_t n = D / 4;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float4 v = xr[i];
    ss = fmaf(v.x, v.x, fmaf(v.y, v.y, fmaf(v.z, v.z, fmaf(v.w, v.w, ss))));
  }
  const float inv = rsqrtf(block_sum(ss, red) / float(D) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float4 v = xr[i], g = w4[i];
    o[i] = make_float4(v.x * inv * g.x, v.y * inv * g.y, v.z * inv * g.z, v.w * inv * g.w);
  }
}

// rmsnorm_prepare: a row per block of 256 threads; thread i holds the row's 8-column words i, i + 256, ... (at most
// kPrepareWords of them) from the one read of x to the last store. The 8 words of a group of 64 columns lie in 8
// consecutive lanes, as the preparing kernels' shuffles need.
constexpr int kPrepareThreads = 256, kPrepareWords = 4;
__global__ void __launch_bounds__(kPrepareThreads) rmsnorm_prepare_kernel(const float* x, const float* w, float eps,
                                                                          int64_t D, float* normed, unsigned char* split,
                                                                          unsigned char* q16, unsigned char* q16_rest,
                                                                          unsigned char* f16x2) {
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  const int words = int(D / 8);
  const float4* xr = reinterpret_cast<const float4*>(x + t * D);
  float v[kPrepareWords][8];
  float ss = 0.0f, m = 0.0f;
#pragma unroll
  for (int p = 0; p < kPrepareWords; ++p) {
    const int wd = int(threadIdx.x) + p * kPrepareThreads;
    float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a;
    if (wd < words) {
      a = xr[2 * wd];
      b = xr[2 * wd + 1];
    }
    const float e[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      v[p][i] = e[i];
      ss = fmaf(e[i], e[i], ss);
    }
  }
  const float inv = rsqrtf(block_sum(ss, red) / float(D) + eps);
  const float4* w4 = reinterpret_cast<const float4*>(w);
  float4* out = reinterpret_cast<float4*>(normed + t * D);
#pragma unroll
  for (int p = 0; p < kPrepareWords; ++p) {
    if (p * kPrepareThreads >= words) break;  // uniform: whole warps stay together for the shuffles below
    const int wd = int(threadIdx.x) + p * kPrepareThreads;
    const bool in = wd < words;
    float y[8] = {};
    if (in) {
      const float4 g0 = w4[2 * wd], g1 = w4[2 * wd + 1];
      const float g[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) y[i] = v[p][i] * inv * g[i];
      out[2 * wd] = make_float4(y[0], y[1], y[2], y[3]);
      out[2 * wd + 1] = make_float4(y[4], y[5], y[6], y[7]);
    }
    if (split) xform::store_split_word(split + t * matmul_prepared_row_bytes(D), D, wd, y, in);
    if (q16) {
      const int64_t qrow = t * matmul_q16_row_bytes(D);
      xform::store_q16_words(q16 + qrow, q16_rest ? q16_rest + qrow : nullptr, D, wd, y, in);
    }
    if (f16x2) {  // keep the normed values for the pass below, and their largest magnitude
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        v[p][i] = y[i];
        m = fmaxf(m, fabsf(y[i]));
      }
    }
  }
  if (!f16x2) return;  // uniform over the grid
  // fp16 hi + lo needs the row's max|normed| (its scale σ) before the first word: a second pass over the registers.
  float sigma;
  const float inv_sigma = xform::f16_row_scale(block_max(m, red), sigma);
  unsigned char* row = f16x2 + t * matmul_f16x2_row_bytes(D);
#pragma unroll
  for (int p = 0; p < kPrepareWords; ++p) {
    if (p * kPrepareThreads >= words) break;  // uniform, as above
    const int wd = int(threadIdx.x) + p * kPrepareThreads;
    xform::store_f16_word<true>(row, D, wd, v[p], inv_sigma, wd < words);
  }
  if (threadIdx.x == 0) xform::store_f16_sigma<true>(row, D, sigma);
}

}  // namespace

void embed_lookup(const DMat& e, const int* tokens, int64_t T, float* out, cudaStream_t stream) {
  if (T == 0) return;
  const unsigned grid = unsigned(T);
  switch (e.format) {
    case WeightFormat::affine4: embed_kernel<WeightFormat::affine4><<<grid, 256, 0, stream>>>(e, tokens, out); break;
    case WeightFormat::affine8: embed_kernel<WeightFormat::affine8><<<grid, 256, 0, stream>>>(e, tokens, out); break;
    case WeightFormat::bf16: embed_kernel<WeightFormat::bf16><<<grid, 256, 0, stream>>>(e, tokens, out); break;
    case WeightFormat::f32: embed_kernel<WeightFormat::f32><<<grid, 256, 0, stream>>>(e, tokens, out); break;
  }
  TERN_CUDA_LAUNCHED("embed_lookup");
}

void rmsnorm(const float* x, const float* w, float eps, int64_t T, int64_t D, float* out, cudaStream_t stream) {
  if (T == 0) return;
  if (D % 4 == 0 && aligned16(x) && aligned16(w) && aligned16(out))
    rmsnorm4_kernel<<<unsigned(T), 256, 0, stream>>>(x, w, eps, D, out);
  else
    rmsnorm_kernel<<<unsigned(T), 256, 0, stream>>>(x, w, eps, D, out);
  TERN_CUDA_LAUNCHED("rmsnorm");
}

bool rmsnorm_prepare_takes(int64_t D) { return D > 0 && D % 128 == 0 && D <= 8 * kPrepareThreads * kPrepareWords; }

void rmsnorm_prepare(const float* x, const float* w, float eps, int64_t T, int64_t D, float* normed, void* split,
                     void* q16, void* q16_rest, cudaStream_t stream, void* f16x2) {
  TERN_CHECK(rmsnorm_prepare_takes(D), "rmsnorm_prepare: ", D, " columns (a multiple of 128, at most ",
             8 * kPrepareThreads * kPrepareWords, ")");
  TERN_CHECK(aligned16(x) && aligned16(w) && aligned16(normed) && aligned16(split) && aligned16(q16) &&
                 aligned16(q16_rest) && aligned16(f16x2) && (q16 || !q16_rest) && x != normed,
             "rmsnorm_prepare: needs 16-byte aligned buffers, q16 with q16_rest, and normed apart from x");
  TERN_CHECK(!f16x2 || D % 256 == 0, "rmsnorm_prepare: fp16 hi + lo needs a multiple of 256 columns (as ",
             "matmul_prepare_x_f16x2); got ", D);
  if (T == 0) return;
  rmsnorm_prepare_kernel<<<unsigned(T), kPrepareThreads, 0, stream>>>(
      x, w, eps, D, normed, static_cast<unsigned char*>(split), static_cast<unsigned char*>(q16),
      static_cast<unsigned char*>(q16_rest), static_cast<unsigned char*>(f16x2));
  TERN_CUDA_LAUNCHED("rmsnorm_prepare");
}

}  // namespace tern::cuda
