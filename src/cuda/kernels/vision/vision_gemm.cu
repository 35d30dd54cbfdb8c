#include "cuda/kernels/vision/vision_gemm.cuh"

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/kernels/vision/vision_mma.cuh"

namespace tern::cuda {
namespace {

using namespace vision_mma;

constexpr int kBM = 128, kBN = 128, kBK = 32;  // block tile: 128 rows of x, 128 rows of w, 32 deep
constexpr int kStages = 3;
constexpr int kThreads = 256;                  // 8 warps: 2 along M (64 rows each) x 4 along N (32 columns each)
constexpr int kLd = kBK + 8;                   // smem row stride in bf16 (80 B: the 8 rows of an ldmatrix hit
                                               // 8 distinct 16-byte bank groups)
constexpr int kStageElems = (kBM + kBN) * kLd;  // one stage: x tile [kBM][kLd], then w tile [kBN][kLd]
constexpr size_t kSmemBytes = size_t(kStages) * kStageElems * sizeof(uint16_t);  // 61,440 B

__device__ __forceinline__ float activate(float v, VisionAct act) {
  if (act == VisionAct::gelu_tanh)
    return 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
  if (act == VisionAct::gelu_erf) return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
  return v;
}

// Rows [r0, r0 + 128) x columns [k0, k0 + 32) of a [rows, K] bf16 matrix into a [128][kLd] tile: 512 chunks of 8
// values, 2 per thread; chunks outside the matrix are zeros.
__device__ __forceinline__ void load_tile(uint16_t* tile, const uint16_t* src, int64_t rows, int64_t K, int64_t r0,
                                          int64_t k0) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int chunk = int(threadIdx.x) + i * kThreads;
    const int r = chunk / 4, c = (chunk % 4) * 8;
    const int64_t gr = r0 + r, gk = k0 + c;
    const bool valid = gr < rows && gk < K;
    cp_async_16_if(tile + r * kLd + c, valid ? src + gr * K + gk : src, valid);
  }
}

__global__ void __launch_bounds__(kThreads) vision_gemm_kernel(VisionGemmArgs a) {
  extern __shared__ __align__(16) uint16_t smem[];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int warp_m = warp % 2, warp_n = warp / 2;
  const int64_t m0 = int64_t(blockIdx.y) * kBM, n0 = int64_t(blockIdx.x) * kBN;
  const int ktiles = int((a.K + kBK - 1) / kBK);

  auto stage_x = [&](int s) { return smem + s * kStageElems; };
  auto stage_w = [&](int s) { return smem + s * kStageElems + kBM * kLd; };
  auto load_stage = [&](int s, int kt) {
    load_tile(stage_x(s), a.x, a.M, a.K, m0, int64_t(kt) * kBK);
    load_tile(stage_w(s), a.w, a.N, a.K, n0, int64_t(kt) * kBK);
  };

  float acc[4][4][4] = {};  // [m tile of 16][n tile of 8][fragment]

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ktiles) load_stage(s, s);
    cp_async_commit();
  }

  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<kStages - 2>();  // tile kt has landed (groups are committed one per tile, empty ones included)
    __syncthreads();               // ... for every thread; and the stage refilled below is no longer read
    const int next = kt + kStages - 1;
    if (next < ktiles) load_stage(next % kStages, next);
    cp_async_commit();

    const uint16_t* sx = stage_x(kt % kStages);
    const uint16_t* sw = stage_w(kt % kStages);
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t af[4][4], bf[4][2];
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        const int row = warp_m * 64 + mt * 16 + (lane % 16), col = ks * 16 + (lane / 16) * 8;
        ldmatrix_x4(af[mt], smem_addr(sx + row * kLd + col));
      }
#pragma unroll
      for (int np = 0; np < 2; ++np) {  // two n tiles of 8 per ldmatrix: (b0, b1) of tile 2np, then of 2np + 1
        const int row = warp_n * 32 + np * 16 + (lane / 16) * 8 + (lane % 8), col = ks * 16 + ((lane / 8) % 2) * 8;
        uint32_t r[4];
        ldmatrix_x4(r, smem_addr(sw + row * kLd + col));
        bf[2 * np][0] = r[0];
        bf[2 * np][1] = r[1];
        bf[2 * np + 1][0] = r[2];
        bf[2 * np + 1][1] = r[3];
      }
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) mma_bf16_16816_volatile(acc[mt][nt], af[mt], bf[nt][0], bf[nt][1]);
    }
  }
  cp_async_wait<0>();

  // Epilogue: each fragment pair (c0, c1) / (c2, c3) is two adjacent columns of one row (N even: both in or out).
  const int g = lane / 4, c = lane % 4;
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t row = m0 + warp_m * 64 + mt * 16 + g + half * 8;
      if (row >= a.M) continue;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int64_t col = n0 + warp_n * 32 + nt * 8 + 2 * c;
        if (col >= a.N) continue;
        float v0 = acc[mt][nt][2 * half], v1 = acc[mt][nt][2 * half + 1];
        if (a.bias) {
          v0 += a.bias[col];
          v1 += a.bias[col + 1];
        }
        v0 = activate(v0, a.act);
        v1 = activate(v1, a.act);
        const int64_t at = row * a.N + col;
        if (a.y_f32) {
          float2* y = reinterpret_cast<float2*>(a.y_f32 + at);
          if (a.accumulate) {
            const float2 old = *y;
            v0 += old.x;
            v1 += old.y;
          }
          *y = make_float2(v0, v1);
        }
        if (a.y_bf16) *reinterpret_cast<uint32_t*>(a.y_bf16 + at) = cvt_bf16x2(v0, v1);
      }
    }
}

bool aligned(const void* p, size_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

}  // namespace

void vision_gemm(const VisionGemmArgs& a, cudaStream_t stream) {
  TERN_CHECK(a.M >= 0 && a.N > 0 && a.N % 2 == 0 && a.K > 0 && a.K % 8 == 0, "vision_gemm: shape [", a.M, ", ",
             a.K, "] x [", a.N, ", ", a.K, "]ᵀ (N even, K a multiple of 8)");
  TERN_CHECK(a.x && a.w && (a.y_f32 || a.y_bf16) && !(a.accumulate && !a.y_f32),
             "vision_gemm: needs x, w and an output (accumulate needs y_f32)");
  TERN_CHECK(aligned(a.x, 16) && aligned(a.w, 16) && aligned(a.y_f32, 8) && aligned(a.y_bf16, 4),
             "vision_gemm: x and w must be 16-byte aligned, y_f32 8-byte, y_bf16 4-byte");
  TERN_CHECK(a.M / kBM < 65535, "vision_gemm: ", a.M, " rows is too many for one launch");
  if (a.M == 0) return;
  static const bool smem_set = [] {  // once per process (thread-safe static init)
    TERN_CUDA(cudaFuncSetAttribute(vision_gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes)));
    return true;
  }();
  (void)smem_set;
  const dim3 grid(unsigned((a.N + kBN - 1) / kBN), unsigned((a.M + kBM - 1) / kBM));
  vision_gemm_kernel<<<grid, kThreads, kSmemBytes, stream>>>(a);
  TERN_CUDA_LAUNCHED("vision_gemm");
}

}  // namespace tern::cuda
