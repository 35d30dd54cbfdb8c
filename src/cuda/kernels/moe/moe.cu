#include "cuda/kernels/moe/moe.cuh"

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"

namespace tern::cuda {
namespace {

// One warp per token. Each lane holds E/32 probabilities; k rounds of a warp arg-max pick the experts.
__global__ void moe_route_kernel(const float* logits, int64_t T, int E, int k, int* ids, float* w) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x / 32) + warp;
  if (t >= T) return;
  constexpr int kMaxPerLane = 32;
  float p[kMaxPerLane];
  const int per = (E + 31) / 32;
  float mx = -INFINITY;
  for (int i = 0; i < per; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < E ? logits[t * E + e] : -INFINITY;
    mx = fmaxf(mx, p[i]);
  }
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0.0f;
  for (int i = 0; i < per; ++i) {
    p[i] = lane + 32 * i < E ? expf(p[i] - mx) : -1.0f;  // -1 marks "not an expert"
    if (p[i] > 0.0f) sum += p[i];
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  float top_sum = 0.0f, my_w = 0.0f;
  int my_id = 0;
  for (int j = 0; j < k; ++j) {
    float best = -2.0f;
    int best_e = 0x7fffffff;
    for (int i = 0; i < per; ++i) {
      const int e = lane + 32 * i;
      if (p[i] > best || (p[i] == best && e < best_e)) {
        best = p[i];
        best_e = e;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
      if (ob > best || (ob == best && oe < best_e)) {
        best = ob;
        best_e = oe;
      }
    }
    const float prob = best / sum;
    top_sum += prob;
    if (lane == j) {
      my_w = prob;
      my_id = best_e;
    }
    if ((best_e & 31) == lane) p[best_e / 32] = -2.0f;  // taken
  }
  if (lane < k) {
    ids[t * k + lane] = my_id;
    w[t * k + lane] = my_w / top_sum;
  }
}

// f(i, ids[i]) for this thread's entries i = threadIdx.x + j·blockDim.x of ids [n], kIdBatch loads in flight at a
// time: one block does all of a prefill's T·k entries, so a loop of one load per step would wait on memory 32 times.
constexpr int kIdBatch = 16;
template <class F>
__device__ __forceinline__ void for_each_id_batch(const int* ids, int64_t n, F&& f) {
  for (int64_t base = threadIdx.x; base < n; base += int64_t(blockDim.x) * kIdBatch) {
    int id[kIdBatch];
#pragma unroll
    for (int j = 0; j < kIdBatch; ++j) {
      const int64_t i = base + int64_t(j) * blockDim.x;
      id[j] = i < n ? ids[i] : -1;
    }
#pragma unroll
    for (int j = 0; j < kIdBatch; ++j)
      if (id[j] >= 0) f(base + int64_t(j) * blockDim.x, id[j]);
  }
}

// Single block of 1024 threads (E ≤ 1024): histogram, a block-wide exclusive scan of the experts' positions and
// tiles (thread e owns expert e), each thread writing its expert's tiles, then a scatter. Tiles are listed by expert
// in order. Within an expert the order of positions depends on atomics; every output row is computed independently,
// so results do not.
__global__ void __launch_bounds__(1024) moe_group_kernel(const int* ids, int64_t T, int E, int k, int tile,
                                                         MoeGroups g) {
  extern __shared__ int sh[];
  int* count = sh;       // [E]
  int* cursor = sh + E;  // [E]
  __shared__ int warp_pos[32], warp_tiles[32];
  const int64_t n = T * k;
  const int e = threadIdx.x, lane = e % 32, warp = e / 32;
  if (e < E) count[e] = 0;
  __syncthreads();
  for_each_id_batch(ids, n, [&](int64_t, int id) { atomicAdd(&count[id], 1); });
  __syncthreads();
  const int c = e < E ? count[e] : 0, nt = (c + tile - 1) / tile;
  int pos = c, tiles = nt;  // inclusive scans within the warp
  for (int o = 1; o < 32; o <<= 1) {
    const int p = __shfl_up_sync(0xffffffffu, pos, o), q = __shfl_up_sync(0xffffffffu, tiles, o);
    if (lane >= o) {
      pos += p;
      tiles += q;
    }
  }
  if (lane == 31) {
    warp_pos[warp] = pos;
    warp_tiles[warp] = tiles;
  }
  __syncthreads();
  if (warp == 0) {  // scan of the warps' totals
    int wp = warp_pos[lane], wt = warp_tiles[lane];
    for (int o = 1; o < 32; o <<= 1) {
      const int p = __shfl_up_sync(0xffffffffu, wp, o), q = __shfl_up_sync(0xffffffffu, wt, o);
      if (lane >= o) {
        wp += p;
        wt += q;
      }
    }
    warp_pos[lane] = wp;
    warp_tiles[lane] = wt;
  }
  __syncthreads();
  const int start = pos - c + (warp > 0 ? warp_pos[warp - 1] : 0);
  const int first = tiles - nt + (warp > 0 ? warp_tiles[warp - 1] : 0);
  if (e < E) {
    cursor[e] = start;
    for (int j = 0; j < nt; ++j) {
      g.tile_expert[first + j] = e;
      g.tile_start[first + j] = start + j * tile;
      g.tile_count[first + j] = c - j * tile < tile ? c - j * tile : tile;
    }
  }
  if (e == int(blockDim.x) - 1) *g.num_tiles = warp_tiles[31];
  __syncthreads();
  for_each_id_batch(ids, n, [&](int64_t i, int id) {
    const int pos = atomicAdd(&cursor[id], 1);
    g.sorted_token[pos] = int(i / k);
    g.pos_of[i] = pos;
  });
}

__global__ void swiglu_kernel(const float* gate, const float* up, int64_t n, float* h) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gg = gate[i];
    h[i] = gg / (1.0f + expf(-gg)) * up[i];
  }
}

__global__ void moe_combine_kernel(float* hidden, const float* y, const int* pos_of, const float* w,
                                   const float* shared, const float* shared_logit, int64_t D, int k) {
  const int64_t t = blockIdx.x;
  const float sg = 1.0f / (1.0f + expf(-shared_logit[t]));
  for (int64_t dd = blockIdx.y * int64_t(blockDim.x) + threadIdx.x; dd < D; dd += int64_t(gridDim.y) * blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int64_t p = pos_of ? pos_of[t * k + j] : t * k + j;
      acc += w[t * k + j] * y[p * D + dd];
    }
    hidden[t * D + dd] += acc + sg * shared[t * D + dd];
  }
}

// The same, four columns per thread (D % 4 == 0, 16-byte aligned rows): the same sums in the same order.
__global__ void moe_combine4_kernel(float* hidden, const float* y, const int* pos_of, const float* w,
                                    const float* shared, const float* shared_logit, int64_t D, int k) {
  const int64_t t = blockIdx.x;
  const float sg = 1.0f / (1.0f + expf(-shared_logit[t]));
  for (int64_t d4 = blockIdx.y * int64_t(blockDim.x) + threadIdx.x; d4 < D / 4; d4 += int64_t(gridDim.y) * blockDim.x) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int j = 0; j < k; ++j) {
      const int64_t p = pos_of ? pos_of[t * k + j] : t * k + j;
      const float wj = w[t * k + j];
      const float4 v = reinterpret_cast<const float4*>(y + p * D)[d4];
      acc.x += wj * v.x;
      acc.y += wj * v.y;
      acc.z += wj * v.z;
      acc.w += wj * v.w;
    }
    float4* hp = reinterpret_cast<float4*>(hidden + t * D) + d4;
    const float4 s = reinterpret_cast<const float4*>(shared + t * D)[d4];
    float4 hv = *hp;
    hv.x += acc.x + sg * s.x;
    hv.y += acc.y + sg * s.y;
    hv.z += acc.z + sg * s.z;
    hv.w += acc.w + sg * s.w;
    *hp = hv;
  }
}

}  // namespace

void moe_route(const float* logits, int64_t T, int E, int k, int* ids, float* w, cudaStream_t stream) {
  TERN_CHECK(E >= 1 && E <= 1024 && k >= 1 && k <= 32 && k <= E, "moe_route: ", E, " experts, top-", k, " not supported");
  if (T == 0) return;
  moe_route_kernel<<<blocks_for(T, 4), 128, 0, stream>>>(logits, T, E, k, ids, w);
  TERN_CUDA_LAUNCHED("moe_route");
}

int moe_max_tiles(int64_t T, int E, int k) {
  const int64_t pairs = T * k;
  return int(pairs / 16 + (pairs < E ? pairs : E) + 1);  // tiles hold >= 1 position; at most one partial per expert
}

int64_t moe_group_ints(int64_t T, int E, int k) { return 2 * T * k + 3LL * moe_max_tiles(T, E, k) + 1 + 64; }

MoeGroups moe_groups_view(int* s, int64_t T, int E, int k) {
  const int64_t n = T * k, mt = moe_max_tiles(T, E, k);
  MoeGroups g;
  g.sorted_token = s;
  g.pos_of = s + n;
  g.tile_expert = s + 2 * n;
  g.tile_start = g.tile_expert + mt;
  g.tile_count = g.tile_start + mt;
  g.num_tiles = g.tile_count + mt;
  return g;
}

void moe_group(const int* ids, int64_t T, int E, int k, int tile, const MoeGroups& g, cudaStream_t stream) {
  TERN_CHECK(tile >= 16, "moe_group: tile ", tile, " below the bound used by moe_max_tiles");
  TERN_CHECK(E >= 1 && E <= 1024, "moe_group: ", E, " experts (at most 1024)");
  if (T == 0) return;
  moe_group_kernel<<<1, 1024, size_t(2 * E) * sizeof(int), stream>>>(ids, T, E, k, tile, g);
  TERN_CUDA_LAUNCHED("moe_group");
}

void swiglu(const float* gate, const float* up, int64_t n, float* h, cudaStream_t stream) {
  if (n == 0) return;
  const unsigned b = blocks_for(n, 256);
  swiglu_kernel<<<b > 4096 ? 4096 : b, 256, 0, stream>>>(gate, up, n, h);
  TERN_CUDA_LAUNCHED("swiglu");
}

void moe_combine(float* hidden, const float* y, const int* pos_of, const float* w, const float* shared,
                 const float* shared_logit, int64_t T, int64_t D, int k, cudaStream_t stream) {
  if (T == 0) return;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (D % 4 == 0 && aligned(hidden) && aligned(y) && aligned(shared)) {
    const dim3 grid(unsigned(T), blocks_for(D / 4, 256));
    moe_combine4_kernel<<<grid, 256, 0, stream>>>(hidden, y, pos_of, w, shared, shared_logit, D, k);
  } else {
    const dim3 grid(unsigned(T), blocks_for(D, 256));  // a row is spread over several blocks (batch 1 is latency-bound)
    moe_combine_kernel<<<grid, 256, 0, stream>>>(hidden, y, pos_of, w, shared, shared_logit, D, k);
  }
  TERN_CUDA_LAUNCHED("moe_combine");
}

}  // namespace tern::cuda
