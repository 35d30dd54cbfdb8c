// The batched (B >= 2) gate_up + SwiGLU grouped by expert across the batch's tokens (opt-in:
// TERN_MOE_RING_GATE_UP=grouped; moe_dp4a_ring.cu picks it). The ring form (moe_gate_up_ring_kernel) gives every
// token its own blocks, which stream all 9 of the token's slots' rows: the shared expert's rows are read B times a
// step and a routed expert that several tokens chose once per token. Here the batch is split into groups of up to
// kGroupTokens tokens (grid (blocks, groups), the groups' sizes differing by at most one), and a group's blocks read
// each row of each distinct expert of the group once, into the warp's cp.async ring as the ring form lays a stage
// out, and dot it with every (token, slot) of the group that chose the expert.
//
// The 16-bit activations only (TERN_MOE_DP4A_BITS=16: moe_dp4a.cuh); with 24 bits the ring form runs in its place.
//
// Every value is made as in the one-token kernel (moe_gate_up_dp4a_kernel): a lane owns uint4 word chunk 32·j + lane
// of slice j of the row and the group's scale/bias at 16·j + lane / 2, the token's activations are what
// gate_up_lane_x makes of quantize_block(x̂) (the cluster router writes them, in that per-lane form, into the
// scratch's x_lanes: moe_decode.cuh), and dot_row, warp_sum of gate then of up and silu(g)·u are the same code; so
// each h[token][slot][i] is bit for bit the one-token value. Only which warp makes it, and when, differs.
//
// A block of group g, after pdl_wait:
//   1. lists the group's experts in shared memory (GroupList): entry 0 the shared expert, with every token of the
//      group at slot k; then each distinct routed expert (ids clamped to [0, E) as the other kernels do), in id order,
//      with its (token, slot) pairs in pair order (token-major). Every block of the group builds the same list.
//   2. splits the group's batches (entry d, row i), d-major, into one contiguous run per warp of the group's grid, by
//      cost: a batch of entry d costs kLoadCost + (d's pairs), in units of one token's two dot products, so that the
//      shared expert's rows (kGroupTokens tokens each) and the routed ones (~1.1 each at 8 tokens) even out (each
//      warp's total its share to within one batch); a block's 8 runs are spread over the list;
//   3. copies the group's per-lane activations into shared memory (cp.async, one group of its own), issues the first
//      kStages − 1 batches of its run, asks L2 for the down rows of the group's experts (down_ahead), and triggers the
//      next launch once every thread has passed pdl_wait (moe_down's early routing read: moe_dp4a.cuh);
//   4. per batch: waits for its stage, reads the lane's gate/up words and scale/bias pairs, and for each pair of the
//      entry loads that token's activations from shared memory and writes h[token][slot][i].
//
// Shared memory: the ring [kWarps][kStages][1152·S] (3 stages: a batch carries ~2 tokens' work or more, so the
// ring's 4 at S <= 2 are not needed to cover the latency) and the activations [kGroupTokens][S][2304 B]; S = 2
// (D = 2048): 92,160 B dynamic, so that two blocks fit an SM. D = 4096 (S = 4) has no grouped form: the cluster
// router, which writes the activations, takes D up to 2048.
#include <algorithm>
#include <atomic>
#include <cstdint>

#include "cuda/common/cuda_common.cuh"
#include "cuda/common/l2_prefetch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/warp_reduce.cuh"
#include "cuda/kernels/moe/moe_dp4a_parts.cuh"
#include "cuda/kernels/qmv/qmv_tile.cuh"

namespace tern::cuda::moe_parts {
namespace {

constexpr int kGroupTokens = 8;                     // G: tokens of a group (the grid's y)
constexpr int kGroupPairs = kGroupTokens * kTopK;   // routed (token, slot) pairs of a full group: 64
constexpr int kMaxEntries = 1 + kGroupPairs;        // the shared expert and up to 64 distinct routed experts
constexpr int kMaxExperts = kThreads;               // E: one thread per expert in the listing's scan
constexpr int kStages = 3;
constexpr int kLoadCost = 1;  // a batch's row loads and stage reads, against one token's gate and up dot products

template <int S>
constexpr int stage_bytes() { return 1152 * S; }  // gate words, up words, gate scales, biases, up scales, biases
template <int S>
constexpr int x_token_bytes() { return int(kMoeXLaneSliceBytes) * S; }
template <int S>
constexpr int grouped_smem() { return kWarps * kStages * stage_bytes<S>() + kGroupTokens * x_token_bytes<S>(); }

struct GroupedParams {
  GateUpParams p;
  const uint4* x_lanes;  // [B][S] slices of kMoeXLaneSliceBytes (moe_decode.cuh: MoeDecodeScratch::x_lanes)
  int B, groups;
};

// The group's experts (step 1 above): entry d's pairs are pair[begin[d] .. begin[d + 1]), each token (of the group)
// << 8 | slot.
struct GroupList {
  int entries;
  int expert[kMaxEntries];  // entry d >= 1: the routed expert's id; entry 0 (the shared expert): 0
  int begin[kMaxEntries + 1];
  uint16_t pair[kGroupTokens + kGroupPairs];
};

// Scratch of the listing only.
struct ListScratch {
  int count[kMaxExperts];     // pairs per expert id
  int entry_of[kMaxExperts];  // the entry of an expert id with pairs
  int pair_expert[kGroupPairs], pair_rank[kGroupPairs];  // a pair's clamped expert; its place among that expert's
  int warp_used[kWarps], warp_pairs[kWarps];             // the scan's per-warp totals
};

// Step 1 for tokens [t0, t0 + gn) (gn <= kGroupTokens), by the whole block; ends with a barrier.
__device__ __forceinline__ void list_group(const GateUpParams& p, int t0, int gn, GroupList& L, ListScratch& ls) {
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int n = gn * kTopK;  // routed pairs, pair q = token·k + slot
  if (tid < p.E) ls.count[tid] = 0;
  if (tid < n) {
    const int e = p.ids[t0 * kTopK + tid];
    ls.pair_expert[tid] = e < 0 ? 0 : (e >= p.E ? p.E - 1 : e);
  }
  __syncthreads();
  // A pair's rank among the earlier pairs of its expert, warp 0 over rounds of 32 pairs (the lanes of one expert in a
  // round found by __match_any_sync): pair order, whatever the timing.
  if (warp == 0) {
    for (int r = 0; r < n; r += 32) {
      const int q = r + lane;
      const bool valid = q < n;
      const int e = valid ? ls.pair_expert[q] : -1;
      const unsigned same = __match_any_sync(0xffffffffu, e);
      const int before = __popc(same & ((1u << lane) - 1u));
      if (valid) ls.pair_rank[q] = ls.count[e] + before;
      __syncwarp();
      if (valid && before == 0) ls.count[e] += __popc(same);
      __syncwarp();
    }
  }
  __syncthreads();
  // Thread e (expert id e < E): inclusive scans of (e has pairs) and of its pair count over ids, in id order.
  const int c = tid < p.E ? ls.count[tid] : 0;
  int used = c > 0 ? 1 : 0, pairs = c;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, used, o), s = __shfl_up_sync(0xffffffffu, pairs, o);
    if (lane >= o) used += u, pairs += s;
  }
  if (lane == 31) ls.warp_used[warp] = used, ls.warp_pairs[warp] = pairs;
  __syncthreads();
  for (int w = 0; w < warp; ++w) used += ls.warp_used[w], pairs += ls.warp_pairs[w];
  if (c > 0) {
    const int d = used;  // 1 + the used ids before e: entry 0 is the shared expert
    L.expert[d] = tid;
    L.begin[d] = gn + pairs - c;  // after the shared expert's gn pairs
    ls.entry_of[tid] = d;
  }
  if (tid == kThreads - 1) {  // the scans' totals (ids past E count nothing)
    L.entries = 1 + used;
    L.begin[L.entries] = gn + pairs;
  }
  if (tid == 0) L.expert[0] = L.begin[0] = 0;
  __syncthreads();
  if (tid < n)
    L.pair[L.begin[ls.entry_of[ls.pair_expert[tid]]] + ls.pair_rank[tid]] = uint16_t((tid / kTopK) << 8 | (tid % kTopK));
  if (tid < gn) L.pair[tid] = uint16_t(tid << 8 | kTopK);  // the shared expert: slot k
  __syncthreads();
}

// The cost of the batches before entry d (F rows each): F·Σ_{d' < d} (kLoadCost + pairs of d').
__device__ __forceinline__ int64_t cost_before(const GroupList& L, int F, int d) {
  return int64_t(F) * (int64_t(kLoadCost) * d + L.begin[d]);
}

// The first batch (d·F + i, d-major) whose cost before it is at least target (target < the total).
__device__ __forceinline__ int batch_at_cost(const GroupList& L, int F, int64_t target) {
  int lo = 0, hi = L.entries - 1;  // the last entry whose cost before is <= target
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cost_before(L, F, mid) <= target)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int64_t c = kLoadCost + L.begin[lo + 1] - L.begin[lo];
  return lo * F + int((target - cost_before(L, F, lo) + c - 1) / c);  // row F: entry lo + 1's row 0, the same index
}

struct Batch {
  int d, i;  // entry, intermediate row
};

// Copies batch b's gate and up rows (this lane's chunks) into the stage at dst (entry 0's expert is 0: the shared one).
template <int S>
__device__ __forceinline__ void issue_batch(const GateUpParams& p, const GroupList& L, Batch b, int lane,
                                            uint32_t dst) {
  issue_gate_up_row<S>(p, b.d == 0, uint32_t(L.expert[b.d]), b.i, lane, dst);
}

template <int S>
__global__ void __launch_bounds__(kThreads, S <= 1 ? 4 : 2) moe_gate_up_grouped_kernel(const GroupedParams gp) {
  const GateUpParams& p = gp.p;
  // [kWarps][kStages][stage_bytes] the rings, then [kGroupTokens][S][kMoeXLaneSliceBytes] the activations.
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ GroupList L;
  __shared__ ListScratch ls;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int group = int(blockIdx.y);
  const int t0 = group * gp.B / gp.groups, gn = (group + 1) * gp.B / gp.groups - t0;  // the group's tokens
  uint8_t* my_ring = smem + warp * kStages * stage_bytes<S>();
  const uint32_t ring_addr = smem_addr(my_ring);
  const uint8_t* xsm = smem + kWarps * kStages * stage_bytes<S>();
  pdl_wait();  // the routing and the activations come from the router kernel
  list_group(p, t0, gn, L, ls);

  // Step 2: this warp's run [first, end) of the group's batches: run warp·blocks + block, so that a block's 8 runs lie
  // spread over the list (the shared expert's compute-heavy rows and the routed experts' load-heavy ones mixed on an
  // SM), each an equal share of the cost.
  const int F = p.F, warps = int(gridDim.x) * kWarps, wid = warp * int(gridDim.x) + int(blockIdx.x);
  const int64_t total = cost_before(L, F, L.entries);
  const int first = batch_at_cost(L, F, total * wid / warps);
  const int end = wid + 1 == warps ? L.entries * F : batch_at_cost(L, F, total * (wid + 1) / warps);

  // Step 3: the activations (their own cp.async group, the oldest), the run's first stages, the down rows' prefetch.
  {
    const int chunks = gn * x_token_bytes<S>() / 16;
    const uint4* src = gp.x_lanes + int64_t(t0) * (x_token_bytes<S>() / 16);
    const uint32_t dst = smem_addr(xsm);
    for (int c = int(threadIdx.x); c < chunks; c += kThreads) cp_async_16(dst + uint32_t(16 * c), src + c, 16u);
    cp_async_commit();
  }
  const auto advance = [F](Batch& b) {
    if (++b.i == F) b.i = 0, ++b.d;
  };
  Batch ahead{first / F, first - (first / F) * F};
  const Batch start = ahead;
  const int count = std::max(0, end - first);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < count) issue_batch<S>(p, L, ahead, lane, ring_addr + uint32_t(s * stage_bytes<S>()));
    cp_async_commit();
    advance(ahead);
  }
  if (p.down_ahead) prefetch_down_experts(p, L.expert, L.entries, 0);
  cp_async_wait<kStages - 1>();  // this thread's activation chunks (the oldest group)
  __syncthreads();               // everyone's
  pdl_trigger();  // after pdl_wait in every block: moe_down's early routing read stays safe (moe_dp4a.cuh)

  // Step 4.
  Batch cur = start;
  for (int it = 0; it < count; ++it) {
    const int slot_ahead = (it + kStages - 1) % kStages;
    if (it + kStages - 1 < count)
      issue_batch<S>(p, L, ahead, lane, ring_addr + uint32_t(slot_ahead * stage_bytes<S>()));
    cp_async_commit();
    advance(ahead);
    cp_async_wait<kStages - 1>();
    __syncwarp();  // every lane's chunks of this batch have landed
    const uint8_t* st = my_ring + (it % kStages) * stage_bytes<S>();
    uint4 gv[S], uv[S];
    uint32_t gsb[S], usb[S];
    read_gate_up_stage<S>(st, lane, gv, uv, gsb, usb);
    __syncwarp();  // the stage is read: the next iteration may refill it
    const int q_end = L.begin[cur.d + 1];
    for (int q = L.begin[cur.d]; q < q_end; ++q) {
      const int pr = L.pair[q], t = pr >> 8, slot = pr & 0xff;
      // Token t's activations as gate_up_lane_x leaves them: slice j's words [4][32] uint4, then (σ, σ·Σv) [32].
      GateUpX<S, false> x;
#pragma unroll
      for (int j = 0; j < S; ++j) {
        const uint8_t* xj = xsm + t * x_token_bytes<S>() + j * int(kMoeXLaneSliceBytes);
#pragma unroll
        for (int k = 0; k < 4; ++k) x.q[j][k] = reinterpret_cast<const uint4*>(xj)[32 * k + lane];
        const float2 s2 = reinterpret_cast<const float2*>(xj + 2048)[lane];
        x.sig[j] = s2.x;
        x.sx[j] = s2.y;
      }
      const float g = warp_sum(dot_row<S, false>(gv, gsb, x));
      const float u = warp_sum(dot_row<S, false>(uv, usb, x));
      if (lane == 0) p.h[(int64_t(t0 + t) * (kTopK + 1) + slot) * F + cur.i] = silu_f(g) * u;
    }
    advance(cur);
  }
  cp_async_wait<0>();
}

std::atomic<int64_t> grouped_launches{0};

template <int S>
bool launch_grouped(const GroupedParams& gp, cudaStream_t stream) {
  auto kernel = moe_gate_up_grouped_kernel<S>;
  constexpr int smem = grouped_smem<S>();
  if (smem > qtile::max_dynamic_smem()) return false;
  static bool attribute_set = false;
  if (!attribute_set) {
    TERN_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attribute_set = true;
  }
  // The resident wave shared by the groups, at most enough blocks for a full group's batches.
  const int wave = std::max(1, qtile::blocks_fit(reinterpret_cast<const void*>(kernel), smem)) * qtile::sm_count();
  const int64_t most = (int64_t(kMaxEntries) * gp.p.F + kWarps - 1) / kWarps;
  const int blocks = int(std::clamp<int64_t>(wave / gp.groups, 1, most));
  launch_pdl("moe_gate_up_grouped", kernel, dim3(unsigned(blocks), unsigned(gp.groups)), dim3(kThreads),
             size_t(smem), stream, gp);
  grouped_launches.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace

bool gate_up_grouped_takes(int cols, int E, int k, int B, bool wide) {
  // D = 4096: no cluster router writes x_lanes (see above); x_lanes hold x̂ at 16 bits only
  return B >= 2 && k == kTopK && E >= 1 && E <= kMaxExperts && (cols == 1024 || cols == 2048) && !wide;
}

bool gate_up_grouped(const GateUpParams& p, const uint4* x_lanes, int cols, int B, cudaStream_t stream) {
  if (!gate_up_grouped_takes(cols, p.E, p.k, B, p.wide) || !x_lanes || (reinterpret_cast<uintptr_t>(x_lanes) & 15))
    return false;
  const GroupedParams gp{p, x_lanes, B, (B + kGroupTokens - 1) / kGroupTokens};
  return cols == 1024 ? launch_grouped<1>(gp, stream) : launch_grouped<2>(gp, stream);
}

int64_t gate_up_grouped_launches() { return grouped_launches.load(std::memory_order_relaxed); }

}  // namespace tern::cuda::moe_parts
