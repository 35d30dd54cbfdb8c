// The fused MoE router + integer gate_up for one token: see moe_router_gate_up.cuh. The router's arithmetic is
// moe_router_parts.cuh's, the gate_up's moe_dp4a_parts.cuh's: the same code as the two kernels it replaces.
#include "cuda/kernels/moe/moe_router_gate_up.cuh"

#include <cstdint>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/kernels/moe/moe_dp4a.cuh"
#include "cuda/kernels/moe/moe_dp4a_parts.cuh"
#include "cuda/kernels/moe/moe_router_parts.cuh"
#include "cuda/kernels/qmv/dp4a_tile.cuh"
#include "cuda/kernels/qmv/qmv_tile.cuh"

namespace tern::cuda {
namespace {

using namespace moe_parts;
using namespace router_parts;

// x·norm_w and Σx² are staged by the same threads in the same order as in the router kernel: the same block shape.
static_assert(kThreads == kRouterWarps * 32, "the fused kernel's blocks must be the router kernel's");
constexpr int kMaxExperts = 256;  // route_token<8>: 8 experts per lane, as the router kernel takes E <= 256

struct RouterGateUpParams {
  DMat router, sgate;   // [E, D] and [1, D], 8-bit (router_fast8)
  const float* norm_w;  // [D]
  float eps;
  const float* hidden;  // [D]
  int E;
  MoeDecodeScratch s;   // one token's; s.ticket and s.epoch the grid's rendezvous
  GateUpParams gu;      // over the same scratch (ids, x̂, h)
};

// The routing's publication: a release store of the epoch by the routing block, acquire loads by the waiting ones.
__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_gpu(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// D = S·1024 columns; kWide: x̂ at 24 bits (moe_dp4a_wide()). Every block must be resident at once (the blocks past
// the ticket wait for the last one).
template <int S, bool kWide>
__global__ void __launch_bounds__(kThreads) moe_router_gate_up_kernel(const RouterGateUpParams p) {
  constexpr int D = S * 1024, ldxs = router_ldxs(D), nch = D / 512;
  __shared__ __align__(16) float rsm[ldxs];  // x·norm_w, router_pad layout
  __shared__ float ss_part[kRouterWarps][1];
  __shared__ float rinv[1];
  __shared__ __align__(16) float xh[D];      // x̂, as the scratch's
  __shared__ int ids_s[kTopK];
  __shared__ uint4 xs[S * 128];
  __shared__ uint2 xs_lo[kWide ? S * 128 : 1];
  __shared__ __align__(16) int xsum[S * 128];
  __shared__ float xsig[S * 16];
  const int warp = int(threadIdx.x >> 5), lane = threadIdx.x & 31;
  const int warps = int(gridDim.x) * kWarps, batches = (p.gu.k + 1) * p.gu.F;

  // Weights first (launch constants): the warp's first router row and, when its first gate_up batch is a shared-expert
  // row (batch < F: no routing needed), that batch's (zeros otherwise).
  int row = int(blockIdx.x) * kWarps + warp;
  RouterRow8 rw;
  if (row <= p.E) router_row_load8(p.router, p.sgate, row, p.E, nch, lane, rw);
  int batch = int(blockIdx.x) * kWarps + warp;
  GateUpBatch<S> cur;
  load_gate_up<S>(p.gu, ids_s, batch, p.gu.F, lane, cur);
  pdl_wait();  // hidden comes from the kernel before
  // The epoch before this launch's routing: read before this block takes its ticket, so before anyone can advance it.
  unsigned epoch0 = 0;
  if (threadIdx.x == 0) epoch0 = ld_acquire_gpu(p.s.epoch);

  router_stage<1>(p.hidden, p.norm_w, D, 1, p.eps, rsm, ldxs, ss_part, rinv);
  // x̂ = x·norm_w · rinv, the router kernel's product of the same staged values: every block's copy has the scratch's
  // bits, so each quantises its own instead of waiting for block 0's.
  for (int c4 = threadIdx.x; c4 < D / 4; c4 += blockDim.x) {
    const float4 v = router_xhat4(rsm, ldxs, rinv, 0, 4 * c4);
    reinterpret_cast<float4*>(xh)[c4] = v;
    if (blockIdx.x == 0) reinterpret_cast<float4*>(p.s.xhat)[c4] = v;
  }
  // Router rows: global warp w takes rows w, w + warps, ... <= E (row E: the shared-expert gate).
  for (; row <= p.E; row += warps) {
    float acc[1] = {0.0f};
    router_row_dot8<1>(rw, rsm, ldxs, nch, 1, lane, acc);
    router_row_write<1, true>(acc, rinv, row, p.E, 1, p.s, lane);
    if (row + warps <= p.E) router_row_load8(p.router, p.sgate, row + warps, p.E, nch, lane, rw);
  }
  if (router_ticket(p.s.ticket)) {  // the last block: route, then publish (all of the block's writes first)
    router_route<8>(p.s, 1, p.E, p.gu.k, warp, lane);
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      st_release_gpu(p.s.epoch, epoch0 + 1);
    }
  }

  // gate_up: x̂ quantised as the gate_up kernel quantises it (xh written before router_ticket's barriers).
  float unused_ss = 0.0f;
  dp4a::quantize_block<dp4a::quantize_passes(S * 128, kThreads), kWide>(xh, nullptr, S * 128, xs, xsum, xsig,
                                                                         unused_ss, xs_lo);
  __syncthreads();
  GateUpX<S, kWide> x;
  gate_up_lane_x<S, kWide>(xs, xs_lo, xsum, xsig, lane, x);
  batch = gate_up_rows<S, kWide>(p.gu, ids_s, batch, p.gu.F, warps, lane, x, cur, p.gu.h);  // shared expert
  if (threadIdx.x == 0)
    while (ld_acquire_gpu(p.s.epoch) == epoch0) __nanosleep(64);
  __syncthreads();
  if (int(threadIdx.x) < p.gu.k) {
    const int e = __ldcg(p.gu.ids + threadIdx.x);  // L2: written by another block of this grid
    ids_s[threadIdx.x] = e < 0 ? 0 : (e >= p.gu.E ? p.gu.E - 1 : e);
  }
  __syncthreads();
  if (p.gu.down_ahead) prefetch_down(p.gu, ids_s);
  pdl_trigger();  // the routing is complete: the down kernel may read it before its own wait
  load_gate_up<S>(p.gu, ids_s, batch, batches, lane, cur);
  gate_up_rows<S, kWide>(p.gu, ids_s, batch, batches, warps, lane, x, cur, p.gu.h);
}

// The kernel for D columns (1024, 2048 or 4096) and the activations' width.
using Kernel = void (*)(RouterGateUpParams);
template <bool kWide>
Kernel kernel_for(int64_t D) {
  switch (D) {
    case 1024: return moe_router_gate_up_kernel<1, kWide>;
    case 2048: return moe_router_gate_up_kernel<2, kWide>;
    default: return moe_router_gate_up_kernel<4, kWide>;
  }
}
Kernel kernel_for(int64_t D, bool wide) { return wide ? kernel_for<true>(D) : kernel_for<false>(D); }

// The most blocks of `kernel` resident at once: occupancy × SMs.
int resident_blocks(Kernel kernel) {
  return qtile::blocks_fit(reinterpret_cast<const void*>(kernel), 0) * qtile::sm_count();
}

}  // namespace

bool moe_router_gate_up_fits(const MoeDecodeWeights& w) {
  return moe_gate_up_dp4a_fits(w) && router_fast8(w.router) && router_fast8(w.shared_expert_gate) &&
         w.router.cols == w.expert_gate.cols && w.shared_expert_gate.cols == w.router.cols &&
         w.router.rows >= w.top_k && w.router.rows <= kMaxExperts && w.router.rows == w.expert_gate.experts &&
         w.norm_w && (reinterpret_cast<uintptr_t>(w.norm_w) & 15) == 0;
}

int moe_router_gate_up_max_blocks(const MoeDecodeWeights& w) {
  TERN_CHECK(moe_router_gate_up_fits(w), "moe_router_gate_up: the kernel does not take these weights");
  return resident_blocks(kernel_for(w.expert_gate.cols, moe_dp4a_wide()));
}

bool moe_router_gate_up_dp4a(const MoeDecodeWeights& w, const float* hidden, const MoeDecodeScratch& s,
                             cudaStream_t stream, int blocks) {
  const auto aligned = [](const void* q) { return q && (reinterpret_cast<uintptr_t>(q) & 15) == 0; };
  if (!moe_router_gate_up_fits(w) || !aligned(hidden) || !aligned(s.xhat) || !aligned(s.h)) return false;
  TERN_CHECK(s.ticket && s.epoch, "moe_router_gate_up: the scratch has no ticket or epoch");
  const GateUpParams gu = gate_up_params(w, s);
  const Kernel kernel = kernel_for(w.expert_gate.cols, gu.wide);
  // The blocks past the ticket spin until the last one has routed: a block that could not be resident with them
  // would never run.
  const int most = resident_blocks(kernel);
  const int grid = blocks > 0 ? blocks
                              : qtile::balanced_grid(reinterpret_cast<const void*>(kernel),
                                                     int64_t(w.top_k + 1) * w.expert_gate.rows);
  TERN_CHECK(grid >= 1 && grid <= most, "moe_router_gate_up: a grid of ", grid, " blocks, but only ", most,
             " can be resident at once");
  RouterGateUpParams p;
  p.router = w.router;
  p.sgate = w.shared_expert_gate;
  p.norm_w = w.norm_w;
  p.eps = w.eps;
  p.hidden = hidden;
  p.E = int(w.router.rows);
  p.s = s;
  p.gu = gu;
  launch_pdl("moe_router_gate_up_dp4a", kernel, dim3(unsigned(grid)), dim3(kThreads), 0, stream, p);
  return true;
}

}  // namespace tern::cuda
