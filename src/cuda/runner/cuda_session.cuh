// The CUDA runner's sessions (model/runner.h's Session): every attention layer's KV cache and every Gated DeltaNet
// layer's conv and recurrent state in one device arena, the position on the device too; snapshots of the Gated
// DeltaNet states for prefix reuse, in device buffers the runner keeps for reuse (SnapshotBuffers).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda/common/cuda_common.cuh"
#include "cuda/weights/device_weights.cuh"
#include "model/runner.h"

namespace tern::cuda {

// Device buffers of one runner's snapshot size, kept for reuse instead of a cudaMalloc of the model's 66 MB of states
// per snapshot and a cudaFree (which synchronises the device) per dropped one, inside the time to first token of
// every request (the prefix cache takes a snapshot at the end of each prompt; H200, a 523-token prompt through the
// server: 88.5 → 86.8 ms). Also the stream that snapshots and restores copy on (every layer's copy queued, one
// wait). Shared by the runner and its snapshots (a snapshot may outlive the runner).
class SnapshotBuffers {
 public:
  explicit SnapshotBuffers(size_t bytes) : bytes_(bytes) {
    TERN_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~SnapshotBuffers() {
    for (void* p : free_) cudaFree(p);
    cudaStreamDestroy(stream_);
  }
  cudaStream_t stream() const { return stream_; }
  SnapshotBuffers(const SnapshotBuffers&) = delete;
  SnapshotBuffers& operator=(const SnapshotBuffers&) = delete;
  size_t bytes() const { return bytes_; }
  uint8_t* take() {
    {
      std::lock_guard lock(mu_);
      if (!free_.empty()) {
        void* p = free_.back();
        free_.pop_back();
        return static_cast<uint8_t*>(p);
      }
    }
    void* p = nullptr;
    TERN_CUDA(cudaMalloc(&p, bytes_));
    return static_cast<uint8_t*>(p);
  }
  void give(uint8_t* p) {
    if (!p) return;
    std::lock_guard lock(mu_);
    if (free_.size() < kKeep) {
      free_.push_back(p);
      return;
    }
    cudaFree(p);
  }

 private:
  static constexpr size_t kKeep = 4;  // free buffers held at most (the rest are freed)
  size_t bytes_;
  cudaStream_t stream_ = nullptr;
  std::mutex mu_;
  std::vector<void*> free_;
};

// Bytes of a session's Gated DeltaNet states (every linear-attention layer's conv and recurrent state): a snapshot.
size_t gdn_state_bytes_of(const DeviceWeights& w);

class CudaSession final : public Session {
 public:
  // The device memory a session of `capacity` tokens takes (its one allocation).
  static size_t bytes_for(const DeviceWeights& w, int64_t capacity);
  CudaSession(const DeviceWeights& w, int64_t capacity, const void* owner, uint64_t id,
              std::shared_ptr<SnapshotBuffers> snapshot_buffers);
  int64_t position() const override { return pos; }
  int64_t capacity() const override { return capacity_; }
  void reset() override;

  // Prefix reuse (runner.h). The runner's stream is non-blocking: synchronize the device before and after the
  // copies (plain cudaMemcpy on the legacy stream), so that no kernel of the runner races them. Buffers never
  // move, so the decode graph bound to this session stays valid.
  bool can_snapshot() const override { return true; }
  size_t gdn_state_bytes() const;
  std::unique_ptr<StateSnapshot> snapshot() const override;
  void restore(const StateSnapshot& snapshot) override;
  void copy_kv_prefix(const Session& from, int64_t n) override;

  // Verification of drafts (CudaRunner::forward_verify, verify_plan.cu): the Gated DeltaNet states before each of
  // the verify's tokens, per layer conv [max_tokens, Ck-1, C] and rec [max_tokens, Hv, dv, dk] (null for attention
  // layers), in one arena allocated at the session's first verify.
  struct KeptStates {
    float* conv = nullptr;
    float* rec = nullptr;
  };
  // The kept states' buffers for verifies of up to max_tokens tokens (allocated once; ~66 MB per token at the
  // model's widths).
  const std::vector<KeptStates>& kept_buffers(int max_tokens);
  // After a verify of `tokens` tokens from position `from` (the kernels filled kept_buffers).
  void kept_states_from(int64_t from, int64_t tokens) {
    kept_from_ = from;
    kept_tokens_ = tokens;
  }
  void drop_kept_states() { kept_from_ = -1; }
  void rollback(int64_t position) override;

  struct LayerCache {
    uint16_t* k = nullptr;  // [Hkv, capacity, dh] fp16 (bf16 with TERN_KV_BF16=1)
    uint16_t* v = nullptr;
    float* conv = nullptr;  // [Ck-1, C]
    float* rec = nullptr;   // [Hv, dv, dk]
    size_t conv_bytes = 0, rec_bytes = 0;
  };
  const void* owner;
  uint64_t id;           // unique per runner: the decode graph is bound to one session's buffers
  int64_t pos = 0;
  int* d_pos = nullptr;  // tokens in the cache, on the device
  std::vector<LayerCache> layers;
  DeviceArena arena;
  int kv_heads = 0, head_dim = 0;  // the KV caches' shape (copy_kv_prefix)

 private:
  int64_t capacity_;
  std::shared_ptr<SnapshotBuffers> snapshot_buffers_;
  DeviceArena kept_arena_;
  std::vector<KeptStates> kept_;
  int kept_max_tokens_ = 0;
  int64_t kept_from_ = -1;  // the last verify's first position (-1: no states kept)
  int64_t kept_tokens_ = 0;
};

}  // namespace tern::cuda
