#include "cuda/common/cuda_common.cuh"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "cuda/common/launch.cuh"

namespace tern::cuda {

// A failed CUDA call is a fault of the device or of our kernels, never of a request: InternalError.
void check_cuda(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return;
  internal_fail_at(file, line, detail::concat("CUDA error in ", what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error of a missing driver
    return 0;
  }
  return n;
}

std::string device_description() {
  cudaDeviceProp p{};
  TERN_CUDA(cudaGetDeviceProperties(&p, 0));
  return detail::concat(p.name, ", sm_", p.major, p.minor, ", ", (p.totalGlobalMem >> 30), " GiB, ", p.multiProcessorCount, " SMs");
}

DeviceArena::DeviceArena(size_t bytes, const char* what) : capacity_(align(bytes)), what_(what) {
  if (capacity_ == 0) return;
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, capacity_);
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    TERN_INTERNAL_FAIL("cannot allocate ", (capacity_ >> 20), " MiB of GPU memory for ", what_, " (", (free_b >> 20), " MiB free of ",
              (total_b >> 20), " MiB): ", cudaGetErrorString(e));
  }
  base_ = static_cast<uint8_t*>(p);
}

PinnedHostBuffer::~PinnedHostBuffer() {
  if (p_) cudaFreeHost(p_);
}

void* PinnedHostBuffer::ensure(size_t bytes, const char* what) {
  if (bytes <= capacity_) return p_;
  if (p_) TERN_CUDA(cudaFreeHost(p_));
  p_ = nullptr;
  capacity_ = 0;
  const cudaError_t e = cudaMallocHost(&p_, bytes);
  if (e != cudaSuccess) {
    p_ = nullptr;
    (void)cudaGetLastError();
    throw Error(detail::concat("cannot allocate ", (bytes >> 20), " MiB of pinned host memory for ", what, ": ",
                               cudaGetErrorString(e)));
  }
  capacity_ = bytes;
  return p_;
}

DeviceArena::~DeviceArena() {
  if (base_) cudaFree(base_);
}

DeviceArena& DeviceArena::operator=(DeviceArena&& o) noexcept {
  if (this != &o) {
    if (base_) cudaFree(base_);
    base_ = std::exchange(o.base_, nullptr);
    capacity_ = std::exchange(o.capacity_, 0);
    used_ = std::exchange(o.used_, 0);
    what_ = std::move(o.what_);
  }
  return *this;
}

void* DeviceArena::take(size_t bytes) {
  const size_t b = align(bytes);
  TERN_INTERNAL_CHECK(used_ + b <= capacity_, "GPU arena for ", what_, " exhausted: need ", b, " more bytes, ", capacity_ - used_, " left");
  void* p = base_ + used_;
  used_ += b;
  return p;
}

bool env_is(const char* name, const char* value) {
  const char* e = std::getenv(name);
  return e && std::strcmp(e, value) == 0;
}

int env_count(const char* name, const char* value, long lo, long hi, const char* takes) {
  char* end = nullptr;
  const long n = std::strtol(value, &end, 10);
  TERN_CHECK(end != value && *end == '\0' && n >= lo && n <= hi, name, "=", value, ": ", takes, ", ", lo, " to ", hi);
  return int(n);
}

namespace {
__global__ void code_level_probe_kernel() {}
}  // namespace

int device_code_level() {
  static const int v = [] {
    cudaFuncAttributes fa{};
    if (cudaFuncGetAttributes(&fa, code_level_probe_kernel) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return fa.ptxVersion;
  }();
  return v;
}

bool sm90_features() { return device_code_level() >= 90 && !gpu_path_portable(); }

bool gpu_path_portable() {
  static const bool on = env_is("TERN_GPU_PATH", "portable");
  return on;
}

int smem_optin_bytes() {
  static const int v = [] {
    int dev = 0, x = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&x, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return gpu_path_portable() ? std::min(x, kPortableSmemBytes) : x;
  }();
  return v;
}

bool pdl_enabled() {
  static const bool on = [] {
    // On unless TERN_PDL=0. H200, 2026-12-01: with the one-token integer kernels (which trigger their dependents once
    // their inputs are read) the 4K decode step runs at 507 tok/s with PDL and 452 without (docs/benchmarks.md); with
    // the earlier tensor-core kernels (triggers at their start) PDL had measured slower, 334 against 367.
    // pdl_wait/pdl_trigger are griddepcontrol only in code compiled for sm_90+: a newer GPU running the sm_80 PTX
    // (or the portable path) must not launch a kernel before the one it reads from has finished.
    if (env_is("TERN_PDL", "0")) return false;
    return sm90_features();
  }();
  return on;
}

bool max_shared_carveout_wanted() {
  static const bool on = pdl_enabled() && env_is("TERN_SMEM_CARVEOUT", "max");
  return on;
}

}  // namespace tern::cuda
