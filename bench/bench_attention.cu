// Workbench cases of the attention family at the model's shapes (Hq 16, Hkv 2, dh 256): the tensor-core causal
// prefill (TFLOP/s, FLOPs = 4·Hq·dh·Σ_t (pos0 + t + 1)), the split-KV decode with its merge (GB/s of the K/V bytes
// read, 2·Hkv·L·dh·2) and attn_prepare; the batched decode step's attention_batched (B sequences of one token) with
// its default kernel and its opt-in items-per-block form (attn_batch_set_items).
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

// Random bytes -> n row scales of a scaled cache (fp8, i16), each 2^-10 (finite, so that no row reads back NaN).
__global__ void fill_scales_kernel(float* p, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = 0x1p-10f;
}

// One layer's K or V cache of d.capacity rows a head in d.kv: 16-bit values of magnitudes in [0.5, 2) (as bf16 bits;
// fp16 reads them as other finite values), or for fp8 and i16 random bytes and every row's scale 2^-10.
void* alloc_cache(const AttnDims& d, uint64_t seed) {
  const size_t elems = size_t(d.Hkv) * size_t(d.capacity) * size_t(d.dh);
  void* p = bench_alloc_random_bytes(size_t(cuda::attn_cache_bytes(d.kv, d.Hkv, d.capacity, d.dh)), seed);
  if (kv_row_scaled(d.kv)) {
    float* scales = reinterpret_cast<float*>(static_cast<uint8_t*>(p) +
                                             cuda::attn_row_scales_offset(d.kv, d.Hkv, d.capacity, d.dh));
    fill_scales_kernel<<<1024, 256>>>(scales, size_t(d.Hkv) * size_t(d.capacity));
  } else {
    tame_bf16_kernel<<<1024, 256>>>(static_cast<uint16_t*>(p), elems);
  }
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
  std::vector<void*> k, v;
  float *q = nullptr, *qg = nullptr, *kin = nullptr, *vin = nullptr, *norm = nullptr, *part = nullptr, *out = nullptr;
  int* pos = nullptr;
  bool ready = false;

  void setup() {
    if (ready) return;
    copies = bench_copies_for(double(cuda::attn_cache_bytes(d.kv, d.Hkv, d.capacity, d.dh)) * 2);
    for (int c = 0; c < copies; ++c) {
      k.push_back(alloc_cache(d, 100 + 2 * c));
      v.push_back(alloc_cache(d, 101 + 2 * c));
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

std::shared_ptr<AttnState> make_state(int64_t T, int64_t pos0, int64_t capacity, KvDtype kv) {
  auto s = std::make_shared<AttnState>();
  s->d.T = T;
  s->d.capacity = capacity;
  s->d.kv = kv;
  s->pos0 = pos0;
  return s;
}

// The case's name says the cache's type: "kv f16" and so on (bf16, the workbench's first cache, says nothing).
void add_attention_case(CaseList& cases, const std::string& group, const std::string& name, int64_t T, int64_t pos0,
                        int64_t capacity, KvDtype kv = KvDtype::bf16) {
  auto s = make_state(T, pos0, capacity, kv);
  const AttnDims& d = s->d;
  const double keys_read = double(pos0 + T);  // every key up to the last token's position is read
  const double visible = double(T) * double(pos0) + double(T) * double(T + 1) / 2.0;
  Case c;
  c.group = group;
  c.name = kv == KvDtype::bf16 ? name : name + " kv " + std::string(kv_dtype_name(kv));
  // K, V (their row bytes, scales included); q, gate, out
  c.bytes = 2.0 * keys_read * double(kv_row_bytes(kv, d.dh)) * d.Hkv + double(T) * d.Hq * d.dh * 4 * 3;
  c.flops = 4.0 * d.Hq * d.dh * visible;
  c.setup = [s] { s->setup(); };
  c.run = [s](cudaStream_t stream, int rep) {
    const int i = rep % s->copies;
    cuda::attention(s->q, s->qg, s->k[size_t(i)], s->v[size_t(i)], s->pos, s->d, s->part, s->out, stream);
  };
  cases.push_back(std::move(c));
}

void add_prepare_case(CaseList& cases, const std::string& group, int64_t T) {
  auto s = make_state(T, 4096, 4096 + T, KvDtype::bf16);
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

// Device memory holding a copy of host values (a batched call's tables).
template <typename T>
T* upload_table(const std::vector<T>& host) {
  auto* p = static_cast<T*>(bench_alloc_random_bytes(host.size() * sizeof(T), 3));
  TERN_CUDA(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

// Buffers of one attention_batched call: B sequences of one token after pos0 cached positions, each with its own
// caches of d.capacity rows, in `copies` sets (so that timed runs read device memory, not L2), each set with its
// AttnBatch tables.
struct BatchedAttnState {
  AttnDims d;
  int B = 8;
  int64_t pos0 = 0;
  int copies = 1;
  std::vector<cuda::AttnBatch> batch;  // [copies]
  float *q = nullptr, *qg = nullptr, *part = nullptr, *out = nullptr;
  bool ready = false;

  void setup() {
    if (ready) return;
    const size_t cache_elems = size_t(d.Hkv) * size_t(d.capacity) * size_t(d.dh);
    copies = bench_copies_for(double(cache_elems) * 2 * 2 * B);
    const int splits = cuda::attn_batch_splits(d);
    for (int c = 0; c < copies; ++c) {
      std::vector<const int*> pos_of;
      std::vector<void*> k_of, v_of;
      for (int b = 0; b < B; ++b) {
        pos_of.push_back(alloc_position(int(pos0)));
        k_of.push_back(alloc_cache(d, 200 + 2 * uint64_t(c * B + b)));
        v_of.push_back(alloc_cache(d, 201 + 2 * uint64_t(c * B + b)));
      }
      cuda::AttnBatch t;
      t.B = B;
      t.ld_qkv = int64_t(d.Hq) * 2 * d.dh;
      t.pos0 = upload_table(pos_of);
      t.cache_k = upload_table(k_of);
      t.cache_v = upload_table(v_of);
      t.capacity = upload_table(std::vector<int64_t>(size_t(B), d.capacity));
      t.splits = upload_table(std::vector<int>(size_t(B), splits));
      batch.push_back(t);
    }
    q = bench_alloc_random_floats(size_t(B) * d.Hq * d.dh, -2.0f, 2.0f, 7);
    qg = bench_alloc_random_floats(size_t(B) * d.Hq * 2 * d.dh, -2.0f, 2.0f, 8);
    part = bench_alloc_random_floats(size_t(cuda::attn_batch_partial_floats(B, d.Hq, d.dh)), 0.0f, 1.0f, 12);
    out = bench_alloc_random_floats(size_t(B) * d.Hq * d.dh, 0.0f, 1.0f, 13);
    TERN_CUDA(cudaDeviceSynchronize());
    ready = true;
  }
};

// attention_batched over B sequences at context L (pos0 = L − 1, capacity L + 64), with the items-per-block form set
// to `items` (0: the default kernel; cuda::kAttnBatchItemsAuto; N items a block) for the run.
void add_batched_case(CaseList& cases, int B, int64_t L, int items) {
  auto s = std::make_shared<BatchedAttnState>();
  s->d.T = 1;
  s->d.capacity = L + 64;
  s->B = B;
  s->pos0 = L - 1;
  const AttnDims& d = s->d;
  Case c;
  c.group = "decode";
  c.name = "attention_batched B=" + std::to_string(B) + " context " + std::to_string(L / 1024) + "K" +
           (items == 0 ? "" : items == cuda::kAttnBatchItemsAuto ? " items auto" : " items " + std::to_string(items));
  c.bytes = double(B) * (2.0 * d.Hkv * double(L) * d.dh * 2 + double(d.Hq) * d.dh * 4 * 3);  // K, V; q, gate, out
  c.setup = [s] { s->setup(); };
  c.run = [s, items](cudaStream_t stream, int rep) {
    const int saved = cuda::attn_batch_items();
    cuda::attn_batch_set_items(items);
    cuda::attention_batched(s->q, s->qg, s->batch[size_t(rep % s->copies)], s->d, s->part, s->out, stream);
    cuda::attn_batch_set_items(saved);
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
  // The product's caches (fp16 by default; fp8 and i16 opt-in): the prefill and decode at 4K, the decode at 32K.
  for (const KvDtype kv : {KvDtype::f16, KvDtype::fp8, KvDtype::i16}) {
    add_attention_case(cases, "prefill", "attention causal T=4096 pos0=0", 4096, 0, 4096, kv);
    add_attention_case(cases, "decode", "attention split-KV T=1 context 4K", 1, 4095, 4096 + 64, kv);
    add_attention_case(cases, "decode", "attention split-KV T=1 context 32K", 1, 32767, 32768 + 64, kv);
    add_attention_case(cases, "decode", "attention split-KV T=4 context 4K", 4, 4092, 4096 + 64, kv);
  }
  add_prepare_case(cases, "decode", 1);
  for (const int B : {4, 8, 16, 32})
    for (const int items : {0, cuda::kAttnBatchItemsAuto}) add_batched_case(cases, B, 4096, items);
}

}  // namespace tern::bench
