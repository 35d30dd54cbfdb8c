#include "cuda/kernels/vision/vision_attention.cuh"

#include <cmath>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/kernels/vision/vision_mma.cuh"

namespace tern::cuda {
namespace {

using namespace vision_mma;

constexpr int kRows = 64;      // queries per block and keys per tile
constexpr int kThreads = 128;  // 4 warps, 16 queries each

// One thread per output element, in the order of q/k/v [H, N, dhp] (coalesced writes; each thread reads its row's
// dims d and d ± dh/2).
__global__ void vision_attn_prepare_kernel(const float* qkv, const float* angles, VisionAttnDims d, int dhp,
                                           uint16_t* q, uint16_t* k, uint16_t* v) {
  const int64_t total = d.N * d.H * dhp, D = int64_t(d.H) * d.dh;
  const int half = d.dh / 2;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int dd = int(i % dhp);
    const int64_t ht = i / dhp, t = ht % d.N;
    const int h = int(ht / d.N);
    if (dd >= d.dh) {
      q[i] = k[i] = v[i] = 0;
      continue;
    }
    float sn, cs;
    sincosf(angles[t * half + dd % half], &sn, &cs);
    const float* row = qkv + t * 3 * D + int64_t(h) * d.dh;  // this head's q; its k at + D, its v at + 2D
    const float* rk = row + D;
    const float qr = dd < half ? row[dd] * cs - row[dd + half] * sn : row[dd] * cs + row[dd - half] * sn;
    const float kr = dd < half ? rk[dd] * cs - rk[dd + half] * sn : rk[dd] * cs + rk[dd - half] * sn;
    q[i] = to_bf16(qr);
    k[i] = to_bf16(kr);
    v[i] = to_bf16(row[2 * D + dd]);
  }
}

template <int DHP>
constexpr size_t attention_smem_bytes() {
  return size_t(5) * kRows * (DHP + 8) * sizeof(uint16_t);  // q tile, then 2 key tiles, then 2 value tiles
}

// Block (query tile x, head y, frame z). Shared tiles are [64][DHP + 8] bf16: the row stride of DHP/2 + 4 words
// (an odd multiple of 4 for DHP a multiple of 16) puts the 8 rows an ldmatrix reads in 8 distinct bank groups.
template <int DHP>
__global__ void __launch_bounds__(kThreads) vision_attention_kernel(const uint16_t* q, const uint16_t* k,
                                                                    const uint16_t* v, VisionAttnDims d,
                                                                    float scale_log2, uint16_t* out) {
  constexpr int LD = DHP + 8, KS = DHP / 16, DT = DHP / 8, kChunks = DHP / 8;
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* const sq = smem;                   // [64][LD]
  uint16_t* const sk = smem + kRows * LD;      // [2][64][LD]
  uint16_t* const sv = sk + 2 * kRows * LD;    // [2][64][LD]
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, c = lane % 4;
  const int h = int(blockIdx.y);
  const int64_t L = d.frame_len, first = int64_t(blockIdx.z) * L;  // the frame's patches [first, first + L)
  const int64_t q0 = int64_t(blockIdx.x) * kRows;                 // this block's first query, within the frame
  const uint16_t* const qh = q + (int64_t(h) * d.N + first) * DHP;
  const uint16_t* const kh = k + (int64_t(h) * d.N + first) * DHP;
  const uint16_t* const vh = v + (int64_t(h) * d.N + first) * DHP;

  // Rows [r0, r0 + 64) of the frame into a tile; rows past the frame are zeros.
  auto load_rows = [&](uint16_t* tile, const uint16_t* src, int64_t r0) {
    for (int i = int(threadIdx.x); i < kRows * kChunks; i += kThreads) {
      const int r = i / kChunks, col = (i % kChunks) * 8;
      const bool valid = r0 + r < L;
      cp_async_16_if(tile + r * LD + col, valid ? src + (r0 + r) * DHP + col : src, valid);
    }
  };

  const int key_tiles = int((L + kRows - 1) / kRows);
  load_rows(sq, qh, q0);
  load_rows(sk, kh, 0);
  load_rows(sv, vh, 0);
  cp_async_commit();

  uint32_t qf[KS][4];
  float o[DT][4] = {};
  float m[2] = {-INFINITY, -INFINITY};  // running max of rows g and g + 8 (scaled by log2 e)
  float l[2] = {0.0f, 0.0f};            // this thread's part of their running sums

  for (int j = 0; j < key_tiles; ++j) {
    const int buf = j % 2;
    if (j + 1 < key_tiles) {
      load_rows(sk + (buf ^ 1) * kRows * LD, kh, int64_t(j + 1) * kRows);
      load_rows(sv + (buf ^ 1) * kRows * LD, vh, int64_t(j + 1) * kRows);
    }
    cp_async_commit();
    cp_async_wait<1>();  // every group but the one just committed: tile j (and q) have landed
    __syncthreads();
    if (j == 0) {
#pragma unroll
      for (int ks = 0; ks < KS; ++ks)
        ldmatrix_x4(qf[ks], smem_addr(sq + (warp * 16 + lane % 16) * LD + ks * 16 + (lane / 16) * 8));
    }
    const uint16_t* const tk = sk + buf * kRows * LD;
    const uint16_t* const tv = sv + buf * kRows * LD;

    // s [16 queries of this warp][64 keys] = q · kᵀ: key tiles of 8 in s[nt].
    float s[8][4] = {};
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t r[4];
        const int row = np * 16 + (lane / 16) * 8 + lane % 8, col = ks * 16 + ((lane / 8) % 2) * 8;
        ldmatrix_x4(r, smem_addr(tk + row * LD + col));
        mma_bf16_16816_volatile(s[2 * np], qf[ks], r[0], r[1]);
        mma_bf16_16816_volatile(s[2 * np + 1], qf[ks], r[2], r[3]);
      }

    // Online softmax in base 2: keys past the frame get -inf (tile j always holds at least one real key).
    const int64_t key0 = int64_t(j) * kRows;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t key = key0 + nt * 8 + 2 * c + (e & 1);
        const float val = key < L ? s[nt][e] * scale_log2 : -INFINITY;
        s[nt][e] = val;
        mx[e / 2] = fmaxf(mx[e / 2], val);
      }
    float alpha[2], rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m[r], mx[r]);  // finite: the tile has a real key
      alpha[r] = exp2f(m[r] - m_new);          // 0 on the first tile (m = -inf)
      m[r] = m_new;
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(s[nt][e] - m[e / 2]);
        s[nt][e] = p;
        rs[e / 2] += p;
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + rs[r];
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[dt][e] *= alpha[e / 2];

    // o += p · v: p's accumulator fragments of key tiles 2kk, 2kk + 1 are the a fragment of keys [16kk, 16kk + 16).
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint32_t pa[4] = {cvt_bf16x2(s[2 * kk][0], s[2 * kk][1]), cvt_bf16x2(s[2 * kk][2], s[2 * kk][3]),
                              cvt_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              cvt_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < DHP / 16; ++dp) {
        uint32_t r[4];
        const int row = kk * 16 + ((lane / 8) % 2) * 8 + lane % 8, col = dp * 16 + (lane / 16) * 8;
        ldmatrix_x4_trans(r, smem_addr(tv + row * LD + col));
        mma_bf16_16816_volatile(o[2 * dp], pa, r[0], r[1]);
        mma_bf16_16816_volatile(o[2 * dp + 1], pa, r[2], r[3]);
      }
    }
    __syncthreads();  // the next iteration refills the other buffer pair, then this one after it
  }

  const int64_t width = int64_t(d.H) * d.dh;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int64_t query = q0 + warp * 16 + g + r * 8;
    if (query >= L) continue;
    const float inv = 1.0f / l[r];
    uint16_t* const row = out + (first + query) * width + int64_t(h) * d.dh;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      const int dim = dt * 8 + 2 * c;
      if (dim < d.dh)
        *reinterpret_cast<uint32_t*>(row + dim) = cvt_bf16x2(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
    }
  }
}

template <int DHP>
void launch_attention(const uint16_t* q, const uint16_t* k, const uint16_t* v, const VisionAttnDims& d,
                      float scale_log2, uint16_t* out, cudaStream_t stream) {
  constexpr size_t smem = attention_smem_bytes<DHP>();
  static const bool smem_set = [] {  // once per instantiation (thread-safe static init)
    TERN_CUDA(cudaFuncSetAttribute(vision_attention_kernel<DHP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   int(smem)));
    return true;
  }();
  (void)smem_set;
  const dim3 grid(unsigned((d.frame_len + kRows - 1) / kRows), unsigned(d.H), unsigned(d.N / d.frame_len));
  vision_attention_kernel<DHP><<<grid, kThreads, smem, stream>>>(q, k, v, d, scale_log2, out);
  TERN_CUDA_LAUNCHED("vision_attention");
}

void check_dims(const VisionAttnDims& d) {
  TERN_CHECK(d.H > 0 && d.dh > 0 && d.dh % 4 == 0 && d.dh <= 128, "vision attention: ", d.H, " heads of ", d.dh,
             " dims (a multiple of 4, at most 128)");
  TERN_CHECK(d.N >= 0 && d.frame_len > 0 && d.N % d.frame_len == 0 && d.N / d.frame_len < 65536,
             "vision attention: ", d.N, " patches in frames of ", d.frame_len);
}

}  // namespace

int vision_attn_padded_dim(int dh) { return (dh + 15) / 16 * 16; }

void vision_attn_prepare(const float* qkv, const float* angles, const VisionAttnDims& d, uint16_t* q, uint16_t* k,
                         uint16_t* v, cudaStream_t stream) {
  check_dims(d);
  if (d.N == 0) return;
  const int dhp = vision_attn_padded_dim(d.dh);
  const int64_t total = d.N * d.H * dhp;
  const unsigned blocks = unsigned(std::min<int64_t>((total + 255) / 256, int64_t(1) << 20));
  vision_attn_prepare_kernel<<<blocks, 256, 0, stream>>>(qkv, angles, d, dhp, q, k, v);
  TERN_CUDA_LAUNCHED("vision_attn_prepare");
}

void vision_attention(const uint16_t* q, const uint16_t* k, const uint16_t* v, const VisionAttnDims& d, float scale,
                      uint16_t* out, cudaStream_t stream) {
  check_dims(d);
  TERN_CHECK(reinterpret_cast<uintptr_t>(q) % 16 == 0 && reinterpret_cast<uintptr_t>(k) % 16 == 0 &&
                 reinterpret_cast<uintptr_t>(v) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 4 == 0,
             "vision attention: q, k, v must be 16-byte aligned, out 4-byte");
  if (d.N == 0) return;
  const float scale_log2 = scale * 1.4426950408889634f;
  switch (vision_attn_padded_dim(d.dh)) {
    case 16: launch_attention<16>(q, k, v, d, scale_log2, out, stream); break;
    case 32: launch_attention<32>(q, k, v, d, scale_log2, out, stream); break;
    case 48: launch_attention<48>(q, k, v, d, scale_log2, out, stream); break;
    case 64: launch_attention<64>(q, k, v, d, scale_log2, out, stream); break;
    case 80: launch_attention<80>(q, k, v, d, scale_log2, out, stream); break;
    case 96: launch_attention<96>(q, k, v, d, scale_log2, out, stream); break;
    case 112: launch_attention<112>(q, k, v, d, scale_log2, out, stream); break;
    case 128: launch_attention<128>(q, k, v, d, scale_log2, out, stream); break;
    default: TERN_CHECK(false, "vision attention: head dim ", d.dh);
  }
}

}  // namespace tern::cuda
