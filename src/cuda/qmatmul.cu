#include "cuda/qmatmul.cuh"

#include "cuda/dmat_device.cuh"

namespace tern::cuda {
namespace {

constexpr int kGemvWarps = 8;  // rows per block (one warp per row)

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One warp per output row. 4-bit rows are read 16 bytes (32 weights) per lane per step; the bias of each group
// is applied once as b·Σx (w = s·q + b).
__global__ void gemv_affine4_kernel(GemvArgs a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kGemvWarps + warp;
  const int slot = blockIdx.y;
  if (row >= a.w.rows) return;
  const int64_t e = a.ids ? a.ids[slot] : 0;
  const float* x = a.x + slot * a.x_stride;
  const int64_t r = e * a.w.rows + row;
  const uint4* words = reinterpret_cast<const uint4*>(static_cast<const uint32_t*>(a.w.data) + r * a.w.row_words);
  const uint16_t* sc = a.w.scales + r * a.w.groups_per_row;
  const uint16_t* bi = a.w.biases + r * a.w.groups_per_row;
  const int64_t nvec = a.w.cols / 32;
  float acc = 0.0f;
  for (int64_t v = lane; v < nvec; v += 32) {
    const uint4 q = words[v];
    const int64_t g = v * 32 / a.w.group_size;
    const float4* xv = reinterpret_cast<const float4*>(x + v * 32);
    const uint32_t qw[4] = {q.x, q.y, q.z, q.w};
    float sxq = 0.0f, sx = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float4 x0 = xv[2 * j], x1 = xv[2 * j + 1];
      const uint32_t w = qw[j];
      sxq += x0.x * float(w & 15u) + x0.y * float((w >> 4) & 15u) + x0.z * float((w >> 8) & 15u) +
             x0.w * float((w >> 12) & 15u) + x1.x * float((w >> 16) & 15u) + x1.y * float((w >> 20) & 15u) +
             x1.z * float((w >> 24) & 15u) + x1.w * float(w >> 28);
      sx += x0.x + x0.y + x0.z + x0.w + x1.x + x1.y + x1.z + x1.w;
    }
    acc += bf16_bits_to_float(sc[g]) * sxq + bf16_bits_to_float(bi[g]) * sx;
  }
  acc = warp_sum(acc);
  if (lane == 0) {
    float* y = a.y + slot * a.y_stride + row;
    *y = a.accumulate ? *y + acc : acc;
  }
}

template <WeightFormat F>
__global__ void gemv_generic_kernel(GemvArgs a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kGemvWarps + warp;
  const int slot = blockIdx.y;
  if (row >= a.w.rows) return;
  const int64_t e = a.ids ? a.ids[slot] : 0;
  const float* x = a.x + slot * a.x_stride;
  float acc = 0.0f;
  for (int64_t c = lane * 8; c < a.w.cols; c += 256) {
    float wv[8];
    dmat_load8<F>(a.w, e, row, c, wv);
    const float4 x0 = *reinterpret_cast<const float4*>(x + c), x1 = *reinterpret_cast<const float4*>(x + c + 4);
    acc += wv[0] * x0.x + wv[1] * x0.y + wv[2] * x0.z + wv[3] * x0.w + wv[4] * x1.x + wv[5] * x1.y + wv[6] * x1.z +
           wv[7] * x1.w;
  }
  acc = warp_sum(acc);
  if (lane == 0) {
    float* y = a.y + slot * a.y_stride + row;
    *y = a.accumulate ? *y + acc : acc;
  }
}

// 64 weight rows × 64 tokens per block, k-steps of 32; each of 256 threads owns a 4×4 output patch.
constexpr int BN = 64, BT = kMatmulTileTokens, BK = 32;

template <WeightFormat F>
__global__ void __launch_bounds__(256) matmul_kernel(MatmulArgs a) {
  __shared__ float ws[BK][BN + 4];
  __shared__ float xs[BK][BT + 4];
  __shared__ int xrow[BT];
  const int tid = threadIdx.x;
  const int64_t n0 = int64_t(blockIdx.x) * BN;
  int64_t expert = 0, p0, count;
  if (a.tile_expert) {
    if (int(blockIdx.y) >= *a.num_tiles) return;
    expert = a.tile_expert[blockIdx.y];
    p0 = a.tile_start[blockIdx.y];
    count = a.tile_count[blockIdx.y];
  } else {
    p0 = int64_t(blockIdx.y) * BT;
    count = a.tokens - p0 < BT ? a.tokens - p0 : BT;
  }
  if (tid < BT) xrow[tid] = tid < count ? (a.gather ? a.gather[p0 + tid] : int(p0 + tid)) : -1;
  __syncthreads();

  const int tx = tid % 16, ty = tid / 16;
  float acc[4][4] = {};
  const int lrow = tid / 4, lc8 = (tid % 4) * 8;  // weight chunk this thread loads
  for (int64_t k0 = 0; k0 < a.w.cols; k0 += BK) {
    {
      float wv[8];
      if (n0 + lrow < a.w.rows) {
        dmat_load8<F>(a.w, expert, n0 + lrow, k0 + lc8, wv);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) wv[j] = 0.0f;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) ws[lc8 + j][lrow] = wv[j];
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int idx = tid + i * 256, t = idx / 8, k4 = (idx % 8) * 4;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (xrow[t] >= 0) v = *reinterpret_cast<const float4*>(a.x + int64_t(xrow[t]) * a.ldx + k0 + k4);
      xs[k4][t] = v.x;
      xs[k4 + 1][t] = v.y;
      xs[k4 + 2][t] = v.z;
      xs[k4 + 3][t] = v.w;
    }
    __syncthreads();
#pragma unroll 8
    for (int k = 0; k < BK; ++k) {
      const float4 wv = *reinterpret_cast<const float4*>(&ws[k][tx * 4]);
      const float4 xv = *reinterpret_cast<const float4*>(&xs[k][ty * 4]);
      const float wa[4] = {wv.x, wv.y, wv.z, wv.w}, xa[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += wa[i] * xa[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int t = ty * 4 + j;
    if (t >= count) continue;
    float* yr = a.y + (p0 + t) * a.ldy;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t n = n0 + tx * 4 + i;
      if (n < a.w.rows) yr[n] = a.accumulate ? yr[n] + acc[i][j] : acc[i][j];
    }
  }
}

}  // namespace

void gemv(const GemvArgs& a, cudaStream_t stream) {
  if (a.slots <= 0 || a.w.rows == 0) return;
  const dim3 grid(blocks_for(a.w.rows, kGemvWarps), unsigned(a.slots));
  switch (a.w.format) {
    case WeightFormat::affine4: gemv_affine4_kernel<<<grid, kGemvWarps * 32, 0, stream>>>(a); break;
    case WeightFormat::affine8: gemv_generic_kernel<WeightFormat::affine8><<<grid, kGemvWarps * 32, 0, stream>>>(a); break;
    case WeightFormat::bf16: gemv_generic_kernel<WeightFormat::bf16><<<grid, kGemvWarps * 32, 0, stream>>>(a); break;
    case WeightFormat::f32: gemv_generic_kernel<WeightFormat::f32><<<grid, kGemvWarps * 32, 0, stream>>>(a); break;
  }
  TERN_CUDA_LAUNCHED("gemv");
}

void matmul(const MatmulArgs& a, cudaStream_t stream) {
  const unsigned gy = a.tile_expert ? unsigned(a.max_tiles) : blocks_for(a.tokens, BT);
  if (gy == 0 || a.w.rows == 0) return;
  TERN_CHECK(gy <= 65535, "matmul: ", gy, " token tiles exceed the grid limit");
  const dim3 grid(blocks_for(a.w.rows, BN), gy);
  switch (a.w.format) {
    case WeightFormat::affine4: matmul_kernel<WeightFormat::affine4><<<grid, 256, 0, stream>>>(a); break;
    case WeightFormat::affine8: matmul_kernel<WeightFormat::affine8><<<grid, 256, 0, stream>>>(a); break;
    case WeightFormat::bf16: matmul_kernel<WeightFormat::bf16><<<grid, 256, 0, stream>>>(a); break;
    case WeightFormat::f32: matmul_kernel<WeightFormat::f32><<<grid, 256, 0, stream>>>(a); break;
  }
  TERN_CUDA_LAUNCHED("matmul");
}

}  // namespace tern::cuda
