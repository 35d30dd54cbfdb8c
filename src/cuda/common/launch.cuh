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

// kernel<<<grid, block, smem, stream>>>(args...) with the programmatic-serialization attribute when pdl_enabled().
// Throws tern::Error (naming `what`) when the launch is refused.
template <typename... KArgs, typename... Args>
void launch_pdl(const char* what, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
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
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster_x;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 2 : 1;
  check_cuda(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), what, __FILE__, __LINE__);
}

}  // namespace tern::cuda
