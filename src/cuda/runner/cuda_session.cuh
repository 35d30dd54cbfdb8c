// The CUDA runner's sessions (model/runner.h's Session): every attention layer's KV cache and every Gated DeltaNet
// layer's conv and recurrent state in one device arena, the position on the device too; snapshots of the Gated
// DeltaNet states for prefix reuse, in device buffers the runner keeps for reuse (SnapshotBuffers); the states a
// verify step keeps for Session::rollback, in buffers of a pool the runner shares with its sessions
// (KeptStateBuffers).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "cuda/common/cuda_common.cuh"
#include "cuda/kernels/gdn/gdn.cuh"
#include "cuda/weights/device_weights.cuh"
#include "model/kv_dtype.h"
#include "model/runner.h"

namespace tern::cuda {

// Device buffers of one runner's snapshot size, kept for reuse instead of a cudaMalloc of the model's 66 MB of states
// per snapshot and a cudaFree (which synchronises the device) per dropped one, inside the time to first token of every
// request (the prefix cache takes a snapshot at the end of each prompt; H200, a 523-token prompt through the server:
// 88.5 → 86.8 ms). Also the stream that snapshots, restores and rollbacks copy on (every layer's copy queued, or a
// rollback's one launch, then one wait). Shared by the runner and its snapshots (a snapshot may outlive the runner).
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

// Device buffers for the states verify steps keep (CudaSession::kept_buffers: the Gated DeltaNet states before each of
// a verify's T tokens, ~63 MB and ~3.7 MB per token at the model's widths). A session takes one when a verify starts
// and gives it back when the kept states are dropped (its next forward, a rollback once it copied, reset, restore, its end), so the
// buffers in use at once are the sessions between a verify and their next step (at most the running sequences), not
// every session that ever verified (the prefix cache keeps many). A buffer serves any verify it is large enough for.
// Up to kKeep returned buffers are kept for reuse (a cudaMalloc, and a cudaFree that synchronises the device, per
// verify step would cost more than the step's copies); a take that none fits frees them first (they are all smaller)
// and allocates one of its size, so the pool never holds more than the most buffers in use at once, each of the
// largest verify's size: what the memory plan counts per running sequence (engine/memory_plan.h, verify_bytes).
// Shared by the runner and its sessions (a session may outlive the runner); thread-safe.
class KeptStateBuffers {
 public:
  struct Buffer {
    uint8_t* data = nullptr;
    size_t bytes = 0;
  };
  KeptStateBuffers() = default;
  ~KeptStateBuffers();
  KeptStateBuffers(const KeptStateBuffers&) = delete;
  KeptStateBuffers& operator=(const KeptStateBuffers&) = delete;
  // A buffer of at least `bytes`: the smallest spare that fits, else a new one of exactly `bytes`. Throws tern::Error
  // when the GPU has no room for it.
  Buffer take(size_t bytes);
  void give(Buffer b);  // no-op for an empty buffer
  size_t held_bytes() const;    // in use and spare: the device memory the pool holds now
  size_t in_use_bytes() const;  // taken and not given back

 private:
  static constexpr size_t kKeep = 4;  // spare buffers held at most (the rest are freed)
  mutable std::mutex mu_;
  std::vector<Buffer> spare_;
  size_t held_ = 0, in_use_ = 0;
};

// Bytes of the kept-state buffer a verify of `tokens` tokens needs on weights `w` (every Gated DeltaNet layer's conv
// [tokens, Ck-1, C] and rec [gdn_kept_rec_floats(d, tokens)], each 256-byte aligned).
size_t kept_state_bytes_of(const DeviceWeights& w, int tokens);
// The Gated DeltaNet shape of a config's linear-attention layers, over T tokens.
GdnDims gdn_dims_of(const Config& c, int64_t T = 0);

// Bytes of a session's Gated DeltaNet states (every linear-attention layer's conv and recurrent state): a snapshot.
size_t gdn_state_bytes_of(const DeviceWeights& w);

// A prompt chunk run part way (CudaRunner::forward_layers; Session::layers_pending): its residual rows between two of
// its pieces (the runner's hidden_ is every chunk's scratch; other sessions' steps run in between) and its session's
// Gated DeltaNet states from before it (Session::drop_pending_layers). One per runner, in memory set aside with the
// activation scratch, held by one session at a time; shared by the runner and its sessions.
struct PartWayChunk {
  float* hidden = nullptr;        // [max_chunk, D]
  uint8_t* gdn_before = nullptr;  // gdn_state_bytes_of(w), laid out as a snapshot
  uint64_t holder = 0;            // the session holding it (CudaSession::id; 0: none)
  std::vector<int32_t> tokens;    // the chunk's
  int done = 0;                   // its layers run
};

class CudaSession final : public Session {
 public:
  // The device memory a session of `capacity` tokens takes (its one allocation), its KV cache of type `kv`.
  static size_t bytes_for(const DeviceWeights& w, int64_t capacity, KvDtype kv);
  CudaSession(const DeviceWeights& w, int64_t capacity, KvDtype kv, const void* owner, uint64_t id,
              std::shared_ptr<SnapshotBuffers> snapshot_buffers, std::shared_ptr<KeptStateBuffers> kept_pool,
              std::shared_ptr<PartWayChunk> part_way);
  ~CudaSession() override {  // the kept-state buffer back to the runner's pool, the part-way chunk free
    drop_kept_states();
    release_part_way();
  }
  CudaSession(const CudaSession&) = delete;
  CudaSession& operator=(const CudaSession&) = delete;
  int64_t position() const override { return pos; }
  int64_t capacity() const override { return capacity_; }
  void reset() override;
  // M-RoPE (images): kept on the host and at d_rope_delta for the attention layers; snapshots keep it.
  int64_t rope_delta() const override { return rope_delta_; }
  // Sets it, the device copy on `stream` (ordered before the stream's next step).
  void set_rope_delta(int64_t delta, cudaStream_t stream);

  // Prefix reuse (runner.h). The runner's stream is non-blocking: synchronize the device before and after the
  // copies (plain cudaMemcpy on the legacy stream), so that no kernel of the runner races them. Buffers never
  // move, so the decode graph bound to this session stays valid.
  bool can_snapshot() const override { return true; }
  size_t gdn_state_bytes() const;
  std::unique_ptr<StateSnapshot> snapshot() const override;
  void restore(const StateSnapshot& snapshot) override;
  void copy_kv_prefix(const Session& from, int64_t n) override;
  // Every Gated DeltaNet layer's states to / from `p` (device or pinned memory), laid out as a snapshot, on `stream`.
  void copy_states_out(uint8_t* p, cudaStream_t stream) const;
  void copy_states_in(const uint8_t* p, cudaStream_t stream);

  // A prompt chunk in pieces of layers (CudaRunner::forward_layers): whether this session holds the runner's
  // PartWayChunk, and the layers it has left.
  bool holds_part_way() const { return part_way_ && part_way_->holder == id; }
  PartWayChunk& part_way() { return *part_way_; }
  int layers_pending() const override { return holds_part_way() ? int(layers.size()) - part_way_->done : 0; }
  void drop_pending_layers() override;  // the states from before the chunk copied back
  void release_part_way() {
    if (holds_part_way()) part_way_->holder = 0;
  }

  // Verification of drafts (CudaRunner::forward_verify, verify_plan.cu): the Gated DeltaNet states before each of
  // the verify's T tokens, per layer conv [T, Ck-1, C] and rec (the state before the first token and each token's
  // replay values: gdn_kept_rec_floats(d, T), gdn.cuh) (null for attention layers), in one buffer of the runner's
  // KeptStateBuffers, held from the verify until the states are dropped.
  struct KeptStates {
    float* conv = nullptr;
    float* rec = nullptr;
  };
  // The kept states' buffers for a verify of `tokens` tokens (~63 MB and ~3.7 MB per token at the model's widths):
  // a buffer of the pool, carved for `tokens`. Drops any states kept before. The pointers hold
  // until drop_kept_states(); the next verify may get others (verify_step uploads them with each step's tables).
  const std::vector<KeptStates>& kept_buffers(int tokens);
  size_t kept_bytes(int tokens) const;  // the buffer kept_buffers(tokens) needs
  // After a verify of `tokens` tokens from position `from` (the kernels filled kept_buffers).
  void kept_states_from(int64_t from, int64_t tokens) {
    kept_from_ = from;
    kept_tokens_ = tokens;
  }
  // The kept states are no longer valid: their buffer goes back to the pool (every forward, rollback once it copied,
  // reset, restore, the destructor); so is the kept snapshot below.
  void drop_kept_states();
  // The kept states before the verify's token (position - its first) back into place and d_pos set, in two kernel
  // launches (kernels/copy/state_copy.cuh, gdn_state_replay), then a wait.
  void rollback(int64_t position) override;

  // A prefix snapshot inside a short call (Session::keep_state_at; CudaRunner::run_short_call): the verify step that
  // holds the position writes the Gated DeltaNet states there straight into a snapshot's buffer, each layer's where
  // snapshot() would copy it (gdn_decode_from_tables with a keep_token), so no copy and no memory beyond the
  // snapshot's. keep_state_at records the request; check_tokens hands it to the call (keep_in_call), which calls
  // begin_kept_snapshot, runs the step, then kept_snapshot_done.
  void keep_state_at(int64_t position) override;
  std::unique_ptr<StateSnapshot> take_kept_snapshot() override;
  int64_t take_keep_request() { return std::exchange(keep_at_, -1); }
  bool keep_requested() const { return keep_at_ >= 0; }
  const std::vector<KeptStates>& begin_kept_snapshot(int64_t position);  // per layer: where its states go
  const std::vector<KeptStates>& kept_snapshot_layers() const { return kept_snap_layers_; }
  void kept_snapshot_done() { kept_snap_done_ = true; }
  int64_t keep_in_call = -1;  // the current forward call's keep_state_at position (-1: none)

  struct LayerCache {
    // [Hkv, capacity, dh] in the runner's KvDtype: fp16 or bf16 values, or fp8 bytes (i16: int16 values) followed by
    // the rows' fp32 scales [Hkv, capacity] (attention.cuh, attn_cache_bytes)
    void* k = nullptr;
    void* v = nullptr;
    float* conv = nullptr;  // [Ck-1, C]
    float* rec = nullptr;   // [Hv, dv, dk]
    size_t conv_bytes = 0, rec_bytes = 0;
  };
  const void* owner;
  uint64_t id;           // unique per runner: the decode graph is bound to one session's buffers
  int64_t pos = 0;
  int* d_pos = nullptr;  // tokens in the cache, on the device
  int* d_rope_delta = nullptr;  // rope_delta() on the device (the int after d_pos)
  std::vector<LayerCache> layers;
  DeviceArena arena;
  int kv_heads = 0, head_dim = 0;  // the KV caches' shape (copy_kv_prefix)
  GdnDims gdn_dims;  // the Gated DeltaNet heads' shape (kept states; T unset)
  KvDtype kv = KvDtype::f16;       // and their type

 private:
  void copy_kept_states(int64_t t, int64_t position);

  int64_t capacity_;
  int64_t rope_delta_ = 0;
  std::shared_ptr<SnapshotBuffers> snapshot_buffers_;
  std::shared_ptr<KeptStateBuffers> kept_pool_;
  std::shared_ptr<PartWayChunk> part_way_;  // the runner's (null: none)
  KeptStateBuffers::Buffer kept_buffer_;  // taken from kept_pool_ by kept_buffers (empty: none held)
  std::vector<KeptStates> kept_;          // per layer, into kept_buffer_
  int64_t kept_from_ = -1;  // the last verify's first position (-1: no states kept)
  int64_t kept_tokens_ = 0;
  uint8_t* gdn_block_ = nullptr;  // every layer's (conv, rec) back to back, as a snapshot holds them; null: not so
  int64_t keep_at_ = -1;                     // keep_state_at's position for the next forward (-1: none)
  std::unique_ptr<StateSnapshot> kept_snap_;  // begin_kept_snapshot's, filled once kept_snap_done_
  std::vector<KeptStates> kept_snap_layers_;  // per layer, into kept_snap_'s buffer
  bool kept_snap_done_ = false;
};

}  // namespace tern::cuda
