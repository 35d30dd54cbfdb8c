#include "cuda/runner/cuda_session.cuh"

#include <algorithm>
#include <climits>
#include <utility>

#include "core/check.h"
#include "cuda/kernels/attention/attention.cuh"
#include "cuda/kernels/copy/state_copy.cuh"

namespace tern::cuda {
namespace {

// The Gated DeltaNet states of a CudaSession at one position (see StateSnapshot): every layer's conv then
// recurrent state back to back, in one device buffer of the runner's SnapshotBuffers, or in pinned host memory
// after to_host().
class CudaSnapshot final : public StateSnapshot {
 public:
  CudaSnapshot(const void* owner, int64_t position, std::shared_ptr<SnapshotBuffers> buffers)
      : owner(owner), pos(position), size(buffers->bytes()), buffers_(std::move(buffers)) {
    if (size) dev = buffers_->take();
  }
  ~CudaSnapshot() override {
    buffers_->give(dev);
    if (host) cudaFreeHost(host);
  }
  CudaSnapshot(const CudaSnapshot&) = delete;
  CudaSnapshot& operator=(const CudaSnapshot&) = delete;
  int64_t position() const override { return pos; }
  size_t bytes() const override { return size; }
  bool on_host() const override { return host != nullptr; }
  void to_host() override {
    if (host || !dev) return;
    TERN_CUDA(cudaMallocHost(&host, size));
    TERN_CUDA(cudaMemcpy(host, dev, size, cudaMemcpyDeviceToHost));
    buffers_->give(dev);
    dev = nullptr;
  }
  void to_device() override {
    if (!host) return;
    dev = buffers_->take();
    TERN_CUDA(cudaMemcpy(dev, host, size, cudaMemcpyHostToDevice));
    TERN_CUDA(cudaFreeHost(host));
    host = nullptr;
  }
  const uint8_t* data() const { return host ? host : dev; }

  const void* owner;
  int64_t pos;
  int64_t rope_delta = 0;  // the session's M-RoPE delta at pos
  size_t size;
  uint8_t* dev = nullptr;
  uint8_t* host = nullptr;

 private:
  std::shared_ptr<SnapshotBuffers> buffers_;
};

}  // namespace

GdnDims gdn_dims_of(const Config& c, int64_t T) {
  GdnDims d;
  d.T = T;
  d.Hk = c.linear_num_key_heads;
  d.Hv = c.linear_num_value_heads;
  d.dk = c.linear_key_head_dim;
  d.dv = c.linear_value_head_dim;
  return d;
}

namespace {

// One layer's part of a kept-state buffer for `tokens` tokens: conv [tokens, Ck-1, C] and rec (the state before the
// first token and each token's replay values, gdn_kept_rec_floats), each 256-byte aligned (as DeviceArena carves
// them).
size_t kept_layer_bytes(size_t conv_bytes, const GdnDims& d, int tokens) {
  return DeviceArena::align(conv_bytes * size_t(tokens)) +
         DeviceArena::align(size_t(gdn_kept_rec_floats(d, tokens)) * 4);
}

}  // namespace

KeptStateBuffers::~KeptStateBuffers() {
  for (const Buffer& b : spare_) cudaFree(b.data);
}

KeptStateBuffers::Buffer KeptStateBuffers::take(size_t bytes) {
  {
    std::lock_guard lock(mu_);
    auto best = spare_.end();
    for (auto it = spare_.begin(); it != spare_.end(); ++it)
      if (it->bytes >= bytes && (best == spare_.end() || it->bytes < best->bytes)) best = it;
    if (best != spare_.end()) {
      const Buffer b = *best;
      spare_.erase(best);
      in_use_ += b.bytes;
      return b;
    }
    // None fits: every spare is smaller than what verifies now need; free them before the larger allocation.
    for (const Buffer& b : spare_) {
      cudaFree(b.data);
      held_ -= b.bytes;
    }
    spare_.clear();
  }
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    TERN_FAIL("cannot allocate ", bytes >> 20, " MiB of GPU memory for a verify step's kept states (", free_b >> 20,
              " MiB free of ", total_b >> 20, " MiB): ", cudaGetErrorString(e));
  }
  std::lock_guard lock(mu_);
  held_ += bytes;
  in_use_ += bytes;
  return {static_cast<uint8_t*>(p), bytes};
}

void KeptStateBuffers::give(Buffer b) {
  if (!b.data) return;
  std::lock_guard lock(mu_);
  in_use_ -= b.bytes;
  if (spare_.size() < kKeep) {
    spare_.push_back(b);
    return;
  }
  cudaFree(b.data);
  held_ -= b.bytes;
}

size_t KeptStateBuffers::held_bytes() const {
  std::lock_guard lock(mu_);
  return held_;
}

size_t KeptStateBuffers::in_use_bytes() const {
  std::lock_guard lock(mu_);
  return in_use_;
}

size_t kept_state_bytes_of(const DeviceWeights& w, int tokens) {
  const Config& c = w.config;
  const int64_t conv_elems = int64_t(c.linear_conv_kernel_dim - 1) * c.conv_channels();
  size_t bytes = 0;
  for (const DeviceLayer& l : w.layers)
    if (l.type != LayerType::full_attention)
      bytes += kept_layer_bytes(size_t(conv_elems) * 4, gdn_dims_of(c), tokens);
  return bytes;
}

size_t gdn_state_bytes_of(const DeviceWeights& w) {
  const Config& c = w.config;
  const int64_t conv_elems = int64_t(c.linear_conv_kernel_dim - 1) * c.conv_channels();
  const int64_t rec_elems = int64_t(c.linear_num_value_heads) * c.linear_value_head_dim * c.linear_key_head_dim;
  size_t bytes = 0;
  for (const DeviceLayer& l : w.layers)
    if (l.type != LayerType::full_attention) bytes += size_t(conv_elems) * 4 + size_t(rec_elems) * 4;
  return bytes;
}

size_t CudaSession::bytes_for(const DeviceWeights& w, int64_t capacity, KvDtype kv) {
  const Config& c = w.config;
  const int64_t kv_bytes = attn_cache_bytes(kv, c.num_key_value_heads, capacity, c.head_dim);  // K or V
  const int64_t conv_elems = int64_t(c.linear_conv_kernel_dim - 1) * c.conv_channels();
  const int64_t rec_elems = int64_t(c.linear_num_value_heads) * c.linear_value_head_dim * c.linear_key_head_dim;
  size_t bytes = DeviceArena::align(2 * sizeof(int));  // d_pos, d_rope_delta
  for (const DeviceLayer& l : w.layers)
    bytes += l.type == LayerType::full_attention ? 2 * DeviceArena::align(size_t(kv_bytes))
                                                 : DeviceArena::align(size_t(conv_elems) * 4) +
                                                       DeviceArena::align(size_t(rec_elems) * 4);
  return bytes;
}

CudaSession::CudaSession(const DeviceWeights& w, int64_t capacity, KvDtype kv, const void* owner, uint64_t id,
                         std::shared_ptr<SnapshotBuffers> snapshot_buffers,
                         std::shared_ptr<KeptStateBuffers> kept_pool, std::shared_ptr<PartWayChunk> part_way)
    : owner(owner),
      id(id),
      kv(kv),
      capacity_(capacity),
      snapshot_buffers_(std::move(snapshot_buffers)),
      kept_pool_(std::move(kept_pool)),
      part_way_(std::move(part_way)) {
  const Config& c = w.config;
  kv_heads = c.num_key_value_heads;
  head_dim = c.head_dim;
  gdn_dims = gdn_dims_of(c);
  const int64_t kv_bytes = attn_cache_bytes(kv, c.num_key_value_heads, capacity, c.head_dim);  // K or V
  const int64_t conv_elems = int64_t(c.linear_conv_kernel_dim - 1) * c.conv_channels();
  const int64_t rec_elems = int64_t(c.linear_num_value_heads) * c.linear_value_head_dim * c.linear_key_head_dim;
  arena = DeviceArena(bytes_for(w, capacity, kv), "session caches");
  d_pos = arena.take_n<int>(2);
  d_rope_delta = d_pos + 1;
  // Every Gated DeltaNet layer's states first, in layer order (conv, rec), then the KV caches: where the sizes need no
  // padding (the model's widths), the states are one block laid out as a snapshot is (gdn_block_), copied, restored
  // and cleared in one call each instead of two per layer.
  layers.resize(w.layers.size());
  const size_t used_before = arena.used();
  uint8_t* first = nullptr;
  for (size_t i = 0; i < w.layers.size(); ++i) {
    if (w.layers[i].type == LayerType::full_attention) continue;
    LayerCache& lc = layers[i];
    lc.conv = arena.take_n<float>(size_t(conv_elems));
    lc.rec = arena.take_n<float>(size_t(rec_elems));
    lc.conv_bytes = size_t(conv_elems) * 4;
    lc.rec_bytes = size_t(rec_elems) * 4;
    if (!first) first = reinterpret_cast<uint8_t*>(lc.conv);
  }
  const size_t state_bytes = gdn_state_bytes();
  if (first && conv_elems > 0 && arena.used() - used_before == state_bytes) gdn_block_ = first;
  for (size_t i = 0; i < w.layers.size(); ++i) {
    if (w.layers[i].type != LayerType::full_attention) continue;
    layers[i].k = arena.take(size_t(kv_bytes));
    layers[i].v = arena.take(size_t(kv_bytes));
  }
  reset();
}

void CudaSession::reset() {
  drop_kept_states();
  release_part_way();
  keep_at_ = -1;
  TERN_CUDA(cudaDeviceSynchronize());
  if (gdn_block_) {
    TERN_CUDA(cudaMemset(gdn_block_, 0, gdn_state_bytes()));
  } else {
    for (const LayerCache& lc : layers) {
      if (lc.conv) TERN_CUDA(cudaMemset(lc.conv, 0, lc.conv_bytes));
      if (lc.rec) TERN_CUDA(cudaMemset(lc.rec, 0, lc.rec_bytes));
    }
  }
  TERN_CUDA(cudaMemset(d_pos, 0, 2 * sizeof(int)));  // and d_rope_delta
  TERN_CUDA(cudaDeviceSynchronize());
  pos = 0;
  rope_delta_ = 0;
}

void CudaSession::set_rope_delta(int64_t delta, cudaStream_t stream) {
  TERN_CHECK(delta >= INT32_MIN && delta <= INT32_MAX, "cuda session: M-RoPE delta ", delta, " out of range");
  const int d32 = int(delta);
  // From pageable memory: the copy has taken the value when the call returns.
  TERN_CUDA(cudaMemcpyAsync(d_rope_delta, &d32, sizeof(int), cudaMemcpyHostToDevice, stream));
  rope_delta_ = delta;
}

size_t CudaSession::gdn_state_bytes() const {
  size_t bytes = 0;
  for (const LayerCache& lc : layers) bytes += lc.conv_bytes + lc.rec_bytes;
  return bytes;
}

void CudaSession::copy_states_out(uint8_t* p, cudaStream_t stream) const {
  if (gdn_block_) {
    TERN_CUDA(cudaMemcpyAsync(p, gdn_block_, gdn_state_bytes(), cudaMemcpyDefault, stream));
    return;
  }
  for (const LayerCache& lc : layers) {
    if (lc.conv) TERN_CUDA(cudaMemcpyAsync(p, lc.conv, lc.conv_bytes, cudaMemcpyDefault, stream));
    p += lc.conv_bytes;
    if (lc.rec) TERN_CUDA(cudaMemcpyAsync(p, lc.rec, lc.rec_bytes, cudaMemcpyDefault, stream));
    p += lc.rec_bytes;
  }
}

void CudaSession::copy_states_in(const uint8_t* p, cudaStream_t stream) {
  if (gdn_block_) {
    TERN_CUDA(cudaMemcpyAsync(gdn_block_, p, gdn_state_bytes(), cudaMemcpyDefault, stream));
    return;
  }
  for (const LayerCache& lc : layers) {
    if (lc.conv) TERN_CUDA(cudaMemcpyAsync(lc.conv, p, lc.conv_bytes, cudaMemcpyDefault, stream));
    p += lc.conv_bytes;
    if (lc.rec) TERN_CUDA(cudaMemcpyAsync(lc.rec, p, lc.rec_bytes, cudaMemcpyDefault, stream));
    p += lc.rec_bytes;
  }
}

// The forward that ran the chunk's pieces is on the runner's stream: the device is synchronised before the copy (as
// restore does), and after it.
void CudaSession::drop_pending_layers() {
  if (!holds_part_way()) return;
  TERN_CUDA(cudaDeviceSynchronize());
  const cudaStream_t cs = snapshot_buffers_->stream();
  copy_states_in(part_way_->gdn_before, cs);
  TERN_CUDA(cudaStreamSynchronize(cs));
  release_part_way();
}

std::unique_ptr<StateSnapshot> CudaSession::snapshot() const {
  TERN_CHECK(!holds_part_way(), "cuda snapshot: the session holds a prompt chunk part way");
  TERN_CUDA(cudaDeviceSynchronize());
  TERN_CHECK(snapshot_buffers_->bytes() == gdn_state_bytes(), "cuda snapshot: buffers of ", snapshot_buffers_->bytes(),
             " bytes for states of ", gdn_state_bytes());
  auto snap = std::make_unique<CudaSnapshot>(owner, pos, snapshot_buffers_);
  snap->rope_delta = rope_delta_;
  const cudaStream_t cs = snapshot_buffers_->stream();
  copy_states_out(snap->dev, cs);
  TERN_CUDA(cudaStreamSynchronize(cs));
  return snap;
}

void CudaSession::restore(const StateSnapshot& snapshot) {
  const auto* snap = dynamic_cast<const CudaSnapshot*>(&snapshot);
  TERN_CHECK(snap != nullptr && snap->owner == owner, "cuda restore: the snapshot was not made by this runner");
  TERN_CHECK(snap->pos <= capacity_, "cuda restore: the snapshot is at ", snap->pos,
             " tokens, over this session's capacity of ", capacity_);
  TERN_CHECK(snap->size == gdn_state_bytes(), "cuda restore: the snapshot holds ", snap->size,
             " bytes, the session's states ", gdn_state_bytes());
  drop_kept_states();
  release_part_way();
  keep_at_ = -1;
  TERN_CUDA(cudaDeviceSynchronize());
  const cudaStream_t cs = snapshot_buffers_->stream();
  copy_states_in(snap->data(), cs);  // from device, or pinned host memory
  TERN_CUDA(cudaStreamSynchronize(cs));
  const int pos_delta[2] = {int(snap->pos), int(snap->rope_delta)};  // d_pos, d_rope_delta
  TERN_CUDA(cudaMemcpy(d_pos, pos_delta, sizeof(pos_delta), cudaMemcpyHostToDevice));
  TERN_CUDA(cudaDeviceSynchronize());
  pos = snap->pos;
  rope_delta_ = snap->rope_delta;
}

size_t CudaSession::kept_bytes(int tokens) const {
  size_t bytes = 0;
  for (const LayerCache& lc : layers)
    if (lc.rec) bytes += kept_layer_bytes(lc.conv_bytes, gdn_dims, tokens);
  return bytes;
}

const std::vector<CudaSession::KeptStates>& CudaSession::kept_buffers(int tokens) {
  TERN_CHECK(tokens >= 1, "cuda verify: kept states for ", tokens, " tokens");
  drop_kept_states();
  const size_t bytes = kept_bytes(tokens);
  if (bytes) kept_buffer_ = kept_pool_->take(bytes);
  kept_.assign(layers.size(), KeptStates{});
  uint8_t* p = kept_buffer_.data;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerCache& lc = layers[i];
    if (!lc.rec) continue;
    kept_[i].conv = reinterpret_cast<float*>(p);
    p += DeviceArena::align(lc.conv_bytes * size_t(tokens));
    kept_[i].rec = reinterpret_cast<float*>(p);
    p += DeviceArena::align(size_t(gdn_kept_rec_floats(gdn_dims, tokens)) * 4);
  }
  TERN_INTERNAL_CHECK(size_t(p - kept_buffer_.data) <= kept_buffer_.bytes, "cuda verify: kept states of ",
                      p - kept_buffer_.data, " bytes in a buffer of ", kept_buffer_.bytes);
  return kept_;
}

void CudaSession::drop_kept_states() {
  kept_from_ = -1;
  kept_snap_.reset();
  kept_snap_layers_.clear();
  kept_snap_done_ = false;
  if (!kept_buffer_.data) return;
  kept_.clear();
  kept_pool_->give(kept_buffer_);
  kept_buffer_ = {};
}

void CudaSession::keep_state_at(int64_t position) {
  TERN_CHECK(position > pos, "cuda keep_state_at: position ", position, " is not past the session's ", pos);
  keep_at_ = position;
}

std::unique_ptr<StateSnapshot> CudaSession::take_kept_snapshot() {
  if (!kept_snap_done_) return nullptr;
  kept_snap_done_ = false;
  kept_snap_layers_.clear();
  return std::move(kept_snap_);
}

const std::vector<CudaSession::KeptStates>& CudaSession::begin_kept_snapshot(int64_t position) {
  TERN_CHECK(snapshot_buffers_->bytes() == gdn_state_bytes(), "cuda snapshot: buffers of ", snapshot_buffers_->bytes(),
             " bytes for states of ", gdn_state_bytes());
  auto snap = std::make_unique<CudaSnapshot>(owner, position, snapshot_buffers_);
  snap->rope_delta = rope_delta_;  // a short call holds no image tokens: the delta is the call's throughout
  kept_snap_layers_.assign(layers.size(), KeptStates{});
  uint8_t* p = snap->dev;  // snapshot()'s layout: every layer's conv then rec, back to back
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerCache& lc = layers[i];
    if (lc.conv) kept_snap_layers_[i].conv = reinterpret_cast<float*>(p);
    p += lc.conv_bytes;
    if (lc.rec) kept_snap_layers_[i].rec = reinterpret_cast<float*>(p);
    p += lc.rec_bytes;
  }
  kept_snap_ = std::move(snap);
  kept_snap_done_ = false;
  return kept_snap_layers_;
}

// The states before token (position - kept_from_) of the last verify back into place; none to copy when every
// token was accepted. The runner's stream is idle here (forward_verify ends with a synchronize). The kept buffer
// goes back to the pool once the copies are done.
void CudaSession::rollback(int64_t position) {
  TERN_CHECK(!holds_part_way(), "cuda rollback: the session holds a prompt chunk part way");
  TERN_CHECK(kept_from_ >= 0, "cuda rollback: no verify forward's states are kept");
  TERN_CHECK(position >= kept_from_ && position <= kept_from_ + kept_tokens_ && kept_from_ + kept_tokens_ == pos,
             "cuda rollback: position ", position, " outside the last verify's [", kept_from_, ", ",
             kept_from_ + kept_tokens_, "]");
  const int64_t t = position - kept_from_;
  kept_from_ = -1;  // valid once, whatever happens below
  if (position != pos) copy_kept_states(t, position);
  drop_kept_states();
}

// Each Gated DeltaNet layer's states before the verify's token t into place, and the position `position`: one
// launch of the state-copy kernel for every layer's conv state and d_pos (kernels/copy/state_copy.cuh; a
// cudaMemcpyAsync per state measured 0.25 ms against its 0.05, docs/benchmarks.md, thirty-fourth session) and one of
// gdn_state_replay for every layer's recurrent state (the state before token 0 through t updates, gdn.cuh) on the
// snapshot stream, then one wait. Live states and kept ones are whole 16-byte words at 16-byte aligned addresses:
// the arena and the kept buffer (kept_buffers) carve 256-byte aligned slices, and token t of a kept conv state starts
// t x conv_bytes into its slice, a multiple of 16 at the model's widths; state_copy_entry checks it.
void CudaSession::copy_kept_states(int64_t t, int64_t position) {
  TERN_INTERNAL_CHECK(position >= 0 && position <= INT32_MAX, "cuda rollback: position ", position);
  const cudaStream_t cs = snapshot_buffers_->stream();
  std::vector<StateCopy> copies;  // every layer's conv: token t's slot of the kept buffer -> the live state
  std::vector<GdnReplay> replays;  // every layer's rec: the kept state before token 0, replayed through t tokens
  copies.reserve(layers.size());
  replays.reserve(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerCache& lc = layers[i];
    if (!lc.rec) continue;
    if (lc.conv_bytes)
      copies.push_back(state_copy_entry(lc.conv, kept_[i].conv + t * int64_t(lc.conv_bytes / 4), lc.conv_bytes));
    replays.push_back(GdnReplay{lc.rec, kept_[i].rec});
  }
  gdn_state_replay(replays.data(), int(replays.size()), gdn_dims, int(t), cs);
  state_copy(copies, d_pos, int(position), cs);
  TERN_CUDA(cudaStreamSynchronize(cs));
  pos = position;
}

void CudaSession::copy_kv_prefix(const Session& from, int64_t n) {
  const auto* src = dynamic_cast<const CudaSession*>(&from);
  TERN_CHECK(src != nullptr && src->owner == owner, "cuda copy_kv_prefix: the session was not made by this runner");
  TERN_CHECK(!holds_part_way(), "cuda copy_kv_prefix: the session holds a prompt chunk part way");
  TERN_CHECK(n >= 0 && n <= src->capacity_ && n <= capacity_, "cuda copy_kv_prefix: ", n,
             " rows from a session of capacity ", src->capacity_, " into one of ", capacity_);
  if (src == this || n == 0) return;
  TERN_INTERNAL_CHECK(src->kv == kv, "cuda copy_kv_prefix: KV caches of two types in one runner");
  TERN_CUDA(cudaDeviceSynchronize());
  // Rows [0, n) of every head: [Hkv, capacity, dh] values of 2 bytes (fp16, bf16, i16) or 1 (fp8); for fp8 and i16
  // also the rows' scales, [Hkv, capacity] floats after the values (attention.cuh).
  const size_t row = size_t(head_dim) * size_t(kv_value_bytes(kv)), width = size_t(n) * row;
  auto copy_rows = [&](void* dst, const void* from) {
    TERN_CUDA(cudaMemcpy2D(dst, size_t(capacity_) * row, from, size_t(src->capacity_) * row, width, size_t(kv_heads),
                           cudaMemcpyDeviceToDevice));
    if (!kv_row_scaled(kv)) return;
    auto* d8 = static_cast<uint8_t*>(dst) + attn_row_scales_offset(kv, kv_heads, capacity_, head_dim);
    const auto* s8 = static_cast<const uint8_t*>(from) + attn_row_scales_offset(kv, kv_heads, src->capacity_, head_dim);
    TERN_CUDA(cudaMemcpy2D(d8, size_t(capacity_) * sizeof(float), s8, size_t(src->capacity_) * sizeof(float),
                           size_t(n) * sizeof(float), size_t(kv_heads), cudaMemcpyDeviceToDevice));
  };
  for (size_t i = 0; i < layers.size(); ++i) {
    if (!layers[i].k) continue;
    copy_rows(layers[i].k, src->layers[i].k);
    copy_rows(layers[i].v, src->layers[i].v);
  }
  TERN_CUDA(cudaDeviceSynchronize());
}

}  // namespace tern::cuda
