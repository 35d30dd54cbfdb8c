// The one-token MoE router in one cluster: see moe_router_cluster.cuh.
#include "cuda/kernels/moe/moe_router_cluster.cuh"

#include <cooperative_groups.h>

#include <cstdint>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/warp_reduce.cuh"
#include "cuda/kernels/moe/moe_route.cuh"
#include "cuda/kernels/qmv/dp4a_tile.cuh"
#include "cuda/kernels/qmv/qmv_tile.cuh"
#include "cuda/weights/dmat_device.cuh"

namespace cg = cooperative_groups;

namespace tern::cuda {
namespace {

constexpr int kCluster = 8;         // blocks (portable cluster size)
constexpr int kWarps = 16;          // per block
[[maybe_unused]] constexpr int kRowsPerWarp = 3;  // 8 · 16 · 3 = 384 ≥ E + 1
constexpr int kMaxE = 256;          // route_token<8>: 8 experts per lane
[[maybe_unused]] constexpr int kSlicePad = 20;      // floats per 16-column slice of x in shared memory
[[maybe_unused]] constexpr int kMaxD = 2048;        // D = 512 · NCH, NCH ∈ {1, 2, 4} (registers: 3 rows × NCH uint4 per lane)

struct ClusterRouterParams {
  DMat router, sgate;
  const float* norm_w;
  float eps;
  const float* hidden;  // [B][D]
  int D, E, k;
  MoeDecodeScratch s;   // rows [B]
  bool x_lanes;         // also write s.x_lanes (D a multiple of 1024)
};

// Index in xs of float4 number c4 of x (columns 4·c4 .. 4·c4 + 3).
[[maybe_unused]] __device__ __forceinline__ int padded(int c4) { return (c4 / 4) * kSlicePad + (c4 % 4) * 4; }

[[maybe_unused]] __device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

// The token's x̂ quantised into its x_lanes slices (moe_decode.cuh), the whole block (threads beyond the D / 8 words
// idle: whole warps, D a multiple of 1024). Thread w takes word w (columns [8w, +8)) and makes what quantize_block
// makes of it from x̂ in global memory: the same floats (x·norm_w staged in xs times the factor rinv, as block rank 0
// writes x̂), the same quantize_word with the same 8-lane groups; then gate_up_lane_x's sums over the 4 words of a
// gate_up lane (integers: exact) and σ·Σv. Bit for bit what the gate_up kernels would make of x̂ themselves.
[[maybe_unused]] __device__ __forceinline__ void quantise_x_lanes(const float* xs, float rinv, int D, uint4* x_lanes) {
  const int w = int(threadIdx.x);
  if (w >= D / 8) return;
  const float4 a = *reinterpret_cast<const float4*>(xs + padded(2 * w));
  const float4 b = *reinterpret_cast<const float4*>(xs + padded(2 * w + 1));
  const float v[8] = {a.x * rinv, a.y * rinv, a.z * rinv, a.w * rinv, b.x * rinv, b.y * rinv, b.z * rinv, b.w * rinv};
  int sumv = 0;
  float m = 0.0f;
  const uint4 q = dp4a::quantize_word(v, sumv, m);
  sumv += __shfl_xor_sync(0xffffffffu, sumv, 1);  // Σv of the gate_up lane's 4 words (w & ~3 .. + 3)
  sumv += __shfl_xor_sync(0xffffffffu, sumv, 2);
  const int slice = w / 128, l = (w % 128) / 4, k = w % 4;
  uint4* dst = x_lanes + int64_t(slice) * (kMoeXLaneSliceBytes / 16);
  dst[32 * k + l] = q;
  if (k == 0) {
    const float sig = m / dp4a::kQMax;
    reinterpret_cast<float2*>(dst + 128)[l] = make_float2(sig, sig * float(sumv));
  }
}

template <int NCH>
__global__ void __launch_bounds__(kWarps * 32) moe_router_cluster_kernel(const ClusterRouterParams p) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 900
  __trap();  // never launched: the host takes this path only for sm_90 binaries
#else
  // x·norm_w, each lane's 16-column slice padded to 20 floats: the 8 lanes of a quarter-warp read their slices'
  // float4s from 8 distinct bank quads (16 floats apart they would hit the same 4 banks: a 4-way conflict).
  __shared__ __align__(16) float xs[kMaxD / 16 * kSlicePad];
  __shared__ float logits[kMaxE + 1];        // block 0's: every block writes its rows here
  __shared__ float ss_part[kWarps];
  __shared__ float rinv_s;
  cg::cluster_group cluster = cg::this_cluster();
  // Every block arrives now and waits (below) only before its first write into block 0's shared memory: the
  // programming guide's rule for distributed shared memory (every block of the cluster known to have started before
  // a remote access; without it racecheck reported each write as "a block that might not have entered yet"). By then
  // the other blocks have long arrived: the wait costs nothing measurable.
  // (Relaxed: nothing written before it needs ordering; cluster.barrier_arrive() would fence the GPU's memory first.)
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  const int rank = int(cluster.block_rank());
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  // Cluster blockIdx.y routes token blockIdx.y (0 for one token): its row of hidden and its rows of the scratch.
  const int token = int(blockIdx.y);
  const float* hidden = p.hidden + int64_t(token) * p.D;

  // Weights first (launch constants): rows gw, gw + 128, gw + 256 of [router; shared gate], gw = rank·16 + warp.
  // Only loads inside each row's branch, scale and bias apart until their use: an instruction there that used the
  // loads (packing the halves) would wait for them in the branch, one round trip a row. The branches also keep the
  // loads ahead of pdl_wait: with the row clamped instead (no branch), ptxas moves the wait above them (in the SASS).
  uint4 wq[kRowsPerWarp][NCH];
  uint32_t ws[kRowsPerWarp][NCH], wb[kRowsPerWarp][NCH];  // bf16 bits of the group's scale, bias
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int row = rank * kWarps + warp + kCluster * kWarps * i;
    if (row > p.E) continue;
    const bool sh = row == p.E;
    const DMat& m = sh ? p.sgate : p.router;
    const int64_t mrow = sh ? 0 : row;
    const uint32_t* words = static_cast<const uint32_t*>(m.data) + mrow * m.row_words + 4 * lane;
    const int64_t g0 = mrow * m.groups_per_row + lane / 4;
#pragma unroll
    for (int c = 0; c < NCH; ++c) {
      wq[i][c] = qtile::ld_weights_u4(words + c * 128);
      ws[i][c] = qtile::ld_const_u16(m.scales + g0 + 8 * c);
      wb[i][c] = qtile::ld_const_u16(m.biases + g0 + 8 * c);
    }
  }
  pdl_wait();
  float ss = 0.0f;
  for (int c4 = threadIdx.x; c4 < p.D / 4; c4 += blockDim.x) {
    const float4 x = reinterpret_cast<const float4*>(hidden)[c4];
    const float4 nw = reinterpret_cast<const float4*>(p.norm_w)[c4];
    ss = fmaf(x.x, x.x, fmaf(x.y, x.y, fmaf(x.z, x.z, fmaf(x.w, x.w, ss))));
    *reinterpret_cast<float4*>(xs + padded(c4)) = make_float4(x.x * nw.x, x.y * nw.y, x.z * nw.z, x.w * nw.w);
  }
  ss = warp_sum(ss);
  if (lane == 0) ss_part[warp] = ss;
  __syncthreads();
  pdl_trigger();  // the inputs are read
  if (threadIdx.x == 0) {
    float v = 0.0f;
    for (int w = 0; w < kWarps; ++w) v += ss_part[w];
    rinv_s = 1.0f / sqrtf(v / float(p.D) + p.eps);
  }
  __syncthreads();
  const float rinv = rinv_s;
  if (rank == 0)  // x̂ for the expert kernels
    for (int c4 = threadIdx.x; c4 < p.D / 4; c4 += blockDim.x) {
      const float4 v = *reinterpret_cast<const float4*>(xs + padded(c4));
      reinterpret_cast<float4*>(p.s.xhat + int64_t(token) * p.D)[c4] =
          make_float4(v.x * rinv, v.y * rinv, v.z * rinv, v.w * rinv);
    }
  float* dst = cluster.map_shared_rank(logits, 0);
  // Σ_g s_g·Σ q·xw + b_g·Σ xw over the lane's 16-column slices (each inside one group), as the multi-block router;
  // each slice of x read once for the warp's rows.
  float acc[kRowsPerWarp] = {};
#pragma unroll
  for (int c = 0; c < NCH; ++c) {
    float xv[16];
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const float4 f = *reinterpret_cast<const float4*>(xs + (c * 32 + lane) * kSlicePad + 4 * v);
      xv[4 * v] = f.x, xv[4 * v + 1] = f.y, xv[4 * v + 2] = f.z, xv[4 * v + 3] = f.w;
    }
    const float sx = router_sum16(xv);
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      if (rank * kWarps + warp + kCluster * kWarps * i > p.E) continue;
      float qf[16];
      router_unpack16(wq[i][c], qf);
      acc[i] = router_dot16_regs(qf, xv, sx, bf16_bits_to_float(ws[i][c]), bf16_bits_to_float(wb[i][c]), acc[i]);
    }
  }
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");  // block 0 has started: its logits may be written
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int row = rank * kWarps + warp + kCluster * kWarps * i;
    if (row > p.E) continue;
    const float v = warp_sum(acc[i]) * rinv;
    if (lane == 0) dst[row] = v;
  }
  cluster.sync();  // every logit is in block 0's shared memory
  // Block rank 1, idle while rank 0 routes: the token's x̂ for the grouped gate_up (moe_dp4a_grouped.cu).
  if (rank == 1 && p.x_lanes)
    quantise_x_lanes(xs, rinv, p.D, p.s.x_lanes + int64_t(token) * (p.D / 1024) * (kMoeXLaneSliceBytes / 16));
  if (rank != 0) return;
  if (warp == 0) {
    int my_id = 0;
    route_token<8, false>(logits, p.E, p.k, p.s.ids + token * p.k, p.s.w + token * p.k, lane, my_id);
  } else if (warp == 1) {
    if (lane == 0) {
      p.s.shared_logit[token] = logits[p.E];
      p.s.shared_gate[token] = sigmoid_f(logits[p.E]);
    }
  } else {
    float* router_logits = p.s.router_logits + int64_t(token) * p.E;
    for (int e = threadIdx.x - 64; e < p.E; e += blockDim.x - 64) router_logits[e] = logits[e];
  }
#endif
}

bool fast8(const DMat& m) {
  return m.format == WeightFormat::affine8 && m.group_size == 64 &&
         (m.cols == 512 || m.cols == 1024 || m.cols == 2048) &&
         m.row_words == m.cols / 4 && (reinterpret_cast<uintptr_t>(m.data) & 15) == 0;
}

}  // namespace

bool moe_router_cluster_fits(const MoeDecodeWeights& w) {
  // The cluster kernel exists only in code compiled for sm_90+ (not a JIT of the sm_80 PTX, not the portable path).
  static const bool cluster_ok = sm90_features();
  return cluster_ok && fast8(w.router) && fast8(w.shared_expert_gate) && w.shared_expert_gate.rows == 1 &&
         w.shared_expert_gate.cols == w.router.cols && w.router.rows <= kMaxE && w.top_k <= 32 &&
         w.top_k <= w.router.rows && (reinterpret_cast<uintptr_t>(w.norm_w) & 15) == 0;
}

bool moe_router_cluster(const MoeDecodeWeights& w, const float* hidden, int T, const MoeDecodeScratch& s,
                        cudaStream_t stream, int B, bool x_lanes) {
  if (T != 1 || B < 1 || !moe_router_cluster_fits(w) || (reinterpret_cast<uintptr_t>(hidden) & 15)) return false;
  TERN_CHECK(!x_lanes || (w.router.cols % 1024 == 0 && s.x_lanes &&
                          (reinterpret_cast<uintptr_t>(s.x_lanes) & 15) == 0),
             "moe_router_cluster: x_lanes needs D a multiple of 1024 and the scratch's x_lanes, 16-byte aligned");
  ClusterRouterParams p{};
  p.router = w.router;
  p.sgate = w.shared_expert_gate;
  p.norm_w = w.norm_w;
  p.eps = w.eps;
  p.hidden = hidden;
  p.D = int(w.router.cols);
  p.E = int(w.router.rows);
  p.k = w.top_k;
  p.s = s;
  p.x_lanes = x_lanes;
  const char* what = "moe_router_decode (cluster)";
  const dim3 grid(kCluster, unsigned(B)), block(kWarps * 32);  // cluster b (blocks (0..7, b)): token b
  switch (p.D) {
    case 512: launch_cluster_pdl(what, moe_router_cluster_kernel<1>, grid, block, kCluster, 0, stream, p); break;
    case 1024: launch_cluster_pdl(what, moe_router_cluster_kernel<2>, grid, block, kCluster, 0, stream, p); break;
    default: launch_cluster_pdl(what, moe_router_cluster_kernel<4>, grid, block, kCluster, 0, stream, p); break;
  }
  return true;
}

}  // namespace tern::cuda
