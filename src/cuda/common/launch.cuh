// Kernel launch with Programmatic Dependent Launch (PDL, Hopper and later): a kernel launched through launch_pdl may
// start while the kernel before it in the stream is still running, so that its prologue (weight loads, address
// arithmetic) overlaps the previous kernel's tail; inside a CUDA graph the dependency becomes a programmatic edge.
//
// The contract for every kernel launched with launch_pdl:
//   - call pdl_wait() before the first read or write of memory that an earlier kernel of the stream writes or reads
//     (activations, caches, states, routing); weights and other launch-constant data may be read before it;
//   - optionally call pdl_trigger() once the kernel no longer needs to hold back the next one (e.g. at its start:
//     the next kernel's blocks then wait in their own pdl_wait()).
// pdl_wait() returns once every earlier kernel of the stream has completed and its memory is visible, so the
// dependency is transitive. On GPUs before sm_90 both are no-ops and launch_pdl is a plain launch.
// Included by .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "cuda/common/cuda_common.cuh"

namespace tern::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether launches ask for PDL: the device is sm_90 or newer and TERN_PDL is not 0 (on by default: the decode step
// measured 12% faster with it on the H200, see docs/benchmarks.md). Read once.
bool pdl_enabled();

// Whether launch_pdl and launch_cluster_pdl ask the largest shared-memory carveout for each launch (the launch
// attribute, which a captured graph keeps in its kernel nodes): where PDL is on and TERN_SMEM_CARVEOUT=max; by
// default each kernel keeps its own preference. The idea: an SM runs blocks of two kernels at once only when both
// take the same split of its L1 and shared memory (as we read the notes on the carveout attribute; not confirmed
// here), and the driver picks each kernel's split from its own needs (Nsight, H100, 8 streams: the router 16 KB,
// the GDN core 32 KB, gate_up 168 KB, down 200.7 KB), so PDL's early start may happen only on SMs the kernel before
// has left. One split for every kernel of the chain would let them overlap. Measured (H100, 2026-12-05,
// docs/benchmarks.md): -1.0% at 1 stream, +3.0% at 4, within 0.3% at 2, 8, 16 and 32, so it is opt-in until the
// reason for both is known. The arithmetic does not change, only when blocks start. Read once.
bool max_shared_carveout_wanted();

// Appends to attr[n..] what every launch of the decode chain asks: PDL where pdl_enabled(), the largest carveout
// where max_shared_carveout_wanted() (room for two). Returns the new count.
inline unsigned add_chain_attributes(cudaLaunchAttribute* attr, unsigned n) {
  if (pdl_enabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (max_shared_carveout_wanted()) {
    attr[n].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
    attr[n++].val.sharedMemCarveout = unsigned(cudaSharedmemCarveoutMaxShared);
  }
  return n;
}

// kernel<<<grid, block, smem, stream>>>(args...) with the programmatic-serialization attribute when pdl_enabled(), and
// the largest shared-memory carveout when max_shared_carveout_wanted().
// Throws tern::Error (naming `what`) when the launch is refused.
template <typename... KArgs, typename... Args>
void launch_pdl(const char* what, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  cfg.attrs = attr;
  cfg.numAttrs = add_chain_attributes(attr, 0);
  check_cuda(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), what, __FILE__, __LINE__);
}

// The same with thread-block clusters of cluster_x blocks along x (sm_90; the kernel must exist for sm_90).
template <typename... KArgs, typename... Args>
void launch_cluster_pdl(const char* what, void (*kernel)(KArgs...), dim3 grid, dim3 block, unsigned cluster_x,
                        size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[3];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster_x;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = add_chain_attributes(attr, 1);
  check_cuda(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), what, __FILE__, __LINE__);
}

}  // namespace tern::cuda
