// The one-token MoE block in one kernel: see moe_fused.cuh.
#include "cuda/moe_fused.cuh"

#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "cuda/cuda_common.cuh"
#include "cuda/dp4a_tile.cuh"
#include "cuda/l2_prefetch.cuh"
#include "cuda/launch.cuh"
#include "cuda/moe_dp4a_tile.cuh"
#include "cuda/moe_route.cuh"
#include "cuda/qmv_tile.cuh"
#include "cuda/warp_reduce.cuh"

namespace cg = cooperative_groups;

namespace tern::cuda {
namespace {

using moe_tile::dot_row;
using moe_tile::pick;
using moe_tile::Q4;

constexpr int kD = 2048;                   // hidden size
constexpr int kF = 512;                    // expert intermediate size (routed and shared)
constexpr int kK = 8;                      // routed experts per token
constexpr int kSeg = kK + 1;               // slots: k routed, then the shared expert
constexpr int kMaxE = 256;                 // route_token<8>: 8 experts per lane
constexpr int kCluster = 8;                // blocks per cluster (portable size)
constexpr int kCols = 32;                  // intermediate columns of one unit
constexpr int kSlices = kF / kCols;        // 16
constexpr int kUnits = kSeg * kSlices;     // (slot, 32-column slice) units: 144
constexpr int kMinClusters = 12;           // ≤ 12 units per cluster: the register and shared-memory sizes below
constexpr int kMaxClusters = kSlices;      // the partial-sum rows of the scratch
constexpr int kMaxUnits = (kUnits + kMinClusters - 1) / kMinClusters;  // per cluster: 12
constexpr int kWarps = 12;
constexpr int kThreads = kWarps * 32;
constexpr int kRouterRows = 3;             // per warp: 8 · 12 · 3 = 288 ≥ E + 1
[[maybe_unused]] constexpr int kMaxPairsPerWarp = kMaxUnits * kCols / kCluster / kWarps;  // gate/up (unit, column) pairs: 4
constexpr int kRowsPerBlock = kD / kCluster;     // output rows per block in the down product: 256
[[maybe_unused]] constexpr int kMaxUnitsPerGroup = kMaxUnits / 3; // down: 3 groups of 128 threads, units j ≡ group (mod 3)
static_assert(kMaxUnits * kCols % (kCluster * kWarps) == 0 && kThreads == 3 * 128 && kRowsPerBlock == 2 * 128,
              "the thread mappings below");
static_assert(kCluster * kWarps * kRouterRows >= kMaxE + 1, "router rows");

struct FusedParams {
  DMat router, sgate_logit;  // 8-bit [E, D], [1, D]
  const float* norm_w;       // [D]
  float eps;
  float* hidden;             // [D], read by the norm and updated
  int E;
  Q4 gate, up, sgate, sup;   // [E][F, D] and [F, D]: 256 words, 32 groups per row
  Q4 down, sdown;            // [E][D, F] and [D, F]: 64 words, 8 groups per row
  MoeDecodeScratch s;
  int clusters;              // kMinClusters .. kMaxClusters: those the device holds at once
  bool prefetch_down;        // ask L2 for the down rows once the token is routed (TERN_MOE_FUSED_PREFETCH=0: no)
};

[[maybe_unused]] __device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

struct PairWeights {
  uint4 g[2], u[2];
  uint32_t gsb[2], usb[2];
};

// (Unused in the binaries before sm_90, whose kernel is a stub.)
// The gate and up rows i of expert e (lane: columns 32·lane + 1024·j, j < 2), as moe_dp4a.cu's gate_up kernel.
[[maybe_unused]] __device__ __forceinline__ void load_pair(const Q4& G, const Q4& U, int64_t e, int i, int lane, PairWeights& out) {
  const int64_t wo = e * G.expert_words + int64_t(i) * (kD / 8), go = e * G.expert_groups + int64_t(i) * (kD / 64);
  const uint4* gw = reinterpret_cast<const uint4*>(G.words + wo) + lane;
  const uint4* uw = reinterpret_cast<const uint4*>(U.words + wo) + lane;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    out.g[j] = qtile::ld_weights_u4(gw + 32 * j);
    out.u[j] = qtile::ld_weights_u4(uw + 32 * j);
    const int64_t g = go + 16 * j + lane / 2;
    out.gsb[j] = qtile::ld_const_u16(G.scales + g) | (qtile::ld_const_u16(G.biases + g) << 16);
    out.usb[j] = qtile::ld_const_u16(U.scales + g) | (qtile::ld_const_u16(U.biases + g) << 16);
  }
}

__global__ void __launch_bounds__(kThreads, 1) moe_fused_kernel(const FusedParams p) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 900
  __trap();  // never launched: the host takes this path only for sm_90 binaries
#else
  __shared__ __align__(16) float xs[kD / 16 * kRouterSlicePad];  // x·norm_w, padded for the router's reads
  __shared__ __align__(16) float xhat_s[kD];               // x̂ = x·norm_w·rinv
  __shared__ __align__(16) uint4 xq[kD / 8];               // x̂ quantised (dp4a_tile.cuh), slot xs_slot(word)
  __shared__ __align__(16) int xsum[kD / 8];
  __shared__ float xsig[kD / 64];
  __shared__ float logits[kMaxE + 1];                      // every block gets all of them
  __shared__ float h_s[kMaxUnits * kCols];                 // h of the cluster's units, [unit][32]
  __shared__ uint4 hq[kMaxUnits * kCols / 8];              // h quantised per unit (32 columns)
  __shared__ int hsum[kMaxUnits * kCols / 8];
  __shared__ float hsig[kMaxUnits];
  __shared__ float red[3][kRowsPerBlock];
  __shared__ int ids_s[kK];
  __shared__ float w_s[kK];
  __shared__ float ss_part[kWarps];
  __shared__ float rinv_s, sgate_s;
  __shared__ bool last_s;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank());
  const int cl = int(blockIdx.x) / kCluster, ncl = p.clusters;
  const int units = (kUnits - cl + ncl - 1) / ncl;  // the cluster's units: cl, cl + ncl, cl + 2·ncl, ...
  const int pairs = units * kCols / kCluster;       // gate/up pairs of this block: 4 per unit
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid & 31;

  // 1. Router weights first (launch constants): rows rw, rw + 96, rw + 192 of [router; shared gate], rw = rank·12 + warp.
  const int rw = rank * kWarps + warp;
  RouterRows<kRouterRows, 4> rr;
  router_load_rows(p.router, p.sgate_logit, p.E, rw, kCluster * kWarps, lane, rr);
  pdl_wait();
  const float rinv = router_stage_x(p.hidden, p.norm_w, kD, p.eps, xs, ss_part, rinv_s);
  for (int c4 = tid; c4 < kD / 4; c4 += kThreads) {
    const float4 v = *reinterpret_cast<const float4*>(xs + router_padded(c4));
    reinterpret_cast<float4*>(xhat_s)[c4] = make_float4(v.x * rinv, v.y * rinv, v.z * rinv, v.w * rinv);
  }
  {
    float acc[kRouterRows];
    router_dot_rows(rr, xs, p.E, rw, kCluster * kWarps, lane, acc);
#pragma unroll
    for (int i = 0; i < kRouterRows; ++i) {
      const int row = rw + kCluster * kWarps * i;
      if (row > p.E) continue;
      const float v = warp_sum(acc[i]) * rinv;
      if (lane < kCluster) cluster.map_shared_rank(logits, lane)[row] = v;
    }
  }
  cluster.sync();  // every block holds every logit
  if (warp == 0) {
    int my_id = 0;
    route_token<8, false>(logits, p.E, kK, ids_s, w_s, lane, my_id);
    if (lane < kK) ids_s[lane] = min(max(my_id, 0), p.E - 1);  // a NaN logit must not send a load out of the matrix
  } else if (warp == 1 && lane == 0) {
    sgate_s = sigmoid_f(logits[p.E]);
  }
  float unused_ss = 0.0f;  // x̂ quantised for the gate/up products while warp 0 routes
  dp4a::quantize_block(xhat_s, nullptr, kD / 8, xq, xsum, xsig, unused_ss);
  __syncthreads();

  // 2. Gate/up: the block's pairs q = warp + 12·j (pair r + 8q of the cluster: unit (r + 8q) / 32, column
  // (r + 8q) % 32; unit u of the model = cl + ncl·(its index in the cluster): slot u / 16, columns 32·(u % 16) ..).
  int pair_unit[kMaxPairsPerWarp], pair_col[kMaxPairsPerWarp];
  PairWeights pw[kMaxPairsPerWarp];
#pragma unroll
  for (int j = 0; j < kMaxPairsPerWarp; ++j) {
    const int q = warp + kWarps * j;
    const int pidx = rank + kCluster * q;
    pair_unit[j] = pidx / kCols;
    pair_col[j] = pidx % kCols;
    if (q >= pairs) continue;
    const int u = cl + ncl * pair_unit[j], slot = u / kSlices;
    const bool sh = slot == kK;
    load_pair(pick(sh, p.sgate, p.gate), pick(sh, p.sup, p.up), sh ? 0 : ids_s[slot],
              (u % kSlices) * kCols + pair_col[j], lane, pw[j]);
  }
  if (p.prefetch_down && tid < 3 * kSeg) {
    // L2, for step 3: rows [256·rank, +256) of the 9 down matrices (words, scales, biases; 64 + 4 + 4 KB each), the
    // n clusters' blocks of this rank each asking for an n-th of every range.
    const int s = tid / 3, part = tid % 3;
    const bool sh = s == kK;
    const Q4 M = pick(sh, p.sdown, p.down);
    const int64_t e = sh ? 0 : ids_s[s], row0 = int64_t(rank) * kRowsPerBlock;
    const char* base = part == 0 ? reinterpret_cast<const char*>(M.words + e * M.expert_words + row0 * (kF / 8))
                       : reinterpret_cast<const char*>((part == 1 ? M.scales : M.biases) + e * M.expert_groups +
                                                       row0 * (kF / 64));
    const uint32_t bytes = part == 0 ? kRowsPerBlock * kF / 2 : kRowsPerBlock * (kF / 64) * 2;
    const uint32_t chunk = (bytes / uint32_t(ncl) + 15u) & ~15u, off = chunk * uint32_t(cl);
    if (off < bytes) l2_prefetch_bulk(base + off, bytes - off < chunk ? bytes - off : chunk);
  }
  if (cl == 0 && rank == 0) {  // the router's outputs, as the three-kernel path leaves them
    for (int c = tid; c < kD; c += kThreads) p.s.xhat[c] = xhat_s[c];
    for (int e = tid; e < p.E; e += kThreads) p.s.router_logits[e] = logits[e];
    if (tid < kK) {
      p.s.ids[tid] = ids_s[tid];
      p.s.w[tid] = w_s[tid];
    }
    if (tid == 0) {
      p.s.shared_logit[0] = logits[p.E];
      p.s.shared_gate[0] = sgate_s;
    }
  }
  {
    uint4 xv[2][4];
    float sig[2], sx[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int k = 0; k < 4; ++k) xv[j][k] = xq[dp4a::xs_slot(j * 128 + 4 * lane + k)];
      const int4 sv = *reinterpret_cast<const int4*>(xsum + j * 128 + 4 * lane);
      sig[j] = xsig[j * 16 + lane / 2];
      sx[j] = sig[j] * float(sv.x + sv.y + sv.z + sv.w);
    }
#pragma unroll
    for (int j = 0; j < kMaxPairsPerWarp; ++j) {
      if (warp + kWarps * j >= pairs) continue;
      const float g = warp_sum(dot_row<2>(pw[j].g, pw[j].gsb, xv, sig, sx));
      const float u = warp_sum(dot_row<2>(pw[j].u, pw[j].usb, xv, sig, sx));
      if (lane < kCluster)
        cluster.map_shared_rank(h_s, lane)[pair_unit[j] * kCols + pair_col[j]] = moe_tile::silu_f(g) * u;
    }
  }

  // 3. Down weights (the gate/up registers are free now): thread t takes rows 256·rank + t % 128 (+ 128) of the
  // units j ≡ t / 128 (mod 3), 32 columns = 4 words each; in flight while the cluster exchanges h.
  const int grp = tid / 128, rl = tid % 128;
  uint4 dw[kMaxUnitsPerGroup][2];
  uint32_t dsb[kMaxUnitsPerGroup][2];
#pragma unroll
  for (int m = 0; m < kMaxUnitsPerGroup; ++m) {
    const int j = grp + 3 * m;
    if (j >= units) continue;
    const int u = cl + ncl * j, slot = u / kSlices, sl = u % kSlices;
    const bool sh = slot == kK;
    const Q4 M = pick(sh, p.sdown, p.down);
    const int64_t e = sh ? 0 : ids_s[slot];
#pragma unroll
    for (int r2 = 0; r2 < 2; ++r2) {
      const int64_t row = int64_t(rank) * kRowsPerBlock + rl + 128 * r2;
      dw[m][r2] = qtile::ld_weights_u4(M.words + e * M.expert_words + row * (kF / 8) + 4 * sl);
      const int64_t g = e * M.expert_groups + row * (kF / 64) + sl / 2;
      dsb[m][r2] = qtile::ld_const_u16(M.scales + g) | (qtile::ld_const_u16(M.biases + g) << 16);
    }
  }
  cluster.sync();  // every block holds h of the cluster's units
  if (rank == 0)
    for (int i = tid; i < units * kCols; i += kThreads) {
      const int u = cl + ncl * (i / kCols);
      p.s.h[(u / kSlices) * kF + (u % kSlices) * kCols + i % kCols] = h_s[i];
    }
  if (warp < 2) {  // h quantised per unit (4 words of 8 columns: groups of 4 lanes)
    const int word = tid;
    const bool has = word < units * kCols / 8;
    float v[8] = {};
    if (has)
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = h_s[8 * word + e];
    int sumv = 0;
    float m = 0.0f;
    const uint4 q = dp4a::quantize_word<4>(v, sumv, m);
    if (has) {
      hq[word] = q;
      hsum[word] = sumv;
      if ((word & 3) == 0) hsig[word / 4] = m / dp4a::kQMax;
    }
  }
  __syncthreads();

  // 4. The partial down product of the thread's two rows over its units.
  float acc[2] = {};
#pragma unroll
  for (int m = 0; m < kMaxUnitsPerGroup; ++m) {
    const int j = grp + 3 * m;
    if (j >= units) continue;
    const int slot = (cl + ncl * j) / kSlices;
    const float coef = slot < kK ? w_s[slot] : sgate_s;
    const float sig = coef * hsig[j];
    const float sx = sig * float(hsum[4 * j] + hsum[4 * j + 1] + hsum[4 * j + 2] + hsum[4 * j + 3]);
#pragma unroll
    for (int r2 = 0; r2 < 2; ++r2) {
      int dh = 0, dl = 0;
      dp4a::dot_word(dw[m][r2].x, hq[4 * j], dh, dl);
      dp4a::dot_word(dw[m][r2].y, hq[4 * j + 1], dh, dl);
      dp4a::dot_word(dw[m][r2].z, hq[4 * j + 2], dh, dl);
      dp4a::dot_word(dw[m][r2].w, hq[4 * j + 3], dh, dl);
      acc[r2] = fmaf(dp4a::scale_of(dsb[m][r2]) * sig, float(dh * 256 + dl), acc[r2]);
      acc[r2] = fmaf(dp4a::bias_of(dsb[m][r2]), sx, acc[r2]);
    }
  }
  red[grp][rl] = acc[0];
  red[grp][rl + 128] = acc[1];
  __syncthreads();
  float* partial = p.s.partial + int64_t(cl) * kD + int64_t(rank) * kRowsPerBlock;
  if (tid < kRowsPerBlock) partial[tid] = (red[0][tid] + red[1][tid]) + red[2][tid];
  __threadfence();
  __syncthreads();
  if (tid == 0) last_s = atomicAdd(p.s.tickets + rank, 1u) == unsigned(ncl - 1);
  __syncthreads();
  if (!last_s) return;

  // 5. The last block of this rank: hidden += Σ_c partial[c] in a fixed order.
  __threadfence();
  if (tid < kRowsPerBlock) {
    const int64_t row = int64_t(rank) * kRowsPerBlock + tid;
    float sum = 0.0f;
    for (int c = 0; c < ncl; ++c) sum += __ldcg(p.s.partial + int64_t(c) * kD + row);
    p.hidden[row] += sum;
  }
  if (tid == 0) p.s.tickets[rank] = 0u;
#endif
}

bool fast8(const DMat& m) {
  return m.format == WeightFormat::affine8 && m.group_size == 64 && m.cols == kD && m.row_words == m.cols / 4 &&
         (reinterpret_cast<uintptr_t>(m.data) & 15) == 0;
}

bool env_flag(const char* name, bool fallback) {
  const char* e = std::getenv(name);
  return e ? std::strcmp(e, "0") != 0 : fallback;
}
bool fused_prefetch() {
  static const bool on = env_flag("TERN_MOE_FUSED_PREFETCH", true);
  return on;
}

}  // namespace

bool moe_block_fused_fits(const MoeDecodeWeights& w) {
  using moe_tile::q4_dp4a_ok;
  using moe_tile::same_shape;
  // The cluster kernel exists only in the sm_90 binary (not a JIT of the sm_80 PTX). Decided once, outside capture.
  static const bool cluster_ok = [] {
    cudaFuncAttributes fa{};
    if (cudaFuncGetAttributes(&fa, moe_fused_kernel) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return fa.binaryVersion >= 90;
  }();
  const DMat& g = w.expert_gate;
  return cluster_ok && fast8(w.router) && fast8(w.shared_expert_gate) && w.shared_expert_gate.rows == 1 &&
         w.router.rows >= kK && w.router.rows <= kMaxE && w.top_k == kK && g.cols == kD && g.rows == kF &&
         g.experts == w.router.rows && q4_dp4a_ok(g) && q4_dp4a_ok(w.expert_up) && q4_dp4a_ok(w.shared_gate) &&
         q4_dp4a_ok(w.shared_up) && same_shape(g, w.expert_up) && same_shape(g, w.shared_gate) &&
         same_shape(g, w.shared_up) && w.expert_down.rows == kD && w.expert_down.cols == kF &&
         w.expert_down.experts == g.experts && q4_dp4a_ok(w.expert_down) && q4_dp4a_ok(w.shared_down) &&
         same_shape(w.expert_down, w.shared_down) && (reinterpret_cast<uintptr_t>(w.norm_w) & 15) == 0 &&
         moe_block_fused_clusters() >= kMinClusters;
}

static int resident_clusters() {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(kMaxClusters * kCluster);
  cfg.blockDim = dim3(kThreads);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kCluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, moe_fused_kernel, &cfg) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

// The grid: as many clusters as the device holds at once, at most 16; decided once, outside capture.
bool moe_block_fused_enabled() {
  static const bool on = env_flag("TERN_MOE_FUSED", false);
  return on;
}

// TERN_MOE_FUSED_CLUSTERS (12..16) sets another grid, for measurements.
int moe_block_fused_clusters() {
  static const int n = [] {
    if (const char* e = std::getenv("TERN_MOE_FUSED_CLUSTERS")) {
      const int v = std::atoi(e);
      if (v >= kMinClusters && v <= kMaxClusters) return v;
    }
    return std::min(resident_clusters(), kMaxClusters);
  }();
  return n;
}

bool moe_block_fused(const MoeDecodeWeights& w, float* hidden, int T, const MoeDecodeScratch& s, cudaStream_t stream,
                     int clusters) {
  TERN_CHECK(clusters == 0 || (clusters >= kMinClusters && clusters <= kMaxClusters),
             "moe_block_fused: clusters must be 0 (the device's) or 12..16");
  if (T != 1 || !moe_block_fused_fits(w) || !s.partial || !s.tickets ||
      (reinterpret_cast<uintptr_t>(hidden) & 15))
    return false;
  FusedParams p{};
  p.router = w.router;
  p.sgate_logit = w.shared_expert_gate;
  p.norm_w = w.norm_w;
  p.eps = w.eps;
  p.hidden = hidden;
  p.E = int(w.router.rows);
  p.gate = moe_tile::q4_of(w.expert_gate);
  p.up = moe_tile::q4_of(w.expert_up);
  p.sgate = moe_tile::q4_of(w.shared_gate);
  p.sup = moe_tile::q4_of(w.shared_up);
  p.down = moe_tile::q4_of(w.expert_down);
  p.sdown = moe_tile::q4_of(w.shared_down);
  p.s = s;
  p.clusters = clusters ? clusters : moe_block_fused_clusters();
  p.prefetch_down = fused_prefetch();
  launch_cluster_pdl("moe_block_fused", moe_fused_kernel, dim3(unsigned(p.clusters * kCluster)), dim3(kThreads),
                     kCluster, 0, stream, p);
  return true;
}

}  // namespace tern::cuda
