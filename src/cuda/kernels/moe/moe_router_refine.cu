#include "cuda/kernels/moe/moe_router_refine.cuh"

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/warp_reduce.cuh"
#include "cuda/weights/dmat_device.cuh"

namespace tern::cuda {
namespace {

constexpr int kMaxExpertsPerLane = 32;  // E <= 1024
constexpr int kWarps = 4;               // tokens per block of moe_router_refine

// One block per group of 64 columns: the largest Σ_{j in g} |w_ej| over the rows.
template <WeightFormat F>
__global__ void __launch_bounds__(256) group_bounds_kernel(DMat w, float* bounds) {
  __shared__ float s_max[8];
  const int g = blockIdx.x;
  float best = 0.0f;
  for (int64_t e = threadIdx.x; e < w.rows; e += blockDim.x) {
    float sum = 0.0f, v[8];
    for (int c = 0; c < 64; c += 8) {
      dmat_load8<F>(w, 0, e, int64_t(g) * 64 + c, v);
#pragma unroll
      for (int j = 0; j < 8; ++j) sum += fabsf(v[j]);
    }
    best = fmaxf(best, sum);
  }
  best = warp_max(best);
  if (threadIdx.x % 32 == 0) s_max[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 1; i < int(blockDim.x / 32); ++i) best = fmaxf(best, s_max[i]);
    bounds[g] = best;
  }
}

// A warp per token: the k-th and (k+1)-th largest logits (k + 1 rounds of a warp arg-max), the bound B from x's group
// maxima, and where the gap is within 2.5·B the token's E logits from x in fp32 (a warp per logit, lanes over
// columns, in order).
template <WeightFormat F>
__global__ void __launch_bounds__(kWarps * 32)
    refine_kernel(const float* x, int64_t ldx, DMat w, const float* bounds, float* logits, int64_t T, int k,
                  int* refined) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = int64_t(blockIdx.x) * kWarps + warp;
  if (t >= T) return;
  const int E = int(w.rows);
  const int64_t D = w.cols;
  float* row = logits + t * E;
  const float* xr = x + t * ldx;
  float v[kMaxExpertsPerLane];
#pragma unroll
  for (int i = 0; i < kMaxExpertsPerLane; ++i) v[i] = lane + 32 * i < E ? row[lane + 32 * i] : -INFINITY;
  float kth = -INFINITY, next = -INFINITY;
  for (int j = 0; j <= k; ++j) {
    float best = -INFINITY;
    int best_i = 0;
#pragma unroll
    for (int i = 0; i < kMaxExpertsPerLane; ++i)
      if (v[i] > best) {
        best = v[i];
        best_i = i;
      }
    const float m = warp_max(best);
    const unsigned holders = __ballot_sync(0xffffffffu, best == m);
    const bool taker = lane == __ffs(holders) - 1;  // one holder per round takes its value out
#pragma unroll
    for (int i = 0; i < kMaxExpertsPerLane; ++i)
      if (taker && i == best_i) v[i] = -INFINITY;
    if (j == k - 1) kth = m;
    if (j == k) next = m;
  }
  float b = 0.0f;
  for (int64_t g = lane; g < D / 64; g += 32) {
    float m = 0.0f;
    const float4* p = reinterpret_cast<const float4*>(xr + g * 64);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const float4 f = p[i];
      m = fmaxf(m, fmaxf(fmaxf(fabsf(f.x), fabsf(f.y)), fmaxf(fabsf(f.z), fabsf(f.w))));
    }
    b += m * bounds[g];
  }
  b = warp_sum(b) * (1.0f / 65278.0f);
  const float gap = kth - next;
  if (!(gap <= 2.5f * b + 1e-6f * fabsf(kth))) return;  // far apart (or not finite): the choice stands
  if (refined && lane == 0) atomicAdd(refined, 1);
  for (int e = 0; e < E; ++e) {
    float acc = 0.0f, wv[8];
    for (int64_t c = int64_t(lane) * 8; c < D; c += 256) {
      dmat_load8<F>(w, 0, e, c, wv);
      const float4 a = *reinterpret_cast<const float4*>(xr + c), bq = *reinterpret_cast<const float4*>(xr + c + 4);
      acc += wv[0] * a.x + wv[1] * a.y + wv[2] * a.z + wv[3] * a.w + wv[4] * bq.x + wv[5] * bq.y + wv[6] * bq.z +
             wv[7] * bq.w;
    }
    acc = warp_sum(acc);
    if (lane == 0) row[e] = acc;
  }
}

void check_router(const DMat& w, const char* what) {
  TERN_CHECK(moe_router_refine_takes(w), what, ": needs one router matrix of 1..", 32 * kMaxExpertsPerLane,
             " rows, columns a multiple of 64 and affine weights of group 64 (got ", w.rows, "x", w.cols, ", group ",
             w.group_size, ")");
}

}  // namespace

bool moe_router_refine_takes(const DMat& w) {
  return w.experts <= 1 && w.rows >= 1 && w.rows <= 32 * kMaxExpertsPerLane && w.cols % 64 == 0 &&
         (w.format == WeightFormat::f32 || w.format == WeightFormat::bf16 || w.group_size == 64);
}

void router_group_bounds(const DMat& router, float* bounds, cudaStream_t stream) {
  check_router(router, "router_group_bounds");
  const dim3 grid(unsigned(router.cols / 64));
  switch (router.format) {
    case WeightFormat::affine4: group_bounds_kernel<WeightFormat::affine4><<<grid, 256, 0, stream>>>(router, bounds); break;
    case WeightFormat::affine8: group_bounds_kernel<WeightFormat::affine8><<<grid, 256, 0, stream>>>(router, bounds); break;
    case WeightFormat::bf16: group_bounds_kernel<WeightFormat::bf16><<<grid, 256, 0, stream>>>(router, bounds); break;
    case WeightFormat::f32: group_bounds_kernel<WeightFormat::f32><<<grid, 256, 0, stream>>>(router, bounds); break;
  }
  TERN_CUDA_LAUNCHED("router_group_bounds");
}

void moe_router_refine(const float* x, int64_t ldx, const DMat& router, const float* bounds, float* logits, int64_t T,
                       int k, int* refined, cudaStream_t stream) {
  if (T <= 0) return;
  check_router(router, "moe_router_refine");
  TERN_CHECK(k >= 1 && k < router.rows, "moe_router_refine: k = ", k, " of ", router.rows, " experts");
  TERN_CHECK(ldx >= router.cols && ldx % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0,
             "moe_router_refine: x must be 16-byte aligned with a row stride of at least ", router.cols,
             " floats, a multiple of 4 (got ", ldx, ")");
  const dim3 grid(blocks_for(T, kWarps));
  switch (router.format) {
    case WeightFormat::affine4:
      refine_kernel<WeightFormat::affine4><<<grid, kWarps * 32, 0, stream>>>(x, ldx, router, bounds, logits, T, k, refined);
      break;
    case WeightFormat::affine8:
      refine_kernel<WeightFormat::affine8><<<grid, kWarps * 32, 0, stream>>>(x, ldx, router, bounds, logits, T, k, refined);
      break;
    case WeightFormat::bf16:
      refine_kernel<WeightFormat::bf16><<<grid, kWarps * 32, 0, stream>>>(x, ldx, router, bounds, logits, T, k, refined);
      break;
    case WeightFormat::f32:
      refine_kernel<WeightFormat::f32><<<grid, kWarps * 32, 0, stream>>>(x, ldx, router, bounds, logits, T, k, refined);
      break;
  }
  TERN_CUDA_LAUNCHED("moe_router_refine");
}

}  // namespace tern::cuda
