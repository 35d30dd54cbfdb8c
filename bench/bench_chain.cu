// Workbench cases for one link of the decode step's kernel chain: what a kernel that depends on the one before it
// costs when it does (almost) nothing, as a floor under the decode kernels' in-place costs (docs/benchmarks.md,
// tenth session: 4–6 µs per kernel whatever its bytes). Each run is one launch; the graph of 20 runs is a chain in
// which run r reads what run r − 1 wrote (ping-pong buffers), launched with PDL (launch.cuh) or without.
#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "bench/workbench.h"
#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/warp_reduce.cuh"
#include "cuda/kernels/qmv/qmv_tile.cuh"

namespace tern::bench {
namespace {

constexpr int kVec = 2048;  // the hidden state: floats each link reads and writes

// Waits for the kernel before it and lets the next one launch; nothing else.
__global__ void chain_empty_kernel() {
  cuda::pdl_wait();
  cuda::pdl_trigger();
}

// One link: every block reads the whole vector the link before wrote and reduces it (an RMSNorm's sum of squares),
// then writes its slice of the next vector: one L2 round trip in, a block reduction, one write out. part: [8] shared.
__device__ __forceinline__ void vector_link(const float* in, float* out, float* part) {
  float ss = 0.0f;
  for (int i = int(threadIdx.x); i < kVec; i += int(blockDim.x)) ss = fmaf(in[i], in[i], ss);
  ss = cuda::warp_sum(ss);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  float t = 0.0f;
  for (int w = 0; w < int(blockDim.x) / 32; ++w) t += part[w];
  const float scale = rsqrtf(t / float(kVec) + 1e-6f);
  for (int i = int(blockIdx.x * blockDim.x + threadIdx.x); i < kVec; i += int(gridDim.x * blockDim.x))
    out[i] = fmaf(in[i], 0.5f * scale, 0.5f);
}

__global__ void __launch_bounds__(256) chain_vector_kernel(const float* in, float* out) {
  __shared__ float part[8];
  cuda::pdl_wait();
  cuda::pdl_trigger();
  vector_link(in, out, part);
}

// A barrier over the whole grid inside one kernel (every block resident): the last block to arrive resets the count
// and advances the generation the others wait on, so the pair needs no reset between launches.
__device__ __forceinline__ void grid_barrier(unsigned* count, unsigned* generation) {
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned gen;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(gen) : "l"(generation) : "memory");
    __threadfence();
    if (atomicAdd(count, 1u) == gridDim.x - 1) {
      atomicExch(count, 0u);
      asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(generation), "r"(gen + 1) : "memory");
    } else {
      unsigned now = gen;
      while (now == gen) asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(generation) : "memory");
    }
  }
  __syncthreads();
}

constexpr int kPersistentLinks = 20;  // links per launch of the persistent case

// The chain_vector_kernel's link kPersistentLinks times in one kernel, a grid barrier in place of each kernel
// boundary (ping-pong between buf[0] and buf[1]).
__global__ void __launch_bounds__(256) chain_persistent_kernel(float* buf, unsigned* sync) {
  __shared__ float part[8];
  cuda::pdl_wait();
  for (int link = 0; link < kPersistentLinks; ++link) {
    vector_link(buf + (link % 2) * kVec, buf + ((link + 1) % 2) * kVec, part);
    grid_barrier(sync, sync + 1);  // its first __syncthreads also keeps `part` until every warp has read it
  }
  cuda::pdl_trigger();
}

void add_persistent_case(CaseList& cases, int blocks_per_sm) {
  auto buf = std::make_shared<float*>(nullptr);  // [2][kVec]
  auto sync = std::make_shared<unsigned*>(nullptr);
  Case c;
  c.group = "decode";
  c.name = "chain link: read 8 KB, reduce, write, then a grid barrier; " + std::to_string(kPersistentLinks) +
           " links in one kernel (µs per link), " + std::to_string(blocks_per_sm) + " block(s)/SM";
  c.bytes = 2.0 * kVec * 4;
  c.units = kPersistentLinks;
  c.setup = [buf, sync] {
    if (!*buf) *buf = bench_alloc_random_floats(2 * kVec, 0.5f, 1.5f, 0xc4a2);
    if (!*sync) {
      TERN_CUDA(cudaMalloc(sync.get(), 2 * sizeof(unsigned)));
      TERN_CUDA(cudaMemset(*sync, 0, 2 * sizeof(unsigned)));
    }
    TERN_CUDA(cudaDeviceSynchronize());
  };
  c.run = [buf, sync, blocks_per_sm](cudaStream_t stream, int) {
    const dim3 grid(unsigned(cuda::qtile::sm_count() * blocks_per_sm)), block(256);
    cuda::launch_pdl("chain_persistent", chain_persistent_kernel, grid, block, 0, stream, *buf, *sync);
  };
  cases.push_back(std::move(c));
}

// blocks_per_sm: grid = SMs × blocks_per_sm (0: one block); vector: chain_vector_kernel, else chain_empty_kernel.
void add_chain_case(CaseList& cases, int blocks_per_sm, bool vector, bool pdl) {
  auto buf = std::make_shared<float*>(nullptr);  // [2][kVec]
  Case c;
  c.group = "decode";
  c.name = std::string("chain link: ") + (vector ? "read 8 KB written by the kernel before, reduce, write" : "empty kernel") +
           ", " + (blocks_per_sm ? std::to_string(blocks_per_sm) + " block(s)/SM" : std::string("1 block")) +
           (pdl ? ", PDL" : ", no PDL");
  c.bytes = vector ? 2.0 * kVec * 4 : 0.0;
  c.setup = [buf] {
    if (!*buf) *buf = bench_alloc_random_floats(2 * kVec, 0.5f, 1.5f, 0xc4a1);
    TERN_CUDA(cudaDeviceSynchronize());  // the fill ran on the default stream; the runs use another
  };
  c.run = [buf, blocks_per_sm, vector, pdl](cudaStream_t stream, int rep) {
    const dim3 grid(unsigned(blocks_per_sm ? cuda::qtile::sm_count() * blocks_per_sm : 1)), block(256);
    float* in = *buf + (rep % 2) * kVec;
    float* out = *buf + ((rep + 1) % 2) * kVec;
    if (pdl) {
      if (vector)
        cuda::launch_pdl("chain_vector", chain_vector_kernel, grid, block, 0, stream, in, out);
      else
        cuda::launch_pdl("chain_empty", chain_empty_kernel, grid, block, 0, stream);
    } else if (vector) {
      chain_vector_kernel<<<grid, block, 0, stream>>>(in, out);
    } else {
      chain_empty_kernel<<<grid, block, 0, stream>>>();
    }
  };
  cases.push_back(std::move(c));
}

}  // namespace

TERN_BENCH_CASES(chain) {
  for (bool pdl : {true, false}) {
    add_chain_case(cases, 0, false, pdl);
    add_chain_case(cases, 2, false, pdl);
    add_chain_case(cases, 2, true, pdl);
  }
  add_chain_case(cases, 1, true, true);
  add_persistent_case(cases, 1);
  add_persistent_case(cases, 2);
}

}  // namespace tern::bench
