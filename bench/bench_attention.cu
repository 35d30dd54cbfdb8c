// Workbench cases of the attention family at the model's shapes (Hq 16, Hkv 2, dh 256): the tensor-core causal
// prefill (TFLOP/s, FLOPs = 4·Hq·dh·Σ_t (pos0 + t + 1)), the split-KV decode with its merge (GB/s of the K/V bytes
// read, 2·Hkv·L·dh·2) and attn_prepare.
#include <memory>
#include <string>
#include <vector>

#include "bench/workbench.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/kernels/attention/attention.cuh"

namespace tern::bench {
namespace {

using cuda::AttnDims;

// Random bits -> bf16 values of random sign and mantissa with magnitudes in [0.5, 2) (no Inf or NaN).
__global__ void tame_bf16_kernel(uint16_t* p, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = uint16_t((p[i] & 0x80ffu) | 0x3f00u);
}

uint16_t* alloc_cache(size_t elems, uint64_t seed) {
  auto* p = static_cast<uint16_t*>(bench_alloc_random_bytes(elems * 2, seed));
  tame_bf16_kernel<<<1024, 256>>>(p, elems);
  TERN_CUDA(cudaGetLastError());
  return p;
}

int* alloc_position(int value) {
  int* p = static_cast<int*>(bench_alloc_random_bytes(sizeof(int), 1));
  TERN_CUDA(cudaMemcpy(p, &value, sizeof(int), cudaMemcpyHostToDevice));
  return p;
}

// Buffers of one attention call: `copies` K/V caches (so that timed runs read device memory, not L2).
struct AttnState {
  AttnDims d;
  int64_t pos0 = 0;
  int copies = 1;
  std::vector<uint16_t*> k, v;
  float *q = nullptr, *qg = nullptr, *kin = nullptr, *vin = nullptr, *norm = nullptr, *part = nullptr, *out = nullptr;
  int* pos = nullptr;
  bool ready = false;

  void setup() {
    if (ready) return;
    const size_t cache_elems = size_t(d.Hkv) * size_t(d.capacity) * size_t(d.dh);
    copies = bench_copies_for(double(cache_elems) * 2 * 2);
    for (int c = 0; c < copies; ++c) {
      k.push_back(alloc_cache(cache_elems, 100 + 2 * c));
      v.push_back(alloc_cache(cache_elems, 101 + 2 * c));
    }
    const int64_t T = d.T;
    q = bench_alloc_random_floats(size_t(T * d.Hq * d.dh), -2.0f, 2.0f, 7);
    qg = bench_alloc_random_floats(size_t(T * d.Hq * 2 * d.dh), -2.0f, 2.0f, 8);
    kin = bench_alloc_random_floats(size_t(T * d.Hkv * d.dh), -2.0f, 2.0f, 9);
    vin = bench_alloc_random_floats(size_t(T * d.Hkv * d.dh), -1.0f, 1.0f, 10);
    norm = bench_alloc_random_floats(size_t(d.dh), 0.5f, 1.5f, 11);
    part = bench_alloc_random_floats(size_t(cuda::attn_partial_floats(T, d.Hq, d.dh)), 0.0f, 1.0f, 12);
    out = bench_alloc_random_floats(size_t(T * d.Hq * d.dh), 0.0f, 1.0f, 13);
    pos = alloc_position(int(pos0));
    TERN_CUDA(cudaDeviceSynchronize());
    ready = true;
  }
};

std::shared_ptr<AttnState> make_state(int64_t T, int64_t pos0, int64_t capacity) {
  auto s = std::make_shared<AttnState>();
  s->d.T = T;
  s->d.capacity = capacity;
  s->pos0 = pos0;
  return s;
}

void add_attention_case(CaseList& cases, const std::string& group, const std::string& name, int64_t T, int64_t pos0,
                        int64_t capacity) {
  auto s = make_state(T, pos0, capacity);
  const AttnDims& d = s->d;
  const double keys_read = double(pos0 + T);  // every key up to the last token's position is read
  const double visible = double(T) * double(pos0) + double(T) * double(T + 1) / 2.0;
  Case c;
  c.group = group;
  c.name = name;
  c.bytes = 2.0 * d.Hkv * keys_read * d.dh * 2 + double(T) * d.Hq * d.dh * 4 * 3;  // K, V; q, gate, out
  c.flops = 4.0 * d.Hq * d.dh * visible;
  c.setup = [s] { s->setup(); };
  c.run = [s](cudaStream_t stream, int rep) {
    const int i = rep % s->copies;
    cuda::attention(s->q, s->qg, s->k[size_t(i)], s->v[size_t(i)], s->pos, s->d, s->part, s->out, stream);
  };
  cases.push_back(std::move(c));
}

void add_prepare_case(CaseList& cases, const std::string& group, int64_t T) {
  auto s = make_state(T, 4096, 4096 + T);
  const AttnDims& d = s->d;
  Case c;
  c.group = group;
  c.name = "attn_prepare T=" + std::to_string(T);
  // reads q, k, v (fp32); writes q (fp32) and the new K/V rows (bf16)
  c.bytes = double(T) * (d.Hq * d.dh * 4 * 2 + 2.0 * d.Hkv * d.dh * 4 + 2.0 * d.Hkv * d.dh * 2);
  c.setup = [s] { s->setup(); };
  c.run = [s](cudaStream_t stream, int rep) {
    const int i = rep % s->copies;
    cuda::attn_prepare(s->qg, s->kin, s->vin, s->norm, s->norm, s->pos, s->d, s->q, s->k[size_t(i)],
                       s->v[size_t(i)], stream);
  };
  cases.push_back(std::move(c));
}

}  // namespace

TERN_BENCH_CASES(attention) {
  add_attention_case(cases, "prefill", "attention causal T=4096 pos0=0", 4096, 0, 4096);
  add_attention_case(cases, "prefill", "attention causal T=4096 pos0=28672 (end of a 32K prompt)", 4096, 28672, 32768);
  add_prepare_case(cases, "prefill", 4096);
  for (int64_t L : {int64_t(4096), int64_t(32768), int64_t(131072)}) {
    const std::string ctx = std::to_string(L / 1024) + "K";
    add_attention_case(cases, "decode", "attention split-KV T=1 context " + ctx, 1, L - 1, L + 64);
  }
  add_attention_case(cases, "decode", "attention split-KV T=4 context 32K", 4, 32768 - 4, 32768 + 64);
  add_prepare_case(cases, "decode", 1);
}

}  // namespace tern::bench
