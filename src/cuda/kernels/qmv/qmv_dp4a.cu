// One-token 4-bit matrix-vector product with integer dot products: see qmv_dp4a.cuh.
//
// Work split: lane l of a warp owns columns [1024·j + 32·l, +32) of every row, j < S = cols/1024: one uint4 of
// weights (4 words, 32 nibbles) per slice and row, and the matching activations in registers (per word the even
// and odd columns' hi and lo bytes: 4 int8x4 registers). A warp streams batches of R consecutive rows, batches
// interleaved over every warp of the grid; the next batch's weights, scales and biases are loaded before the current
// batch is reduced (two batches in flight per warp). Per row each lane adds its two half-groups (fp32), the warp sums
// the lanes by shuffles (a fixed order: deterministic), lane 0 writes.
//
// Batched (qmv_dp4a_batched): grid (blocks, B), block row blockIdx.y = token. Each token's blocks run the one-token
// kernel on that token's x and y (the same quantisation, dot products, folds and reduction: nothing in a row's
// arithmetic depends on the grid), every token with the same number of blocks, so that warp w of every token streams
// the same rows at about the same time and L2 serves all but the first read of each.
//
// Word w (nibbles n0..n7 LSB first, columns 8w..8w+7): w & 0x0F0F0F0F holds the even columns' nibbles as bytes,
// (w >> 4) & 0x0F0F0F0F the odd ones'; each meets the matching int8x4 of hi and of lo in one dp4a.
#include "cuda/kernels/qmv/qmv_dp4a.cuh"

#include <algorithm>
#include <cstdlib>
#include <cstdint>

#include "cuda/common/cuda_common.cuh"
#include "cuda/common/l2_prefetch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/warp_reduce.cuh"
#include "cuda/kernels/qmv/dp4a_tile.cuh"
#include "cuda/kernels/qmv/qmv_tile.cuh"

namespace tern::cuda {
namespace {

using qtile::kThreads;  // blocks of 8 warps, as qtile::balanced_grid sizes them
using qtile::kWarps;

struct Dp4aParams {
  const uint4* w;         // [rows][row_u4]
  const uint16_t* scales; // bf16 [rows][gpr]
  const uint16_t* biases;
  int rows = 0, row_u4 = 0, gpr = 0;
  const float* x;         // [B][ldx]: token b's [cols] at x + b·ldx
  const float* norm_w;    // [cols] or nullptr
  float eps = 1e-6f;
  float* y;               // [B][ldy]: token b's [rows] at y + b·ldy
  int64_t ldx = 0, ldy = 0;  // the tokens' strides in floats (unused for one token: blockIdx.y = 0)
  bool accumulate = false;
  L2Ranges ahead;         // asked of L2 for later kernels, before pdl_wait, spread over the grid
};

// The weights, scales and biases of rows [row0, row0 + R) that this lane reads (zeros past the last row).
template <int S, int R>
struct Batch {
  uint4 w[R][S];
  uint32_t sb[R][S];  // bf16 scale (low half) and bias (high half)
};

template <int S, int R>
__device__ __forceinline__ void load_batch(const Dp4aParams& p, int row0, int lane, Batch<S, R>& b) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int row = row0 + r;
    if (row < p.rows) {
      const uint4* wr = p.w + int64_t(row) * p.row_u4 + lane;
      const int64_t g = int64_t(row) * p.gpr + lane / 2;
#pragma unroll
      for (int j = 0; j < S; ++j) {
        b.w[r][j] = qtile::ld_weights_u4(wr + 32 * j);
        b.sb[r][j] = qtile::ld_const_u16(p.scales + g + 16 * j) | (qtile::ld_const_u16(p.biases + g + 16 * j) << 16);
      }
    } else {
#pragma unroll
      for (int j = 0; j < S; ++j) {
        b.w[r][j] = make_uint4(0, 0, 0, 0);
        b.sb[r][j] = 0;
      }
    }
  }
}

template <int S, int R, bool kWide>
__global__ void __launch_bounds__(kThreads) qmv_dp4a_kernel(const Dp4aParams p) {
  const int lane = threadIdx.x & 31;
  const int warps = int(gridDim.x) * kWarps;  // of this token
  const int batches = (p.rows + R - 1) / R;
  int batch = int(blockIdx.x) * kWarps + int(threadIdx.x >> 5);
  const float* x = p.x + int64_t(blockIdx.y) * p.ldx;  // token blockIdx.y's input and output
  float* y = p.y + int64_t(blockIdx.y) * p.ldy;

  Batch<S, R> cur;
  load_batch<S, R>(p, batch * R, lane, cur);  // weights are launch constants: read before the wait
  if (p.ahead.pieces) {  // each piece once, spread over the blocks of every token (x fastest)
    const int64_t block = int64_t(blockIdx.y) * gridDim.x + blockIdx.x;
    l2_prefetch_share(p.ahead, block * kThreads + threadIdx.x, int64_t(gridDim.x) * gridDim.y * kThreads);
  }
  pdl_wait();

  // Activations, once per block: thread t quantises words t, t + 256, ... (8 columns each) of x̂ = x (·norm_w) per
  // group of 64 (8 consecutive threads), and leaves per word {even hi, odd hi, even lo, odd lo} and Σv, per group σ.
  __shared__ uint4 xs[S * 128];
  __shared__ uint2 xs_lo[kWide ? S * 128 : 1];  // the wide activations' lo bytes (dp4a_tile.cuh)
  __shared__ __align__(16) int xsum[S * 128];
  __shared__ float xsig[S * 16];
  __shared__ float red[kWarps];
  float ss = 0.0f;  // Σ x² (RMSNorm)
  dp4a::quantize_block<dp4a::quantize_passes(S * 128, kThreads), kWide>(x, p.norm_w, S * 128, xs, xsum, xsig, ss,
                                                                        xs_lo);
  if (p.norm_w) {
    ss = warp_sum(ss);
    if (lane == 0) red[threadIdx.x >> 5] = ss;
  }
  __syncthreads();
  pdl_trigger();  // the inputs are read: the next kernel's blocks may start loading their weights
  float rinv = 1.0f;
  if (p.norm_w) {
    float t = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) t += red[w];
    rinv = rsqrtf(t / float(S * 1024) + p.eps);
  }
  // This lane's columns [1024·j + 32·lane, +32): words j·128 + 4·lane + k.
  uint4 xq[S][4];        // [slice][word] {even hi, odd hi, even lo, odd lo} (wide: mid in place of lo)
  uint2 xl[kWide ? S : 1][4];  // wide: [slice][word] {even lo, odd lo}
  float sig[S], sx[S];   // σ of the lane's group, σ·Σv of the lane's 32 columns
#pragma unroll
  for (int j = 0; j < S; ++j) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      xq[j][k] = xs[dp4a::xs_slot(j * 128 + 4 * lane + k)];
      if constexpr (kWide) xl[j][k] = xs_lo[dp4a::xs_slot(j * 128 + 4 * lane + k)];
    }
    const int4 sv = *reinterpret_cast<const int4*>(xsum + j * 128 + 4 * lane);
    const int sumv = sv.x + sv.y + sv.z + sv.w;
    sig[j] = xsig[j * 16 + lane / 2];
    sx[j] = sig[j] * float(sumv);
  }

  for (; batch < batches; batch += warps) {
    Batch<S, R> nxt;
    load_batch<S, R>(p, (batch + warps) * R, lane, nxt);  // rows past the end load nothing
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      acc[r] = 0.0f;
#pragma unroll
      for (int j = 0; j < S; ++j) {
        float dot;  // Σ q·v over the lane's 32 columns
        if constexpr (kWide) {
          int dh = 0, dm = 0, dl = 0;
          dp4a::dot_word_wide(cur.w[r][j].x, xq[j][0], xl[j][0], dh, dm, dl);
          dp4a::dot_word_wide(cur.w[r][j].y, xq[j][1], xl[j][1], dh, dm, dl);
          dp4a::dot_word_wide(cur.w[r][j].z, xq[j][2], xl[j][2], dh, dm, dl);
          dp4a::dot_word_wide(cur.w[r][j].w, xq[j][3], xl[j][3], dh, dm, dl);
          dot = fmaf(float(dh * 256 + dm), 256.0f, float(dl));  // |dh·256 + dm| < 2^24: exact in fp32
        } else {
          int dh = 0, dl = 0;
          dp4a::dot_word(cur.w[r][j].x, xq[j][0], dh, dl);
          dp4a::dot_word(cur.w[r][j].y, xq[j][1], dh, dl);
          dp4a::dot_word(cur.w[r][j].z, xq[j][2], dh, dl);
          dp4a::dot_word(cur.w[r][j].w, xq[j][3], dh, dl);
          dot = float(dh * 256 + dl);
        }
        const float s = dp4a::scale_of(cur.sb[r][j]), b = dp4a::bias_of(cur.sb[r][j]);
        acc[r] = fmaf(s * sig[j], dot, acc[r]);
        acc[r] = fmaf(b, sx[j], acc[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float v = warp_sum(acc[r]) * rinv;
      const int row = batch * R + r;
      if (lane == 0 && row < p.rows) y[row] = p.accumulate ? y[row] + v : v;
    }
    cur = nxt;
  }
}

// 24-bit activations (dp4a_tile.cuh's wide form) unless TERN_QMV_DP4A_BITS=16.
bool& wide_setting() {
  static bool wide = !env_is("TERN_QMV_DP4A_BITS", "16");
  return wide;
}

int& rows_per_batch_setting() {
  static int r = 2;  // H200: 2 rows per batch beat 4 and 8 (GDN in_proj 7.95 / 8.45 / 10.8 µs, LM head 68 / 73 / 99)
  return r;
}

// B tokens: grid (blocks, B), the blocks per token from qtile::balanced_grid (B = 1: the one-token grid).
template <int S, int R>
void launch(const Dp4aParams& p, int B, cudaStream_t stream) {
  auto kernel = wide_setting() ? qmv_dp4a_kernel<S, R, true> : qmv_dp4a_kernel<S, R, false>;
  const int blocks = qtile::balanced_grid(reinterpret_cast<const void*>(kernel), (int64_t(p.rows) + R - 1) / R, B);
  launch_pdl("qmv_dp4a", kernel, dim3(unsigned(blocks), unsigned(B)), dim3(kThreads), 0, stream, p);
}

template <int S>
void launch_rows(const Dp4aParams& p, int B, cudaStream_t stream) {
  if constexpr (S <= 2) {
    if (rows_per_batch_setting() == 8) return launch<S, 8>(p, B, stream);
    if (rows_per_batch_setting() == 4) return launch<S, 4>(p, B, stream);
    launch<S, 2>(p, B, stream);
  } else {
    launch<S, 2>(p, B, stream);  // 4096 columns: 2 rows per batch (170 registers)
  }
}

// qmv_dp4a for B tokens (checked by the callers).
void run(const QmvArgs& a, int B, cudaStream_t stream) {
  const DMat& w = a.w;
  Dp4aParams p;
  p.w = reinterpret_cast<const uint4*>(static_cast<const uint32_t*>(w.data) + a.expert * w.rows * w.row_words);
  p.scales = w.scales + a.expert * w.rows * w.groups_per_row;
  p.biases = w.biases + a.expert * w.rows * w.groups_per_row;
  p.rows = int(w.rows);
  p.row_u4 = int(w.row_words / 4);
  p.gpr = int(w.groups_per_row);
  p.x = a.x;
  p.norm_w = a.norm_w;
  p.eps = a.eps;
  p.y = a.y;
  p.ldx = a.ldx;
  p.ldy = a.ldy;
  p.accumulate = a.accumulate;
  p.ahead = a.l2_ahead;
  switch (w.cols) {
    case 1024: launch_rows<1>(p, B, stream); break;
    case 2048: launch_rows<2>(p, B, stream); break;
    default: launch_rows<4>(p, B, stream); break;
  }
}

}  // namespace

bool qmv_dp4a_supported(const QmvArgs& a) {
  const DMat& w = a.w;
  return a.T == 1 && w.format == WeightFormat::affine4 && w.group_size == 64 &&
         (w.cols == 1024 || w.cols == 2048 || w.cols == 4096) && w.row_words == w.cols / 8 &&
         w.rows * w.row_words < (int64_t(1) << 31) && (reinterpret_cast<uintptr_t>(w.data) & 15) == 0 &&
         (reinterpret_cast<uintptr_t>(a.x) & 15) == 0 && (reinterpret_cast<uintptr_t>(a.norm_w) & 15) == 0;
}

void qmv_dp4a_set_rows_per_batch(int r) { rows_per_batch_setting() = r; }
void qmv_dp4a_set_wide(bool wide) { wide_setting() = wide; }
bool qmv_dp4a_wide() { return wide_setting(); }

int64_t qmv_dp4a_min_rows() {
  static const int64_t r = [] {
    const char* e = std::getenv("TERN_QMV_DP4A_MIN_ROWS");
    return e ? std::max<int64_t>(0, std::atoll(e)) : int64_t(0);
  }();
  return r;
}

void qmv_dp4a(const QmvArgs& a, cudaStream_t stream) {
  TERN_CHECK(qmv_dp4a_supported(a), "qmv_dp4a: unsupported product [", a.w.rows, ", ", a.w.cols, "] T = ", a.T);
  run(a, 1, stream);
}

void qmv_dp4a_batched(const QmvArgs& a, int B, cudaStream_t stream) {
  TERN_CHECK(B >= 1 && B <= kBatchMaxTokens, "qmv_dp4a_batched: B = ", B, " outside 1..", kBatchMaxTokens);
  TERN_CHECK(qmv_dp4a_supported(a), "qmv_dp4a_batched: unsupported product [", a.w.rows, ", ", a.w.cols, "] T = ",
             a.T);
  // Rows of x 16-byte aligned (the quantiser's float4 loads) and rows of y apart.
  TERN_CHECK(B == 1 || (a.ldx >= a.w.cols && a.ldx % 4 == 0 && a.ldy >= a.w.rows), "qmv_dp4a_batched: ldx ", a.ldx,
             " / ldy ", a.ldy, " for the matrix [", a.w.rows, ", ", a.w.cols, "] (ldx a multiple of 4)");
  run(a, B, stream);
}

}  // namespace tern::cuda
