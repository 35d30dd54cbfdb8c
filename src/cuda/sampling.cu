#include "cuda/sampling.cuh"

#include <cfloat>

#include "core/check.h"
#include "cuda/cuda_common.cuh"

namespace tern::cuda {
namespace {

constexpr int kThreads = 1024;

__global__ void mask_padding_kernel(float* logits, int64_t n, int64_t V, int64_t vocab_real) {
  const int64_t pad = V - vocab_real;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * pad; i += int64_t(gridDim.x) * blockDim.x)
    logits[(i / pad) * V + vocab_real + i % pad] = -INFINITY;
}

// Deterministic block reductions: every thread gets the same result, combined in a fixed order.
__device__ float block_reduce_sum(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  float s = 0.0f;
  for (int i = 0; i < kThreads / 32; ++i) s += red[i];
  return s;
}

__device__ int block_reduce_count(int v, int* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  int s = 0;
  for (int i = 0; i < kThreads / 32; ++i) s += red[i];
  return s;
}

// (value, index) arg-max with the lowest index winning ties.
__device__ void block_argmax(float& v, int& idx, float* redv, int* redi) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ov > v || (ov == v && oi < idx)) {
      v = ov;
      idx = oi;
    }
  }
  __syncthreads();
  if (threadIdx.x % 32 == 0) {
    redv[threadIdx.x / 32] = v;
    redi[threadIdx.x / 32] = idx;
  }
  __syncthreads();
  v = redv[0];
  idx = redi[0];
  for (int i = 1; i < kThreads / 32; ++i)
    if (redv[i] > v || (redv[i] == v && redi[i] < idx)) {
      v = redv[i];
      idx = redi[i];
    }
}

// Order-preserving map of a float to an unsigned key.
__device__ __forceinline__ uint32_t float_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const float* logits, int64_t V, const DeviceSampling* params,
                                                          float* p, int* out) {
  const DeviceSampling s = *params;
  __shared__ float redf[32];
  __shared__ int redi[32];
  __shared__ float thread_mass[kThreads];
  const int tid = threadIdx.x;

  // 1. arg-max.
  float best = -INFINITY;
  int best_i = 0x7fffffff;
  for (int64_t i = tid; i < V; i += kThreads) {
    const float v = logits[i];
    if (v > best) {
      best = v;
      best_i = int(i);
    }
  }
  block_argmax(best, best_i, redf, redi);
  if (s.temperature <= 0.0f || s.top_k == 1 || best == -INFINITY) {
    if (tid == 0) *out = best_i;
    return;
  }
  const float mx = best;

  // 2. top-k threshold on the logit keys: largest key τ with count(key >= τ) >= k, bit by bit from the top.
  uint32_t kth = 0;
  if (s.top_k > 0 && s.top_k < V) {
    uint32_t prefix = 0;
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t cand = prefix | (1u << bit);
      int c = 0;
      for (int64_t i = tid; i < V; i += kThreads) c += float_key(logits[i]) >= cand;
      if (block_reduce_count(c, redi) >= s.top_k) prefix = cand;
    }
    kth = prefix;
  }

  // 3. unnormalised probabilities with the top-k cut.
  const float inv_t = 1.0f / s.temperature;
  float mass = 0.0f;
  for (int64_t i = tid; i < V; i += kThreads) {
    const float l = logits[i];
    const float v = (l == -INFINITY || float_key(l) < kth) ? 0.0f : expf((l - mx) * inv_t);
    p[i] = v;
    mass += v;
  }
  float Z = block_reduce_sum(mass, redf);

  // 4. top-p: largest threshold τ (on the probability keys) whose kept mass still reaches top_p·Z.
  if (s.top_p < 1.0f) {
    const float need = s.top_p * Z;
    uint32_t prefix = 0;
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t cand = prefix | (1u << bit);
      float m = 0.0f;
      for (int64_t i = tid; i < V; i += kThreads) m += float_key(p[i]) >= cand ? p[i] : 0.0f;
      if (block_reduce_sum(m, redf) >= need) prefix = cand;
    }
    mass = 0.0f;
    for (int64_t i = tid; i < V; i += kThreads) {
      if (float_key(p[i]) < prefix) p[i] = 0.0f;
      mass += p[i];
    }
    Z = block_reduce_sum(mass, redf);
  }
  // 5. min-p relative to the largest probability (which is exp(0) = 1).
  if (s.min_p > 0.0f) {
    mass = 0.0f;
    for (int64_t i = tid; i < V; i += kThreads) {
      if (p[i] < s.min_p) p[i] = 0.0f;
      mass += p[i];
    }
    Z = block_reduce_sum(mass, redf);
  }

  // 6. inverse CDF in id order: thread tid owns the contiguous range [tid·per, (tid+1)·per).
  const uint64_t r = mix64(mix64(s.seed ^ 0x5851f42d4c957f2dULL) + s.step);
  const float frac = float(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
  const int64_t per = (V + kThreads - 1) / kThreads;
  const int64_t b = tid * per, e = b + per < V ? b + per : V;
  float local = 0.0f;
  for (int64_t i = b; i < e; ++i) local += p[i];
  thread_mass[tid] = local;
  __syncthreads();
  if (tid == 0) {
    float total = 0.0f;
    for (int i = 0; i < kThreads; ++i) total += thread_mass[i];
    const float u = frac * total;
    float acc = 0.0f;
    int owner = -1;
    for (int i = 0; i < kThreads; ++i) {
      if (thread_mass[i] > 0.0f && u < acc + thread_mass[i]) {
        owner = i;
        break;
      }
      acc += thread_mass[i];
    }
    int pick = best_i;  // rounding fallback: the most likely token
    if (owner >= 0) {
      const int64_t ob = owner * per, oe = ob + per < V ? ob + per : V;
      for (int64_t i = ob; i < oe; ++i) {
        if (p[i] > 0.0f) {
          pick = int(i);
          acc += p[i];
          if (u < acc) break;
        }
      }
    }
    *out = pick;
  }
}

}  // namespace

void mask_padding(float* logits, int64_t n, int64_t V, int64_t vocab_real, cudaStream_t stream) {
  if (vocab_real >= V || n == 0) return;
  const unsigned b = blocks_for(n * (V - vocab_real), 256);
  mask_padding_kernel<<<b > 1024 ? 1024 : b, 256, 0, stream>>>(logits, n, V, vocab_real);
  TERN_CUDA_LAUNCHED("mask_padding");
}

int64_t sample_scratch_floats(int64_t V) { return V + 32; }

DeviceSampling* sample_params_slot(float* scratch, int64_t V) {
  return reinterpret_cast<DeviceSampling*>(scratch + ((V + 7) / 8) * 8);  // 32-byte aligned after the probabilities
}

void sample_check(const DeviceSampling& s) {
  TERN_CHECK(s.temperature >= 0.0f && s.top_p > 0.0f && s.top_p <= 1.0f && s.min_p >= 0.0f && s.min_p <= 1.0f &&
                 s.top_k >= 0,
             "sampling parameters out of range (temperature ", s.temperature, ", top_p ", s.top_p, ", min_p ", s.min_p,
             ", top_k ", s.top_k, ")");
}

void sample_token_device(const float* logits, int64_t V, float* scratch, int* out, cudaStream_t stream) {
  TERN_CHECK(V > 0 && V < (int64_t(1) << 31), "sample_token: vocabulary of ", V);
  sample_kernel<<<1, kThreads, 0, stream>>>(logits, V, sample_params_slot(scratch, V), scratch, out);
  TERN_CUDA_LAUNCHED("sample_token");
}

void sample_token(const float* logits, int64_t V, const DeviceSampling& s, float* scratch, int* out, cudaStream_t stream) {
  sample_check(s);
  TERN_CUDA(cudaMemcpyAsync(sample_params_slot(scratch, V), &s, sizeof(DeviceSampling), cudaMemcpyHostToDevice, stream));
  TERN_CUDA(cudaStreamSynchronize(stream));  // the host struct may go away after return
  sample_token_device(logits, V, scratch, out, stream);
}

}  // namespace tern::cuda
