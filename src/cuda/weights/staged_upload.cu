#include "cuda/weights/staged_upload.cuh"

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/progress.h"
#include "core/thread_pool.h"
#include "cuda/common/cuda_common.cuh"

namespace tern::cuda {
namespace {

constexpr int64_t kFillGrain = int64_t(2) << 20;  // bytes of a buffer one thread fills at a time
constexpr size_t kPrefetchAhead = 2;               // chunks whose sources are asked for before they are read

int fill_threads(int asked) {
  if (asked > 0) return asked;
  return int(std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
}

// The pinned buffers, the events that say when each may be refilled, and the copy streams. The destructor waits
// for the copies in flight before it frees the buffers they read.
class PinnedStaging {
 public:
  PinnedStaging(size_t buffer_bytes, int buffers, int streams) {
    TERN_CHECK(buffer_bytes > 0 && buffers >= 1 && streams >= 1, "staged upload: ", buffers, " staging buffers of ",
               buffer_bytes, " bytes on ", streams, " streams");
    try {
      for (int i = 0; i < buffers; ++i) {
        void* p = nullptr;
        TERN_CUDA(cudaHostAlloc(&p, buffer_bytes, cudaHostAllocDefault));
        buffers_.push_back(static_cast<uint8_t*>(p));
        cudaEvent_t e{};
        TERN_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        refillable_.push_back(e);
      }
      for (int i = 0; i < streams; ++i) {
        cudaStream_t s{};
        TERN_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        streams_.push_back(s);
      }
    } catch (...) {
      release();
      throw;
    }
  }
  ~PinnedStaging() { release(); }
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;

  size_t buffers() const { return buffers_.size(); }
  uint8_t* buffer(size_t i) const { return buffers_[i]; }
  cudaEvent_t refillable(size_t i) const { return refillable_[i]; }
  cudaStream_t stream(size_t k) const { return streams_[k % streams_.size()]; }
  void wait() const {
    for (cudaStream_t s : streams_) TERN_CUDA(cudaStreamSynchronize(s));
  }

 private:
  void release() {
    for (cudaStream_t s : streams_) cudaStreamSynchronize(s);  // errors were reported by wait() or are moot
    for (cudaStream_t s : streams_) cudaStreamDestroy(s);
    for (cudaEvent_t e : refillable_) cudaEventDestroy(e);
    for (uint8_t* p : buffers_) cudaFreeHost(p);
    streams_.clear();
    refillable_.clear();
    buffers_.clear();
  }

  std::vector<uint8_t*> buffers_;
  std::vector<cudaEvent_t> refillable_;
  std::vector<cudaStream_t> streams_;
};

}  // namespace

StagedUploadResult staged_upload(std::vector<HostCopy> copies, const char* label, bool progress,
                                 const StagingOptions& options) {
  host_copies_sort_by_source(copies);  // each file front to back
  const std::vector<StagingChunk> chunks = staging_plan(host_copies_merge(copies), options.buffer_bytes);
  StagedUploadResult result;
  for (const StagingChunk& c : chunks) result.bytes += int64_t(c.payload);
  if (chunks.empty()) return result;

  const int buffers = int(std::min<size_t>(size_t(std::max(options.buffers, 1)), chunks.size()));
  PinnedStaging staging(options.buffer_bytes, buffers, options.streams);
  ThreadPool fillers(fill_threads(options.threads));
  Progress bar(label, result.bytes, progress);  // its clock starts with the copy, after the buffers exist
  const auto start = std::chrono::steady_clock::now();
  for (size_t k = 0; k < std::min(kPrefetchAhead, chunks.size()); ++k) staging_prefetch(chunks[k]);
  for (size_t k = 0; k < chunks.size(); ++k) {
    if (k + kPrefetchAhead < chunks.size()) staging_prefetch(chunks[k + kPrefetchAhead]);
    const StagingChunk& chunk = chunks[k];
    const size_t slot = k % staging.buffers();
    uint8_t* buffer = staging.buffer(slot);
    TERN_CUDA(cudaEventSynchronize(staging.refillable(slot)));  // the copies out of it (chunk k - buffers) are done
    fillers.parallel_for(int64_t(chunk.extent), kFillGrain, [&](int64_t begin, int64_t end) {
      staging_fill(chunk, buffer, size_t(begin), size_t(end));
    });
    const cudaStream_t stream = staging.stream(k);
    for (const StagedPiece& p : chunk.pieces)
      TERN_CUDA(cudaMemcpyAsync(reinterpret_cast<void*>(p.dst), buffer + p.offset, p.bytes, cudaMemcpyHostToDevice,
                                stream));
    TERN_CUDA(cudaEventRecord(staging.refillable(slot), stream));
    bar.add(int64_t(chunk.payload));
  }
  staging.wait();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  bar.finish();
  return result;
}

}  // namespace tern::cuda
