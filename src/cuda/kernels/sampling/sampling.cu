// Token sampling spread over the whole GPU: four kernels, each with one block per chunk of the vocabulary.
//
//   1. sample_max:    per-block max (lowest id on ties), min and count of the finite logits; zeroes the state.
//   2. sample_hist:   every block combines the block maxima (greedy ends here: block 0 writes the arg-max), then
//                     histograms its logits by the scaled distance d = (max − l)/T into kBins bins (count and
//                     fixed-point probability mass p = e^−d in units of 2^−40); the last block (ticket) turns the
//                     histogram into prefix sums and finds the bins holding the top-k and top-p cuts.
//   3. sample_select: compacts the logits of those few bins into a candidate list; the last block finds the exact
//                     cut keys by radix selection over the candidates (by count for top-k, by mass for top-p), or,
//                     when the bins are too crowded, block 0 selects over all logits (slow, exact, rare).
//   4. sample_draw:   every block sums the kept mass of its chunk; the last block draws u in [0, Z) from
//                     (seed, step), finds the chunk holding u in id order and the id within it.
//
// Masses are 64-bit integers (p·2^40 rounded), so every sum is exact and independent of the order in which blocks
// or atomics combine: the result is deterministic, and the inverse CDF never falls off the end. Thresholds are on
// the order-preserving integer keys of the logits (p is monotone in the logit): kept = finite ∧ key ≥ τ ∧ p ≥ min_p.
#include "cuda/kernels/sampling/sampling.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/launch.cuh"

namespace tern::cuda {
namespace {

using u64 = unsigned long long;

constexpr int kThreads = 512;                 // every kernel
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 2048;                   // histogram bins over d = (max − l)/T
constexpr int kBinsPerThread = kBins / kThreads;
constexpr float kDistCap = 29.0f;             // e^−29·2^40 < 0.5: ids this far below the max have no mass
constexpr int kMaxBlocks = 256;               // chunks of the vocabulary
constexpr int kChunkQuantum = 4 * kThreads;   // a chunk is a multiple of this (each thread a multiple of 4 logits)
constexpr uint32_t kCandCap = 16384;          // candidate keys compacted for the exact cuts
constexpr float kMassOne = 1099511627776.0f;  // 2^40: fixed-point unit of probability (p = 1 is the max id)
constexpr unsigned kFull = 0xffffffffu;

static_assert(kBins % kThreads == 0 && kMaxBlocks <= kThreads, "layout assumptions");

// Per-block result of sample_max.
struct BlockMax {
  u64 best;          // (key << 32) | ~id of the largest finite logit, lowest id on ties; 0: none
  uint32_t min_key;  // key of the smallest finite logit (0xffffffff: none)
  uint32_t finite;   // count of finite logits
};

// Shared by the four kernels through device memory. The tickets, candidate count and `done` are zeroed by
// sample_max; everything else is written before it is read within one call.
struct SampleState {
  uint32_t hist_ticket, select_ticket, draw_ticket, cand_count;
  int32_t done;    // 1: the arg-max has been written (greedy), later kernels return
  int32_t argmax;  // of the finite logits
  // Probability context: d = (max_logit − l)·inv_t, p = e^−d, bin = d < d_max ? min(d·bin_scale, kBins−1) : kBins−1.
  float max_logit, inv_t, d_max, bin_scale;
  // Plan from the histogram: refine 0 = τ final, 1 = candidates compacted, 2 = select over all logits.
  int32_t refine;
  int32_t topk_bin;                   // bin holding the k-th largest logit (-1: top-k off)
  int32_t topp_bin_lo, topp_bin_hi;   // bins that may hold the top-p cut (-1: top-p off)
  uint32_t n_cand;                    // logits in those bins
  uint32_t tau;                       // kept: key >= tau (0: every finite logit)
  u64 z_all;                          // mass of every finite logit (used only with top-k off)
};

// Byte offsets inside the scratch; independent of V.
constexpr size_t kOffParams = 0;
constexpr size_t kOffState = 64;
constexpr size_t kOffHistCnt = 256;                                      // uint32 [kBins]
constexpr size_t kOffHistMass = kOffHistCnt + kBins * 4;                 // u64 [kBins]
constexpr size_t kOffBlockMax = kOffHistMass + kBins * 8;                // BlockMax [kMaxBlocks]
constexpr size_t kOffBlockMass = kOffBlockMax + kMaxBlocks * 16;         // u64 [kMaxBlocks]
constexpr size_t kOffCand = kOffBlockMass + kMaxBlocks * 8;              // uint32 [kCandCap]
constexpr size_t kScratchBytes = kOffCand + size_t(kCandCap) * 4;
static_assert(sizeof(DeviceSampling) <= kOffState - kOffParams && sizeof(SampleState) <= kOffHistCnt - kOffState &&
                  sizeof(BlockMax) == 16,
              "scratch layout");

struct SampleScratch {
  const DeviceSampling* params;
  SampleState* state;
  uint32_t* hist_cnt;   // [kBins] counts per bin; after sample_hist the inclusive prefix over bins
  u64* hist_mass;       // [kBins] mass per bin; after sample_hist the inclusive prefix over bins
  BlockMax* block_max;  // [blocks]
  u64* block_mass;      // [blocks] kept mass per chunk
  uint32_t* cand;       // [kCandCap] candidate keys (any order)
};

__host__ __device__ SampleScratch scratch_view(float* scratch) {
  auto* b = reinterpret_cast<uint8_t*>(scratch);
  return SampleScratch{reinterpret_cast<const DeviceSampling*>(b + kOffParams), reinterpret_cast<SampleState*>(b + kOffState),
                       reinterpret_cast<uint32_t*>(b + kOffHistCnt), reinterpret_cast<u64*>(b + kOffHistMass),
                       reinterpret_cast<BlockMax*>(b + kOffBlockMax), reinterpret_cast<u64*>(b + kOffBlockMass),
                       reinterpret_cast<uint32_t*>(b + kOffCand)};
}

// Chunk of the vocabulary per block: a multiple of kChunkQuantum, at most kMaxBlocks chunks.
int64_t chunk_for(int64_t V) {
  const int64_t c = (V + kMaxBlocks - 1) / kMaxBlocks;
  return std::max<int64_t>(kChunkQuantum, (c + kChunkQuantum - 1) / kChunkQuantum * kChunkQuantum);
}

// ---- device helpers ----

__global__ void mask_padding_kernel(float* logits, int64_t n, int64_t V, int64_t vocab_real) {
  const int64_t pad = V - vocab_real;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * pad; i += int64_t(gridDim.x) * blockDim.x)
    logits[(i / pad) * V + vocab_real + i % pad] = -INFINITY;
}

// Order-preserving map of a float to an unsigned key, and back.
__device__ __forceinline__ uint32_t float_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_float(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__device__ __forceinline__ u64 mix64(u64 x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

struct ProbCtx {
  float max_logit, inv_t, d_max, bin_scale;
};

__device__ __forceinline__ float dist_of(float l, const ProbCtx& c) { return (c.max_logit - l) * c.inv_t; }
__device__ __forceinline__ int bin_of(float d, const ProbCtx& c) {
  if (!(d < c.d_max)) return kBins - 1;
  const int b = int(d * c.bin_scale);
  return b < kBins - 1 ? b : kBins - 1;
}
__device__ __forceinline__ float prob_of(float d) { return expf(-d); }
__device__ __forceinline__ u64 fixed_mass(float p) { return __float2ull_rn(p * kMassOne); }

// The same context in every kernel from the same inputs (bit-identical floats).
__device__ ProbCtx make_ctx(uint32_t max_key, uint32_t min_key, float temperature) {
  ProbCtx c;
  c.max_logit = key_float(max_key);
  c.inv_t = 1.0f / temperature;
  const float range = (c.max_logit - key_float(min_key)) * c.inv_t;
  c.d_max = fminf(range, kDistCap);
  if (!(c.d_max > 1e-30f)) c.d_max = 1e-30f;  // all (nearly) equal: everything lands in bin 0
  c.bin_scale = float(kBins - 1) / c.d_max;
  return c;
}

__device__ __forceinline__ ProbCtx ctx_of(const SampleState& st) {
  return ProbCtx{st.max_logit, st.inv_t, st.d_max, st.bin_scale};
}

// Mass that top_p of z requires: ceil(top_p·z), at most z.
__device__ __forceinline__ u64 mass_needed(float top_p, u64 z) {
  const double t = ceil(double(top_p) * double(z));
  return t >= double(z) ? z : u64(t);
}

// Four logits [i, i+4) (NaN past V), with one 16-byte load when aligned.
__device__ __forceinline__ void load4(const float* logits, int64_t V, int64_t i, float (&v)[4]) {
  if (i + 4 <= V && (reinterpret_cast<uintptr_t>(logits + i) & 15) == 0) {
    const float4 x = *reinterpret_cast<const float4*>(logits + i);
    v[0] = x.x;
    v[1] = x.y;
    v[2] = x.z;
    v[3] = x.w;
  } else {
    for (int e = 0; e < 4; ++e) v[e] = i + e < V ? logits[i + e] : __int_as_float(0x7fc00000);
  }
}

// Thread t of a block owns the contiguous logits [chunk0 + t·per, chunk0 + (t+1)·per), per = chunk / kThreads (a
// multiple of 4). f(i, l) is called for each of them in id order, NaN past V; every lane of a warp calls f the same
// number of times (warp-collective code inside f is fine).
template <typename F>
__device__ __forceinline__ void for_thread_logits(const float* logits, int64_t V, int64_t chunk0, int64_t chunk, F&& f) {
  const int64_t per = chunk / kThreads;
  const int64_t begin = chunk0 + threadIdx.x * per;
  for (int64_t j = 0; j < per; j += 4) {
    float v[4];
    load4(logits, V, begin + j, v);
    for (int e = 0; e < 4; ++e) f(begin + j + e, v[e]);
  }
}

template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// Every thread gets op over the block, combined in a fixed order. red: shared [kWarps].
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T* red) {
  v = warp_reduce(v, op);
  __syncthreads();  // red may still be read by a previous call
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  T r = red[0];
  for (int w = 1; w < kWarps; ++w) r = op(r, red[w]);
  return r;
}

// Exclusive prefix sum over the threads of the block (in thread order); total: the block's sum. red: shared [kWarps].
template <typename T>
__device__ T block_exclusive_scan(T v, T* red, T& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T x = v;
  for (int o = 1; o < 32; o <<= 1) {
    const T y = __shfl_up_sync(kFull, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();
  if (lane == 31) red[warp] = x;
  __syncthreads();
  T base = 0;
  total = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) base += red[w];
    total += red[w];
  }
  return base + x - v;
}

struct MaxOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};
struct MinOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a < b ? a : b; }
};
struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};

// Last-block ticket: after every thread's global writes of this block, returns true in every thread of the block
// that arrives last (its reads of the other blocks' results must bypass L1: __ldcg).
__device__ bool last_block(uint32_t* ticket, int* flag) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) *flag = atomicAdd(ticket, 1u) == gridDim.x - 1;
  __syncthreads();
  const bool last = *flag != 0;
  if (last) __threadfence();
  return last;
}

// ---- exact selection in one block ----

// Keys that the last block selects over: the compacted candidates, or every finite logit.
struct ItemSource {
  const uint32_t* cand;  // nullptr: all logits
  uint32_t n_cand;
  const float* logits;
  int64_t V;
  template <typename F>
  __device__ void visit(F&& f) const {
    if (cand) {
      for (uint32_t j = threadIdx.x; j < n_cand; j += kThreads) f(__ldcg(cand + j));
    } else {
      for (int64_t i = threadIdx.x; i < V; i += kThreads) {
        const float l = logits[i];
        if (isfinite(l)) f(float_key(l));
      }
    }
  }
};

struct SelectShared {
  u64 hist[256];
  u64 red64[kWarps];
  uint32_t red32[kWarps];
  uint32_t digit;
  u64 target;
};

// The largest key τ with Σ weight(key) over the items with key >= τ reaching `target` (>= 1); weight 0 leaves an
// item out. Radix descent from the highest bit in which the weighted keys differ, 8 bits per pass, integer sums.
template <typename Weight>
__device__ uint32_t block_select(const ItemSource& src, Weight weight, u64 target, SelectShared& sh) {
  uint32_t kmin = 0xffffffffu, kmax = 0;
  src.visit([&](uint32_t key) {
    if (weight(key) != 0) {
      kmin = min(kmin, key);
      kmax = max(kmax, key);
    }
  });
  kmin = block_reduce(kmin, MinOp{}, sh.red32);
  kmax = block_reduce(kmax, MaxOp{}, sh.red32);
  if (kmin > kmax) return 0;  // nothing weighted (the callers' targets make this impossible): keep all
  if (kmin == kmax) return kmax;
  int low = 32 - __clz(kmin ^ kmax);  // bits below the common prefix
  uint32_t prefix = low == 32 ? 0u : (kmax >> low) << low;
  const int lane = threadIdx.x & 31;
  while (low > 0) {
    const int width = low < 8 ? low : 8, shift = low - width;
    for (int g = threadIdx.x; g < 256; g += kThreads) sh.hist[g] = 0;
    __syncthreads();
    src.visit([&](uint32_t key) {
      if ((u64(key) >> low) != (u64(prefix) >> low)) return;
      const u64 w = weight(key);
      if (w) atomicAdd(&sh.hist[(key >> shift) & ((1u << width) - 1)], w);
    });
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane L owns digits 255 − 8L down to 248 − 8L: the first lane whose running sum from the top reaches target.
      u64 own = 0;
      for (int s = 0; s < 8; ++s) own += sh.hist[255 - 8 * lane - s];
      u64 incl = own;
      for (int o = 1; o < 32; o <<= 1) {
        const u64 y = __shfl_up_sync(kFull, incl, o);
        if (lane >= o) incl += y;
      }
      const unsigned hit = __ballot_sync(kFull, incl >= target);
      if (hit == 0) {
        if (lane == 0) sh.digit = 0;  // unreachable target: keep the whole subtree
        if (lane == 0) sh.target = target;
      } else if (lane == __ffs(hit) - 1) {
        u64 acc = incl - own;
        int g = 255 - 8 * lane;
        for (int s = 0; s < 8; ++s, --g) {
          if (acc + sh.hist[g] >= target) break;
          acc += sh.hist[g];
        }
        sh.digit = uint32_t(g);
        sh.target = target - acc;
      }
    }
    __syncthreads();
    prefix |= sh.digit << shift;
    target = sh.target;
    low = shift;
  }
  return prefix;
}

// ---- kernels ----
// Each kernel samples row blockIdx.y of a launch (sample_tokens_device: one per sequence; sample_token_device: row
// 0 only): logits row y, the scratch at scratch + y·stride floats, output out[y]. Every row runs the code and the
// blocks of a one-row launch, so its id is the same either way.

__device__ __forceinline__ SampleScratch row_of(const float*& logits, int64_t V, float* scratch, int64_t stride) {
  logits += int64_t(blockIdx.y) * V;
  return scratch_view(scratch + int64_t(blockIdx.y) * stride);
}

__global__ void __launch_bounds__(kThreads) sample_max_kernel(const float* logits, int64_t V, int64_t chunk, float* scratch,
                                                              int64_t stride) {
  pdl_wait();
  pdl_trigger();
  const SampleScratch sc = row_of(logits, V, scratch, stride);
  __shared__ u64 red64[kWarps];
  __shared__ uint32_t red32[kWarps];
  u64 best = 0;
  uint32_t lo = 0xffffffffu, finite = 0;
  for_thread_logits(logits, V, int64_t(blockIdx.x) * chunk, chunk, [&](int64_t i, float l) {
    if (!isfinite(l)) return;
    const uint32_t key = float_key(l);
    const u64 packed = (u64(key) << 32) | u64(~uint32_t(i));
    best = packed > best ? packed : best;
    lo = min(lo, key);
    ++finite;
  });
  best = block_reduce(best, MaxOp{}, red64);
  lo = block_reduce(lo, MinOp{}, red32);
  finite = block_reduce(finite, SumOp{}, red32);
  if (threadIdx.x == 0) sc.block_max[blockIdx.x] = BlockMax{best, lo, finite};
  // Zero what the later kernels accumulate into.
  for (int64_t b = blockIdx.x * int64_t(kThreads) + threadIdx.x; b < kBins; b += int64_t(gridDim.x) * kThreads) {
    sc.hist_cnt[b] = 0;
    sc.hist_mass[b] = 0;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    SampleState* st = sc.state;
    st->hist_ticket = st->select_ticket = st->draw_ticket = st->cand_count = 0;
    st->done = 0;
  }
}

__global__ void __launch_bounds__(kThreads) sample_hist_kernel(const float* logits, int64_t V, int64_t chunk, float* scratch,
                                                               int64_t stride, int* out) {
  pdl_wait();
  pdl_trigger();
  const SampleScratch sc = row_of(logits, V, scratch, stride);
  out += blockIdx.y;
  __shared__ uint32_t s_cnt[kBins];
  __shared__ u64 s_mass[kBins];
  __shared__ u64 red64[kWarps];
  __shared__ uint32_t red32[kWarps];
  __shared__ int flag;
  const DeviceSampling s = *sc.params;
  const int tid = threadIdx.x;

  // Combine the block maxima (every block, the same result).
  u64 best = 0;
  uint32_t lo = 0xffffffffu, finite = 0;
  if (tid < int(gridDim.x)) {
    const BlockMax m = sc.block_max[tid];
    best = m.best;
    lo = m.min_key;
    finite = m.finite;
  }
  best = block_reduce(best, MaxOp{}, red64);
  lo = block_reduce(lo, MinOp{}, red32);
  finite = block_reduce(finite, SumOp{}, red32);
  const int argmax = finite ? int(~uint32_t(best & 0xffffffffu)) : 0;
  if (!(s.temperature > 0.0f) || s.top_k == 1 || finite == 0) {
    if (blockIdx.x == 0 && tid == 0) {
      *out = argmax;
      sc.state->done = 1;
    }
    return;
  }
  const ProbCtx ctx = make_ctx(uint32_t(best >> 32), lo, s.temperature);
  const bool topk = s.top_k > 0 && uint32_t(s.top_k) < finite;
  const bool topp = s.top_p < 1.0f;
  auto write_ctx = [&](SampleState* st) {
    st->argmax = argmax;
    st->max_logit = ctx.max_logit;
    st->inv_t = ctx.inv_t;
    st->d_max = ctx.d_max;
    st->bin_scale = ctx.bin_scale;
  };
  if (!topk && !topp) {  // no cut: every finite logit is kept (then min-p)
    if (blockIdx.x == 0 && tid == 0) {
      SampleState* st = sc.state;
      write_ctx(st);
      st->refine = 0;
      st->tau = 0;
      st->topk_bin = st->topp_bin_lo = st->topp_bin_hi = -1;
    }
    return;
  }

  // Block histogram: count and mass per bin, one atomic per warp when all its lanes agree on the bin.
  for (int b = tid; b < kBins; b += kThreads) {
    s_cnt[b] = 0;
    s_mass[b] = 0;
  }
  __syncthreads();
  const int lane = tid & 31;
  for_thread_logits(logits, V, int64_t(blockIdx.x) * chunk, chunk, [&](int64_t, float l) {
    int b = -1;
    u64 q = 0;
    if (isfinite(l)) {
      const float d = dist_of(l, ctx);
      b = bin_of(d, ctx);
      q = fixed_mass(prob_of(d));
    }
    const int lane0_bin = __shfl_sync(kFull, b, 0);
    if (__all_sync(kFull, b == lane0_bin)) {
      const u64 wq = warp_reduce(q, SumOp{});
      if (lane == 0 && lane0_bin >= 0) {
        atomicAdd(&s_cnt[lane0_bin], 32u);
        if (wq) atomicAdd(&s_mass[lane0_bin], wq);
      }
    } else if (b >= 0) {
      atomicAdd(&s_cnt[b], 1u);
      if (q) atomicAdd(&s_mass[b], q);
    }
  });
  __syncthreads();
  // Thread t owns bins [bin0, bin0 + kBinsPerThread) in the prefix computations below.
  const int bin0 = tid * kBinsPerThread;
  int flush_end = kBins;
  if (topk) {
    // The global k-th largest lies at or before this block's own k-th largest (the block alone has k logits at or
    // above it): bins after that one need not be flushed, which leaves their global counts and masses partial.
    uint32_t own = 0;
    for (int j = 0; j < kBinsPerThread; ++j) own += s_cnt[bin0 + j];
    uint32_t block_count;
    uint32_t acc = block_exclusive_scan(own, red32, block_count);
    uint32_t below = 0;
    for (int j = 0; j < kBinsPerThread; ++j) {
      acc += s_cnt[bin0 + j];
      below += acc < uint32_t(s.top_k);
    }
    const uint32_t local_bk = block_reduce(below, SumOp{}, red32);
    if (block_count >= uint32_t(s.top_k)) flush_end = int(local_bk) + 1;
  }
  for (int b = tid; b < flush_end; b += kThreads) {
    if (s_cnt[b]) atomicAdd(&sc.hist_cnt[b], s_cnt[b]);
    if (s_mass[b]) atomicAdd(&sc.hist_mass[b], s_mass[b]);
  }
  if (!last_block(&sc.state->hist_ticket, &flag)) return;

  // Last block: inclusive prefix over bins (ascending bin = descending logit), into shared and back into the
  // global histogram for sample_select. With top-k only the bins up to the k-th largest are complete, and only
  // those are used.
  const int b0 = bin0;
  uint32_t c[kBinsPerThread];
  u64 m[kBinsPerThread];
  uint32_t csum = 0;
  u64 msum = 0;
  for (int j = 0; j < kBinsPerThread; ++j) {
    c[j] = __ldcg(sc.hist_cnt + b0 + j);
    m[j] = __ldcg(sc.hist_mass + b0 + j);
    csum += c[j];
    msum += m[j];
  }
  uint32_t n_fin;
  u64 z_all;
  uint32_t cacc = block_exclusive_scan(csum, red32, n_fin);
  u64 macc = block_exclusive_scan(msum, red64, z_all);
  for (int j = 0; j < kBinsPerThread; ++j) {
    cacc += c[j];
    macc += m[j];
    s_cnt[b0 + j] = cacc;
    s_mass[b0 + j] = macc;
    sc.hist_cnt[b0 + j] = cacc;
    sc.hist_mass[b0 + j] = macc;
  }
  __syncthreads();
  // Bin of the k-th largest: the number of bins whose inclusive count is still below k.
  int bk = kBins - 1;
  if (topk) {
    uint32_t below = 0;
    for (int j = 0; j < kBinsPerThread; ++j) below += s_cnt[b0 + j] < uint32_t(s.top_k);
    bk = int(block_reduce(below, SumOp{}, red32));
  }
  // Bins of the top-p cut for the top-k mass Z_k, which lies between the mass above bin bk and that through it.
  int bp_lo = -1, bp_hi = -1;
  if (topp) {
    const u64 z_lo = topk ? (bk > 0 ? s_mass[bk - 1] : 0) : z_all;
    const u64 z_hi = topk ? s_mass[bk] : z_all;
    const u64 need_lo = mass_needed(s.top_p, z_lo), need_hi = mass_needed(s.top_p, z_hi);
    uint32_t below_lo = 0, below_hi = 0;
    for (int j = 0; j < kBinsPerThread; ++j) {
      below_lo += s_mass[b0 + j] < need_lo;
      below_hi += s_mass[b0 + j] < need_hi;
    }
    bp_lo = int(block_reduce(below_lo, SumOp{}, red32));
    bp_hi = int(block_reduce(below_hi, SumOp{}, red32));
  }
  if (tid == 0) {
    auto excl = [&](int b) { return b > 0 ? s_cnt[b - 1] : 0u; };
    uint32_t n = 0;
    if (topk) n += s_cnt[bk] - excl(bk);
    if (topp) {
      n += s_cnt[bp_hi] - excl(bp_lo);
      if (topk && bp_lo <= bk && bk <= bp_hi) n -= s_cnt[bk] - excl(bk);
    }
    SampleState* st = sc.state;
    write_ctx(st);
    st->topk_bin = topk ? bk : -1;
    st->topp_bin_lo = bp_lo;
    st->topp_bin_hi = bp_hi;
    st->n_cand = n;
    st->z_all = z_all;
    st->tau = 0;
    st->refine = n <= kCandCap ? 1 : 2;
  }
}

__global__ void __launch_bounds__(kThreads) sample_select_kernel(const float* logits, int64_t V, int64_t chunk,
                                                                 float* scratch, int64_t stride) {
  pdl_wait();
  pdl_trigger();
  const SampleScratch sc = row_of(logits, V, scratch, stride);
  __shared__ SelectShared sh;
  __shared__ int flag;
  const SampleState st = *sc.state;
  if (st.done || st.refine == 0) return;
  const ProbCtx ctx = ctx_of(st);
  const int bk = st.topk_bin, bp_lo = st.topp_bin_lo, bp_hi = st.topp_bin_hi;
  auto is_candidate = [&](int b) { return b == bk || (bp_lo <= b && b <= bp_hi); };  // -1 bins never match

  ItemSource src{nullptr, 0, logits, V};
  if (st.refine == 1) {
    const int lane = threadIdx.x & 31;
    for_thread_logits(logits, V, int64_t(blockIdx.x) * chunk, chunk, [&](int64_t, float l) {
      const bool take = isfinite(l) && is_candidate(bin_of(dist_of(l, ctx), ctx));
      const unsigned ballot = __ballot_sync(kFull, take);
      if (ballot == 0) return;
      const int leader = __ffs(ballot) - 1;
      uint32_t base = 0;
      if (lane == leader) base = atomicAdd(&sc.state->cand_count, uint32_t(__popc(ballot)));
      base = __shfl_sync(kFull, base, leader);
      const uint32_t slot = base + __popc(ballot & ((1u << lane) - 1));
      if (take && slot < kCandCap) sc.cand[slot] = float_key(l);
    });
    if (!last_block(&sc.state->select_ticket, &flag)) return;
    src.cand = sc.cand;
    src.n_cand = min(__ldcg(&sc.state->cand_count), kCandCap);
  } else if (blockIdx.x != 0) {
    return;  // too many candidates: block 0 selects over all logits
  }

  const DeviceSampling s = *sc.params;
  // Top-k: the k-th largest key, r-th within bin bk.
  uint32_t tau_k = 0;
  u64 z_k = st.z_all;
  if (bk >= 0) {
    const uint32_t above = bk > 0 ? __ldcg(sc.hist_cnt + bk - 1) : 0u;
    tau_k = block_select(
        src, [&](uint32_t key) -> u64 { return bin_of(dist_of(key_float(key), ctx), ctx) == bk ? 1 : 0; },
        u64(uint32_t(s.top_k) - above), sh);
    u64 in_bin = 0;
    src.visit([&](uint32_t key) {
      if (key < tau_k) return;
      const float d = dist_of(key_float(key), ctx);
      if (bin_of(d, ctx) == bk) in_bin += fixed_mass(prob_of(d));
    });
    z_k = (bk > 0 ? __ldcg(sc.hist_mass + bk - 1) : 0ull) + block_reduce(in_bin, SumOp{}, sh.red64);
  }
  // Top-p over the top-k mass: the bin where the running mass reaches ceil(top_p·Z_k), then the key within it.
  uint32_t tau_p = 0;
  if (bp_lo >= 0) {
    const u64 need = mass_needed(s.top_p, z_k);
    uint32_t below = 0;
    for (int b = bp_lo + int(threadIdx.x); b < bp_hi; b += kThreads) below += __ldcg(sc.hist_mass + b) < need;
    const int bp = bp_lo + int(block_reduce(below, SumOp{}, sh.red32));
    const u64 above = bp > 0 ? __ldcg(sc.hist_mass + bp - 1) : 0ull;
    tau_p = block_select(
        src,
        [&](uint32_t key) -> u64 {
          if (key < tau_k) return 0;
          const float d = dist_of(key_float(key), ctx);
          return bin_of(d, ctx) == bp ? fixed_mass(prob_of(d)) : 0;
        },
        need - above, sh);
  }
  if (threadIdx.x == 0) sc.state->tau = tau_k > tau_p ? tau_k : tau_p;
}

// Kept mass of one logit: finite, key >= tau, p >= min_p.
__device__ __forceinline__ u64 kept_mass(float l, const ProbCtx& ctx, uint32_t tau, float min_p) {
  if (!isfinite(l) || float_key(l) < tau) return 0;
  const float p = prob_of(dist_of(l, ctx));
  return p < min_p ? 0 : fixed_mass(p);
}

__global__ void __launch_bounds__(kThreads) sample_draw_kernel(const float* logits, int64_t V, int64_t chunk, float* scratch,
                                                               int64_t stride, int* out) {
  pdl_wait();
  pdl_trigger();
  const SampleScratch sc = row_of(logits, V, scratch, stride);
  out += blockIdx.y;
  __shared__ u64 red64[kWarps];
  __shared__ int flag, s_block;
  __shared__ u64 s_u;
  const SampleState st = *sc.state;
  if (st.done) return;
  const DeviceSampling s = *sc.params;
  const ProbCtx ctx = ctx_of(st);
  const int tid = threadIdx.x;

  u64 mine = 0;
  for_thread_logits(logits, V, int64_t(blockIdx.x) * chunk, chunk,
                    [&](int64_t, float l) { mine += kept_mass(l, ctx, st.tau, s.min_p); });
  const u64 block_total = block_reduce(mine, SumOp{}, red64);
  if (tid == 0) sc.block_mass[blockIdx.x] = block_total;
  if (!last_block(&sc.state->draw_ticket, &flag)) return;

  // Last block: u uniform in [0, Z), the chunk holding it in id order, then the id within the chunk.
  const u64 part = tid < int(gridDim.x) ? __ldcg(sc.block_mass + tid) : 0ull;
  u64 z;
  const u64 base = block_exclusive_scan(part, red64, z);
  const u64 u = __umul64hi(z, mix64(mix64(u64(s.seed) ^ 0x5851f42d4c957f2dULL) + u64(s.step)));
  if (tid == 0) s_block = -1;
  __syncthreads();
  if (part > 0 && base <= u && u < base + part) {
    s_block = tid;
    s_u = u - base;
  }
  __syncthreads();
  const int owner = s_block;
  if (owner < 0) {  // cannot happen: z >= 2^40 (the max id is always kept) and u < z
    if (tid == 0) *out = st.argmax;
    return;
  }
  const u64 target = s_u;
  // The owner chunk again, the same per-thread ranges: the thread whose mass interval holds target walks its ids.
  u64 own = 0;
  for_thread_logits(logits, V, int64_t(owner) * chunk, chunk,
                    [&](int64_t, float l) { own += kept_mass(l, ctx, st.tau, s.min_p); });
  u64 chunk_total;
  u64 acc = block_exclusive_scan(own, red64, chunk_total);
  if (own > 0 && acc <= target && target < acc + own) {
    int64_t pick = -1;
    for_thread_logits(logits, V, int64_t(owner) * chunk, chunk, [&](int64_t i, float l) {
      if (pick >= 0) return;
      acc += kept_mass(l, ctx, st.tau, s.min_p);
      if (target < acc) pick = i;
    });
    *out = int(pick);
  }
}

}  // namespace

void mask_padding(float* logits, int64_t n, int64_t V, int64_t vocab_real, cudaStream_t stream) {
  if (vocab_real >= V || n == 0) return;
  const unsigned b = blocks_for(n * (V - vocab_real), 256);
  mask_padding_kernel<<<b > 1024 ? 1024 : b, 256, 0, stream>>>(logits, n, V, vocab_real);
  TERN_CUDA_LAUNCHED("mask_padding");
}

int64_t sample_scratch_floats(int64_t V) { return int64_t((kScratchBytes + 3) / 4); }

DeviceSampling* sample_params_slot(float* scratch, int64_t V) {
  return reinterpret_cast<DeviceSampling*>(reinterpret_cast<uint8_t*>(scratch) + kOffParams);
}

void sample_check(const DeviceSampling& s) {
  TERN_CHECK(std::isfinite(s.temperature) && s.temperature >= 0.0f && s.top_p > 0.0f && s.top_p <= 1.0f && s.min_p >= 0.0f && s.min_p <= 1.0f &&
                 s.top_k >= 0,
             "sampling parameters out of range (temperature ", s.temperature, ", top_p ", s.top_p, ", min_p ", s.min_p,
             ", top_k ", s.top_k, ")");
}

void sample_tokens_device(const float* logits, int64_t V, int rows, float* scratch, int64_t scratch_stride, int* out,
                          cudaStream_t stream) {
  // V < 2^24 keeps the fixed-point mass of the whole vocabulary below 2^64.
  TERN_CHECK(V > 0 && V < (int64_t(1) << 24), "sample_token: vocabulary of ", V, " (supported: 1 to 2^24 - 1)");
  TERN_CHECK(rows >= 1 && rows <= 65535, "sample_tokens: ", rows, " rows (1 to 65535)");
  TERN_CHECK(rows == 1 || scratch_stride >= sample_scratch_floats(V),
             "sample_tokens: scratch stride ", scratch_stride, " floats, below one row's ", sample_scratch_floats(V));
  TERN_CHECK(reinterpret_cast<uintptr_t>(scratch) % 16 == 0 && scratch_stride % 4 == 0,
             "sample_token: scratch (and every row's, scratch_stride floats apart) must be 16-byte aligned");
  const int64_t chunk = chunk_for(V);
  const dim3 grid(unsigned((V + chunk - 1) / chunk), unsigned(rows)), block(kThreads);
  launch_pdl("sample_max", sample_max_kernel, grid, block, 0, stream, logits, V, chunk, scratch, scratch_stride);
  launch_pdl("sample_hist", sample_hist_kernel, grid, block, 0, stream, logits, V, chunk, scratch, scratch_stride,
             out);
  launch_pdl("sample_select", sample_select_kernel, grid, block, 0, stream, logits, V, chunk, scratch,
             scratch_stride);
  launch_pdl("sample_draw", sample_draw_kernel, grid, block, 0, stream, logits, V, chunk, scratch, scratch_stride,
             out);
}

void sample_token_device(const float* logits, int64_t V, float* scratch, int* out, cudaStream_t stream) {
  sample_tokens_device(logits, V, 1, scratch, 0, out, stream);
}

void sample_token(const float* logits, int64_t V, const DeviceSampling& s, float* scratch, int* out, cudaStream_t stream) {
  sample_check(s);
  TERN_CUDA(cudaMemcpyAsync(sample_params_slot(scratch, V), &s, sizeof(DeviceSampling), cudaMemcpyHostToDevice, stream));
  TERN_CUDA(cudaStreamSynchronize(stream));  // the host struct may go away after return
  sample_token_device(logits, V, scratch, out, stream);
}

}  // namespace tern::cuda
