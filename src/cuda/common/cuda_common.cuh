// CUDA plumbing shared by every kernel family: error checks that throw tern::Error, a device arena that
// allocates once and hands out aligned slices, and small launch helpers. Host-only header (no device code).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/check.h"

namespace tern::cuda {

// Throws tern::InternalError (a fault of the device, not of the input: the server answers 500) naming the call and
// CUDA's message when `e` is not cudaSuccess.
void check_cuda(cudaError_t e, const char* what, const char* file, int line);
#define TERN_CUDA(call) ::tern::cuda::check_cuda((call), #call, __FILE__, __LINE__)
// After a kernel launch: reports launch-configuration errors at once (asynchronous faults surface later).
#define TERN_CUDA_LAUNCHED(name) ::tern::cuda::check_cuda(cudaGetLastError(), name, __FILE__, __LINE__)

// Whether the environment variable `name` is set to exactly `value` (the comparison switches: TERN_PDL=0, ...).
bool env_is(const char* name, const char* value);
// The count a switch's value spells (decimal, lo to hi); anything else throws tern::Error naming the switch, the value
// and what it takes (the count switches: TERN_ATTN_SPLIT_TILES=2, TERN_BATCH_DOWN_PREFETCH_TOKENS=4, ...).
int env_count(const char* name, const char* value, long lo, long hi, const char* takes);

// TERN_GPU_PATH=portable: run exactly the kernels a GPU without Hopper's features would (Ampere and Ada: sm_80,
// sm_86, sm_89): no warpgroup MMA (wgmma), no thread-block clusters, no programmatic dependent launch, no bulk L2
// prefetch, and at most kPortableSmemBytes of shared memory per block (sm_86/89/120's opt-in limit; A100 has more).
// So the portable path is proven on an H200. Read once; any other value (or none) is the device's own path.
bool gpu_path_portable();
constexpr int kPortableSmemBytes = 101376;  // 99 KiB
// The device's opt-in shared memory per block (cudaDevAttrMaxSharedMemoryPerBlockOptin), capped at
// kPortableSmemBytes under the portable path; 0 when unknown. Read once (call it outside any graph capture first).
int smem_optin_bytes();

// The feature level the device code running on this GPU was compiled for (cudaFuncAttributes::ptxVersion of a probe
// kernel: 90 for the sm_90a binary, 80 when a newer GPU JIT-compiles the sm_80 PTX; 0 when unknown). Features
// compiled under `__CUDA_ARCH__ >= 900` (PDL's griddepcontrol, clusters, bulk prefetch) exist only when this is
// >= 90, whatever the GPU's own compute capability. Read once, outside any capture.
int device_code_level();
// Whether the kernels may use sm_90 features (clusters, PDL): device_code_level() >= 90 and not the portable path.
bool sm90_features();

// Number of CUDA devices (0 when there is no driver or no GPU; never throws).
int device_count();
// "NVIDIA H200, sm_90, 139 GiB" for device 0.
std::string device_description();

// One cudaMalloc, carved into 256-byte-aligned slices. Nothing is freed until the arena dies.
class DeviceArena {
 public:
  DeviceArena() = default;
  explicit DeviceArena(size_t bytes, const char* what);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  DeviceArena(DeviceArena&& o) noexcept { *this = std::move(o); }
  DeviceArena& operator=(DeviceArena&& o) noexcept;

  void* take(size_t bytes);  // throws tern::Error when the arena is exhausted
  template <typename T>
  T* take_n(size_t n) { return static_cast<T*>(take(n * sizeof(T))); }
  size_t used() const { return used_; }
  size_t capacity() const { return capacity_; }

  static size_t align(size_t b) { return (b + 255) & ~size_t(255); }

 private:
  uint8_t* base_ = nullptr;
  size_t capacity_ = 0, used_ = 0;
  std::string what_;
};

// Page-locked host memory (cudaMallocHost) for copies that must run at the link's speed and asynchronously (a copy
// from pageable memory goes through the driver's bounce buffers, at a fraction of it). Grown on demand (the old
// contents are not kept), never shrunk; freed with the object.
class PinnedHostBuffer {
 public:
  PinnedHostBuffer() = default;
  ~PinnedHostBuffer();
  PinnedHostBuffer(const PinnedHostBuffer&) = delete;
  PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;

  // At least `bytes` of pinned memory; the pointer is valid until the next ensure() that grows it.
  void* ensure(size_t bytes, const char* what);
  size_t capacity() const { return capacity_; }

 private:
  void* p_ = nullptr;
  size_t capacity_ = 0;
};

inline unsigned blocks_for(int64_t n, int per_block) { return unsigned((n + per_block - 1) / per_block); }
// Whether p is 16-byte aligned (float4 and uint4 access, cp.async of 16 bytes).
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace tern::cuda
