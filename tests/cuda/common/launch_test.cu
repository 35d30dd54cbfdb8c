// The launch helpers (src/cuda/common/launch.cuh): a kernel launched through launch_pdl or launch_cluster_pdl runs,
// and, where max_shared_carveout_wanted() (PDL on, TERN_SMEM_CARVEOUT not `driver`), carries the largest
// shared-memory carveout preference afterwards, so that the kernels of a chain take one L1/shared split.
#include <cuda_runtime.h>

#include "../cuda_test_util.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/launch.cuh"

namespace tern::cuda::test {
namespace {

__global__ void write_block_count_kernel(int* out) {
  pdl_wait();
  if (threadIdx.x == 0) atomicAdd(out, 1);
}

__global__ void write_cluster_block_count_kernel(int* out) {
  pdl_wait();
  if (threadIdx.x == 0) atomicAdd(out, 1);
}

int carveout_of(const void* kernel) {
  cudaFuncAttributes a{};
  TERN_CUDA(cudaFuncGetAttributes(&a, kernel));
  return a.preferredShmemCarveout;
}

TEST(CudaLaunch, PdlLaunchesRunAndAskTheLargestCarveoutWhereWanted) {
  TERN_REQUIRE_GPU();
  DeviceBuf<int> count(std::vector<int>{0});
  launch_pdl("write_block_count_kernel", write_block_count_kernel, dim3(5), dim3(64), 0, nullptr, count.p);
  TERN_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(count.host()[0], 5);
  const int want = max_shared_carveout_wanted() ? int(cudaSharedmemCarveoutMaxShared) : -1;
  if (max_shared_carveout_wanted()) {
    EXPECT_EQ(carveout_of(reinterpret_cast<const void*>(write_block_count_kernel)), want);
  }
  if (sm90_features()) {  // clusters: sm_90 code only
    launch_cluster_pdl("write_cluster_block_count_kernel", write_cluster_block_count_kernel, dim3(8), dim3(64), 2, 0,
                       nullptr, count.p);
    TERN_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(count.host()[0], 13);
    if (max_shared_carveout_wanted()) {
      EXPECT_EQ(carveout_of(reinterpret_cast<const void*>(write_cluster_block_count_kernel)), want);
    }
  }
}

}  // namespace
}  // namespace tern::cuda::test
