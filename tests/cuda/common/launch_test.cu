// The launch helpers (src/cuda/common/launch.cuh): a kernel launched through launch_pdl or launch_cluster_pdl runs,
// and a captured launch keeps its attributes in the graph's kernel node: the largest shared-memory carveout where
// max_shared_carveout_wanted() (PDL on and TERN_SMEM_CARVEOUT=max), so that the kernels of a chain take one
// L1/shared split, and none otherwise.
#include <cuda_runtime.h>

#include <vector>

#include "../cuda_test_util.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/launch.cuh"

namespace tern::cuda::test {
namespace {

__global__ void count_blocks_kernel(int* out) {
  pdl_wait();
  if (threadIdx.x == 0) atomicAdd(out, 1);
}

// The carveout in the one kernel node of a graph captured from `launch` (on a stream of its own); -1 where the node
// has none of its own.
template <typename F>
int captured_carveout(F launch) {
  cudaStream_t s = nullptr;
  TERN_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g = nullptr;
  TERN_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  launch(s);
  TERN_CUDA(cudaStreamEndCapture(s, &g));
  size_t n = 0;
  TERN_CUDA(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  TERN_CUDA(cudaGraphGetNodes(g, nodes.data(), &n));
  int carveout = -2;  // no kernel node
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    TERN_CUDA(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeKernel) continue;
    cudaLaunchAttributeValue v{};
    TERN_CUDA(cudaGraphKernelNodeGetAttribute(node, cudaLaunchAttributePreferredSharedMemoryCarveout, &v));
    carveout = int(v.sharedMemCarveout);
  }
  TERN_CUDA(cudaGraphDestroy(g));
  TERN_CUDA(cudaStreamDestroy(s));
  return carveout;
}

TEST(CudaLaunch, PdlLaunchesRunAndCarryTheLargestCarveoutWhereWanted) {
  TERN_REQUIRE_GPU();
  DeviceBuf<int> count(std::vector<int>{0});
  launch_pdl("count_blocks_kernel", count_blocks_kernel, dim3(5), dim3(64), 0, nullptr, count.p);
  TERN_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(count.host()[0], 5);
  const int carveout = captured_carveout([&](cudaStream_t s) {
    launch_pdl("count_blocks_kernel", count_blocks_kernel, dim3(5), dim3(64), 0, s, count.p);
  });
  if (max_shared_carveout_wanted()) {
    EXPECT_EQ(carveout, int(cudaSharedmemCarveoutMaxShared));
  } else {
    EXPECT_NE(carveout, int(cudaSharedmemCarveoutMaxShared));
  }
  if (sm90_features()) {  // clusters: sm_90 code only
    launch_cluster_pdl("count_blocks_kernel (cluster)", count_blocks_kernel, dim3(8), dim3(64), 2, 0, nullptr,
                       count.p);
    TERN_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(count.host()[0], 13);
    const int cluster_carveout = captured_carveout([&](cudaStream_t s) {
      launch_cluster_pdl("count_blocks_kernel (cluster)", count_blocks_kernel, dim3(8), dim3(64), 2, 0, s, count.p);
    });
    if (max_shared_carveout_wanted()) {
      EXPECT_EQ(cluster_carveout, int(cudaSharedmemCarveoutMaxShared));
    } else {
      EXPECT_NE(cluster_carveout, int(cudaSharedmemCarveoutMaxShared));
    }
  }
}

}  // namespace
}  // namespace tern::cuda::test
