#include "cuda/qmatmul.cuh"

#include "cuda/dmat_device.cuh"

namespace tern::cuda {
namespace {

constexpr int kGemvWarps = 8;        // warps per block
constexpr int kGemvRowsPerWarp = 4;  // rows per warp: each x chunk read once serves 4 rows
constexpr int kGemvRowsPerBlock = kGemvWarps * kGemvRowsPerWarp;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// A warp owns kGemvRowsPerWarp consecutive rows. Lane l reads the 4-bit words l, l+32, ... of each row (coalesced
// 128 B per warp per row) and the matching 8 activations once for all its rows. w = s·q + b, so each word adds
// s·Σx·q + b·Σx.
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_affine4_kernel(GemvArgs a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row0 = int64_t(blockIdx.x) * kGemvRowsPerBlock + warp * kGemvRowsPerWarp;
  const int slot = blockIdx.y;
  if (row0 >= a.w.rows) return;
  const int64_t e = a.ids ? a.ids[slot] : 0;
  const float* x = a.x + slot * a.x_stride;
  const int64_t nrows = a.w.rows - row0 < kGemvRowsPerWarp ? a.w.rows - row0 : kGemvRowsPerWarp;
  const uint32_t* words[kGemvRowsPerWarp];
  const uint16_t *sc[kGemvRowsPerWarp], *bi[kGemvRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kGemvRowsPerWarp; ++r) {
    const int64_t rr = e * a.w.rows + row0 + (r < nrows ? r : 0);
    words[r] = static_cast<const uint32_t*>(a.w.data) + rr * a.w.row_words;
    sc[r] = a.w.scales + rr * a.w.groups_per_row;
    bi[r] = a.w.biases + rr * a.w.groups_per_row;
  }
  const int words_per_group = a.w.group_size / 8;
  float acc[kGemvRowsPerWarp] = {};
#pragma unroll 2
  for (int64_t w = lane; w < a.w.row_words; w += 32) {
    const float4 x0 = *reinterpret_cast<const float4*>(x + w * 8), x1 = *reinterpret_cast<const float4*>(x + w * 8 + 4);
    const float sx = x0.x + x0.y + x0.z + x0.w + x1.x + x1.y + x1.z + x1.w;
    const int64_t g = w / words_per_group;
#pragma unroll
    for (int r = 0; r < kGemvRowsPerWarp; ++r) {
      const uint32_t q = words[r][w];
      const float sxq = x0.x * float(q & 15u) + x0.y * float((q >> 4) & 15u) + x0.z * float((q >> 8) & 15u) +
                        x0.w * float((q >> 12) & 15u) + x1.x * float((q >> 16) & 15u) +
                        x1.y * float((q >> 20) & 15u) + x1.z * float((q >> 24) & 15u) + x1.w * float(q >> 28);
      acc[r] += bf16_bits_to_float(sc[r][g]) * sxq + bf16_bits_to_float(bi[r][g]) * sx;
    }
  }
#pragma unroll
  for (int r = 0; r < kGemvRowsPerWarp; ++r) acc[r] = warp_sum(acc[r]);
  if (lane < nrows) {
    float v = acc[0];
#pragma unroll
    for (int r = 1; r < kGemvRowsPerWarp; ++r)
      if (lane == r) v = acc[r];
    float* y = a.y + slot * a.y_stride + row0 + lane;
    *y = a.accumulate ? *y + v : v;
  }
}

// Other formats: lane l reads the 8-element chunks l, l+32, ... of each of the warp's rows.
template <WeightFormat F>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_generic_kernel(GemvArgs a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row0 = int64_t(blockIdx.x) * kGemvRowsPerBlock + warp * kGemvRowsPerWarp;
  const int slot = blockIdx.y;
  if (row0 >= a.w.rows) return;
  const int64_t e = a.ids ? a.ids[slot] : 0;
  const float* x = a.x + slot * a.x_stride;
  const int64_t nrows = a.w.rows - row0 < kGemvRowsPerWarp ? a.w.rows - row0 : kGemvRowsPerWarp;
  float acc[kGemvRowsPerWarp] = {};
  for (int64_t c = int64_t(lane) * 8; c < a.w.cols; c += 256) {
    const float4 x0 = *reinterpret_cast<const float4*>(x + c), x1 = *reinterpret_cast<const float4*>(x + c + 4);
#pragma unroll
    for (int r = 0; r < kGemvRowsPerWarp; ++r) {
      float wv[8];
      dmat_load8<F>(a.w, e, row0 + (r < nrows ? r : 0), c, wv);
      acc[r] += wv[0] * x0.x + wv[1] * x0.y + wv[2] * x0.z + wv[3] * x0.w + wv[4] * x1.x + wv[5] * x1.y +
                wv[6] * x1.z + wv[7] * x1.w;
    }
  }
#pragma unroll
  for (int r = 0; r < kGemvRowsPerWarp; ++r) acc[r] = warp_sum(acc[r]);
  if (lane < nrows) {
    float v = acc[0];
#pragma unroll
    for (int r = 1; r < kGemvRowsPerWarp; ++r)
      if (lane == r) v = acc[r];
    float* y = a.y + slot * a.y_stride + row0 + lane;
    *y = a.accumulate ? *y + v : v;
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
  const dim3 grid(blocks_for(a.w.rows, kGemvRowsPerBlock), unsigned(a.slots));
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
