#include "cuda/kernels/vision/vision_gemm.cuh"

#include <cstdlib>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/kernels/vision/vision_mma.cuh"

namespace tern::cuda {
namespace {

using namespace vision_mma;

// Block tile: 128 rows of x by BN rows of w (BN = 128 or 64: vision_gemm_tile_n), 32 deep.
constexpr int kBM = 128, kBK = 32;
constexpr int kStages = 3;
constexpr int kThreads = 256;                  // 8 warps: 2 along M (64 rows each) x 4 along N (BN/4 columns each)
constexpr int kLd = kBK + 8;                   // smem row stride in bf16 (80 B: the 8 rows of an ldmatrix hit
                                               // 8 distinct 16-byte bank groups)
template <int BN>
constexpr int kStageElems = (kBM + BN) * kLd;  // one stage: x tile [kBM][kLd], then w tile [BN][kLd]
template <int BN>
constexpr size_t kSmemBytes = size_t(kStages) * kStageElems<BN> * sizeof(uint16_t);  // 61,440 B (128), 46,080 (64)

__device__ __forceinline__ float activate(float v, VisionAct act) {
  if (act == VisionAct::gelu_tanh)
    return 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
  if (act == VisionAct::gelu_erf) return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
  return v;
}

// Rows [r0, r0 + ROWS) x columns [k0, k0 + 32) of a [rows, K] bf16 matrix into a [ROWS][kLd] tile: 4·ROWS chunks of
// 8 values, ROWS/64 per thread; chunks outside the matrix are zeros.
template <int ROWS>
__device__ __forceinline__ void load_tile(uint16_t* tile, const uint16_t* src, int64_t rows, int64_t K, int64_t r0,
                                          int64_t k0) {
  static_assert(ROWS % 64 == 0, "a whole number of chunks per thread");
#pragma unroll
  for (int i = 0; i < ROWS / 64; ++i) {
    const int chunk = int(threadIdx.x) + i * kThreads;
    const int r = chunk / 4, c = (chunk % 4) * 8;
    const int64_t gr = r0 + r, gk = k0 + c;
    const bool valid = gr < rows && gk < K;
    cp_async_16_if(tile + r * kLd + c, valid ? src + gr * K + gk : src, valid);
  }
}

template <int BN>
__global__ void __launch_bounds__(kThreads) vision_gemm_kernel(VisionGemmArgs a) {
  constexpr int kWN = BN / 4;    // columns per warp
  constexpr int kNT = kWN / 8;   // n tiles of 8 per warp: 4 (BN 128) or 2 (BN 64)
  extern __shared__ __align__(16) uint16_t smem[];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int warp_m = warp % 2, warp_n = warp / 2;
  const int64_t m0 = int64_t(blockIdx.y) * kBM, n0 = int64_t(blockIdx.x) * BN;
  const int ktiles = int((a.K + kBK - 1) / kBK);

  auto stage_x = [&](int s) { return smem + s * kStageElems<BN>; };
  auto stage_w = [&](int s) { return smem + s * kStageElems<BN> + kBM * kLd; };
  auto load_stage = [&](int s, int kt) {
    load_tile<kBM>(stage_x(s), a.x, a.M, a.K, m0, int64_t(kt) * kBK);
    load_tile<BN>(stage_w(s), a.w, a.N, a.K, n0, int64_t(kt) * kBK);
  };

  float acc[4][kNT][4] = {};  // [m tile of 16][n tile of 8][fragment]

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
      uint32_t af[4][4], bf[kNT][2];
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        const int row = warp_m * 64 + mt * 16 + (lane % 16), col = ks * 16 + (lane / 16) * 8;
        ldmatrix_x4(af[mt], smem_addr(sx + row * kLd + col));
      }
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {  // two n tiles of 8 per ldmatrix: (b0, b1) of tile 2np, then 2np + 1
        const int row = warp_n * kWN + np * 16 + (lane / 16) * 8 + (lane % 8), col = ks * 16 + ((lane / 8) % 2) * 8;
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
        for (int nt = 0; nt < kNT; ++nt) mma_bf16_16816_volatile(acc[mt][nt], af[mt], bf[nt][0], bf[nt][1]);
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
      for (int nt = 0; nt < kNT; ++nt) {
        const int64_t col = n0 + warp_n * kWN + nt * 8 + 2 * c;
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

// Per tile width: the kernel's resident blocks per SM (occupancy) and the SM count, read once (thread-safe static
// init; the first call sets the shared-memory attributes, outside any graph capture: the encoder is not captured).
struct TileFit {
  int sms = 0, blocks_128 = 0, blocks_64 = 0;
};
const TileFit& tile_fit() {
  static const TileFit fit = [] {
    TERN_CUDA(cudaFuncSetAttribute(vision_gemm_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   int(kSmemBytes<128>)));
    TERN_CUDA(cudaFuncSetAttribute(vision_gemm_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   int(kSmemBytes<64>)));
    TileFit f;
    int dev = 0;
    TERN_CUDA(cudaGetDevice(&dev));
    TERN_CUDA(cudaDeviceGetAttribute(&f.sms, cudaDevAttrMultiProcessorCount, dev));
    TERN_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&f.blocks_128, vision_gemm_kernel<128>, kThreads,
                                                            kSmemBytes<128>));
    TERN_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&f.blocks_64, vision_gemm_kernel<64>, kThreads,
                                                            kSmemBytes<64>));
    return f;
  }();
  return fit;
}

}  // namespace

// The wave model: a launch takes ceil(blocks / (SMs · resident)) rounds, each as long as `resident` blocks sharing
// an SM, and a block's time grows with its width; the narrower tile also pays more fragment loads per product
// (kNarrowCost, per output). The wider tile unless the narrower one's last round is fuller by more than that.
int vision_gemm_tile_n(int64_t M, int64_t N) {
  static const int forced = [] {
    const char* e = std::getenv("TERN_VISION_TILE_N");  // 64 or 128: a measurement switch
    return e ? std::atoi(e) : 0;
  }();
  if (forced == 64 || forced == 128) return forced;
  const TileFit& f = tile_fit();
  if (f.sms <= 0 || f.blocks_128 <= 0 || f.blocks_64 <= 0) return 128;
  constexpr double kNarrowCost = 1.15;
  auto cost = [&](int bn, int resident, double per_output) {
    const int64_t blocks = ((M + kBM - 1) / kBM) * ((N + bn - 1) / bn);
    const int64_t slots = int64_t(f.sms) * resident;
    const int64_t rounds = (blocks + slots - 1) / slots;
    return double(rounds) * resident * bn * per_output;
  };
  return cost(64, f.blocks_64, kNarrowCost) < cost(128, f.blocks_128, 1.0) ? 64 : 128;
}

void vision_gemm(const VisionGemmArgs& a, cudaStream_t stream) {
  TERN_CHECK(a.M >= 0 && a.N > 0 && a.N % 2 == 0 && a.K > 0 && a.K % 8 == 0, "vision_gemm: shape [", a.M, ", ",
             a.K, "] x [", a.N, ", ", a.K, "]ᵀ (N even, K a multiple of 8)");
  TERN_CHECK(a.x && a.w && (a.y_f32 || a.y_bf16) && !(a.accumulate && !a.y_f32),
             "vision_gemm: needs x, w and an output (accumulate needs y_f32)");
  TERN_CHECK(aligned(a.x, 16) && aligned(a.w, 16) && aligned(a.y_f32, 8) && aligned(a.y_bf16, 4),
             "vision_gemm: x and w must be 16-byte aligned, y_f32 8-byte, y_bf16 4-byte");
  TERN_CHECK(a.M / kBM < 65535, "vision_gemm: ", a.M, " rows is too many for one launch");
  TERN_CHECK(a.tile_n == 0 || a.tile_n == 64 || a.tile_n == 128, "vision_gemm: tile width ", a.tile_n,
             " (0, 64 or 128)");
  if (a.M == 0) return;
  (void)tile_fit();  // the shared-memory attributes
  const int bn = a.tile_n != 0 ? a.tile_n : vision_gemm_tile_n(a.M, a.N);
  const dim3 grid(unsigned((a.N + bn - 1) / bn), unsigned((a.M + kBM - 1) / kBM));
  if (bn == 64) vision_gemm_kernel<64><<<grid, kThreads, kSmemBytes<64>, stream>>>(a);
  else vision_gemm_kernel<128><<<grid, kThreads, kSmemBytes<128>, stream>>>(a);
  TERN_CUDA_LAUNCHED("vision_gemm");
}

}  // namespace tern::cuda
