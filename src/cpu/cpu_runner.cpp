// The forward plan of Qwen3.6 on the CPU. It only composes the ops of src/cpu/ops_*.h and names each intermediate
// (attn_norm.7, ...) so that `tern logits --dump-activations` can write them for diffing against the reference.
#include "cpu/cpu_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/npy.h"
#include "cpu/gated_attention.h"
#include "cpu/image_tokens.h"
#include "cpu/mtp_forward.h"
#include "cpu/ops_attention.h"
#include "cpu/ops_conv1d.h"
#include "cpu/ops_elementwise.h"
#include "cpu/ops_embed.h"
#include "cpu/ops_gdn.h"
#include "cpu/ops_matmul.h"
#include "cpu/ops_moe.h"
#include "cpu/ops_norm.h"
#include "cpu/ops_rope.h"
#include "cpu/vision_encoder.h"
#include "model/vision_weights.h"

namespace tern {
namespace {

using namespace tern::cpu;

// "attn_norm.7": the name of a per-layer intermediate in activation dumps.
std::string layer_name(const char* base, int layer) {
  std::string s(base);
  s += '.';
  s += std::to_string(layer);
  return s;
}

// Per-layer state of one sequence.
// MemAvailable of /proc/meminfo (RAM that new allocations can take without swapping), or -1 where it is not there.
int64_t available_ram_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (f >> key >> kb) {
    std::getline(f, unit);
    if (key == "MemAvailable:") return kb * 1024;
  }
  return -1;
}

struct LayerState {
  // full attention: K and V caches [Hkv, allocated, dh]; grown on demand up to the session capacity.
  std::vector<float> k_cache, v_cache;
  // Gated DeltaNet: conv state [Ck-1, C] and recurrent state [Hv, dv, dk].
  std::vector<float> conv_state, gdn_state;
  // After a verify forward of T tokens (CpuRunner::forward_verify): the states after 0..T of its tokens,
  // [T + 1, Ck-1, C] and [T + 1, Hv, dv, dk], for Session::rollback.
  std::vector<float> kept_conv, kept_gdn;
};

// The Gated DeltaNet states of every linear-attention layer at one position. "Device" memory on the CPU is the
// per-layer vectors; to_host() packs them into one contiguous buffer (and back), so that the prefix cache's
// eviction path runs, and is tested, exactly as on the GPU.
class CpuSnapshot final : public StateSnapshot {
 public:
  int64_t position() const override { return position_; }
  size_t bytes() const override { return (elems_ + mtp_hidden_.size()) * sizeof(float); }
  bool on_host() const override { return host_; }
  void to_host() override {
    if (host_) return;
    packed_.resize(elems_);
    size_t o = 0;
    for (const auto& [conv, rec] : layers_) {
      std::copy(conv.begin(), conv.end(), packed_.begin() + ptrdiff_t(o));
      o += conv.size();
      std::copy(rec.begin(), rec.end(), packed_.begin() + ptrdiff_t(o));
      o += rec.size();
    }
    for (auto& [conv, rec] : layers_) {
      std::vector<float>().swap(conv);
      std::vector<float>().swap(rec);
    }
    host_ = true;
  }
  void to_device() override {
    if (!host_) return;
    size_t o = 0;
    for (size_t i = 0; i < layers_.size(); ++i) {
      layers_[i].first.assign(packed_.begin() + ptrdiff_t(o), packed_.begin() + ptrdiff_t(o + sizes_[i].first));
      o += sizes_[i].first;
      layers_[i].second.assign(packed_.begin() + ptrdiff_t(o), packed_.begin() + ptrdiff_t(o + sizes_[i].second));
      o += sizes_[i].second;
    }
    std::vector<float>().swap(packed_);
    host_ = false;
  }

  // Copies layer i's states into (conv, rec), from wherever they are.
  void read(size_t i, std::vector<float>& conv, std::vector<float>& rec) const {
    TERN_CHECK(i < layers_.size() && conv.size() == sizes_[i].first && rec.size() == sizes_[i].second,
               "cpu restore: the snapshot's layer ", i, " does not match the session");
    if (!host_) {
      std::copy(layers_[i].first.begin(), layers_[i].first.end(), conv.begin());
      std::copy(layers_[i].second.begin(), layers_[i].second.end(), rec.begin());
      return;
    }
    size_t o = 0;
    for (size_t j = 0; j < i; ++j) o += sizes_[j].first + sizes_[j].second;
    std::copy(packed_.begin() + ptrdiff_t(o), packed_.begin() + ptrdiff_t(o + conv.size()), conv.begin());
    o += conv.size();
    std::copy(packed_.begin() + ptrdiff_t(o), packed_.begin() + ptrdiff_t(o + rec.size()), rec.begin());
  }

  const void* owner_ = nullptr;
  int64_t position_ = 0;
  int64_t rope_delta_ = 0;  // the session's M-RoPE delta at position_
  size_t elems_ = 0;
  bool host_ = false;
  std::vector<std::pair<std::vector<float>, std::vector<float>>> layers_;  // (conv, rec) per layer; empty: attention
  std::vector<std::pair<size_t, size_t>> sizes_;                           // their element counts
  std::vector<float> packed_;                                              // on the host: every layer back to back
  std::vector<float> mtp_hidden_;  // [D] the MTP head's input at position - 1 (its next pair), when it was there
};

class CpuSession final : public Session {
 public:
  CpuSession(const void* owner, const Config& cfg, int64_t capacity) : owner_(owner), capacity_(capacity) {
    layers_.resize(cfg.layer_types.size());
    for (size_t i = 0; i < layers_.size(); ++i) {
      if (cfg.layer_types[i] == LayerType::linear_attention) {
        layers_[i].conv_state.assign(size_t((cfg.linear_conv_kernel_dim - 1) * cfg.conv_channels()), 0.0f);
        layers_[i].gdn_state.assign(size_t(int64_t(cfg.linear_num_value_heads) * cfg.linear_value_head_dim *
                                           cfg.linear_key_head_dim),
                                    0.0f);
      }
    }
    kv_width_ = int64_t(cfg.num_key_value_heads) * cfg.head_dim;
    cfg_ = &cfg;
  }

  int64_t position() const override { return position_; }
  int64_t capacity() const override { return capacity_; }
  int64_t rope_delta() const override { return rope_delta_; }
  void reset() override {
    drop_kept();
    part_way_.reset();
    keep_at_ = -1;
    position_ = 0;
    rope_delta_ = 0;
    mtp_.clear();
    mtp_hidden_.clear();
    for (LayerState& l : layers_) {
      std::fill(l.conv_state.begin(), l.conv_state.end(), 0.0f);
      std::fill(l.gdn_state.begin(), l.gdn_state.end(), 0.0f);
    }
  }

  bool can_snapshot() const override { return true; }

  std::unique_ptr<StateSnapshot> snapshot() const override {
    TERN_CHECK(!part_way_, "cpu snapshot: the session holds a prompt chunk part way");
    auto snap = std::make_unique<CpuSnapshot>();
    snap->owner_ = owner_;
    snap->position_ = position_;
    snap->rope_delta_ = rope_delta_;
    for (const LayerState& l : layers_) {
      snap->layers_.emplace_back(l.conv_state, l.gdn_state);
      snap->sizes_.emplace_back(l.conv_state.size(), l.gdn_state.size());
      snap->elems_ += l.conv_state.size() + l.gdn_state.size();
    }
    const int64_t D = cfg_->hidden_size, rows = int64_t(mtp_hidden_.size()) / D;
    if (rows > 0 && mtp_hidden_pos0_ + rows == position_) snap->mtp_hidden_.assign(mtp_hidden_.end() - D, mtp_hidden_.end());
    return snap;
  }

  void restore(const StateSnapshot& snapshot) override {
    const auto* snap = dynamic_cast<const CpuSnapshot*>(&snapshot);
    TERN_CHECK(snap != nullptr && snap->owner_ == owner_, "cpu restore: the snapshot was not made by this runner");
    TERN_CHECK(snap->position_ <= capacity_ && snap->position_ <= allocated_, "cpu restore: the snapshot is at ",
               snap->position_, " tokens; this session holds ", allocated_, " KV rows (capacity ", capacity_, ")");
    TERN_CHECK(snap->layers_.size() == layers_.size(), "cpu restore: the snapshot has ", snap->layers_.size(),
               " layers, the session ", layers_.size());
    for (size_t i = 0; i < layers_.size(); ++i) snap->read(i, layers_[i].conv_state, layers_[i].gdn_state);
    part_way_.reset();
    position_ = snap->position_;
    rope_delta_ = snap->rope_delta_;
    // The MTP pair at position - 1 holds the token after it, which may change now: its row is cut, and the hidden at
    // position - 1 the snapshot kept (when the session had it) lets the engine feed that pair again.
    mtp_.rows = std::min(mtp_.rows, std::max<int64_t>(0, position_ - 1));
    mtp_hidden_ = snap->mtp_hidden_;  // the pair at position - 1 can be fed again
    mtp_hidden_pos0_ = position_ - 1;
    drop_kept();
  }

  void keep_state_at(int64_t position) override {
    TERN_CHECK(position > position_, "cpu keep_state_at: position ", position, " is not past the session's ",
               position_);
    keep_at_ = position;
  }
  std::unique_ptr<StateSnapshot> take_kept_snapshot() override { return std::move(kept_snap_); }

  // ---- a prompt chunk in pieces of layers (CpuRunner::forward_layers) ----
  int layers_pending() const override { return part_way_ ? int(layers_.size()) - part_way_->done : 0; }
  void drop_pending_layers() override {
    if (!part_way_) return;
    for (size_t i = 0; i < layers_.size(); ++i) {
      layers_[i].conv_state = part_way_->gdn_before[i].first;
      layers_[i].gdn_state = part_way_->gdn_before[i].second;
    }
    part_way_.reset();
  }
  // The chunk run part way: its tokens, its hidden rows after `done` layers, and the Gated DeltaNet states before it.
  struct PartWay {
    std::vector<int32_t> tokens;
    std::vector<float> x;  // [T, D]
    int done = 0;
    std::vector<std::pair<std::vector<float>, std::vector<float>>> gdn_before;  // (conv, rec) per layer
  };
  std::optional<PartWay> part_way_;

  void rollback(int64_t position) override {
    TERN_CHECK(!part_way_, "cpu rollback: the session holds a prompt chunk part way");
    TERN_CHECK(kept_from_ >= 0, "cpu rollback: no verify forward's states are kept");
    TERN_CHECK(position >= kept_from_ && position <= position_, "cpu rollback: position ", position,
               " is outside the last verify forward's [", kept_from_, ", ", position_, "]");
    const size_t j = size_t(position - kept_from_);
    for (LayerState& l : layers_) {
      if (l.conv_state.empty()) continue;
      const size_t nc = l.conv_state.size(), ng = l.gdn_state.size();
      std::copy_n(l.kept_conv.begin() + ptrdiff_t(j * nc), nc, l.conv_state.begin());
      std::copy_n(l.kept_gdn.begin() + ptrdiff_t(j * ng), ng, l.gdn_state.begin());
    }
    position_ = position;
    // The MTP head's input ends where the sequence now does, so that the next forward keeps its last row.
    const int64_t D = cfg_->hidden_size, rows = int64_t(mtp_hidden_.size()) / D;
    mtp_hidden_.resize(size_t(std::clamp<int64_t>(position - mtp_hidden_pos0_, 0, rows) * D));
    drop_kept();
  }
  // The kept states are no longer valid (their buffers stay allocated for the next verify forward), nor the kept
  // snapshot.
  void drop_kept() {
    kept_from_ = -1;
    kept_snap_.reset();
  }

  // Implemented below CpuRunner (needs the config): see copy_kv_prefix.
  void copy_kv_prefix(const Session& from, int64_t n) override;
  const Config* cfg_ = nullptr;

  // Makes room for `needed` positions in every KV cache (amortised doubling, capped at the capacity).
  void reserve_kv(const Config& cfg, int64_t needed) {
    if (needed <= allocated_) return;
    const int64_t next = std::min(capacity_, std::max(needed, std::max<int64_t>(256, 2 * allocated_)));
    const int Hkv = cfg.num_key_value_heads;
    const int64_t dh = cfg.head_dim;
    for (size_t i = 0; i < layers_.size(); ++i) {
      if (cfg.layer_types[i] != LayerType::full_attention) continue;
      for (std::vector<float>* c : {&layers_[i].k_cache, &layers_[i].v_cache}) {
        std::vector<float> grown(static_cast<size_t>(Hkv * next * dh), 0.0f);
        for (int h = 0; h < Hkv; ++h)
          if (allocated_ > 0)
            std::memcpy(grown.data() + h * next * dh, c->data() + h * allocated_ * dh,
                        size_t(position_ * dh) * sizeof(float));
        c->swap(grown);
      }
    }
    allocated_ = next;
  }

  const void* owner_;
  int64_t capacity_;
  int64_t position_ = 0;
  int64_t rope_delta_ = 0;  // M-RoPE: a text token at cache position p sits at p + rope_delta_ (Session::rope_delta)
  int64_t allocated_ = 0;  // KV positions allocated
  int64_t kv_width_ = 0;
  int64_t kept_from_ = -1;  // the position before the last verify forward whose states are kept; -1: none
  int64_t keep_at_ = -1;    // keep_state_at's position for the next forward; -1: none
  std::unique_ptr<CpuSnapshot> kept_snap_;  // what the last forward kept there (take_kept_snapshot)
  std::vector<LayerState> layers_;

  // ---- the MTP draft head (only with weights that hold it) ----
  cpu::MtpCache mtp_;
  std::vector<float> mtp_hidden_;  // [rows, D] the last forward's hidden after the final norm (ModelRunner::mtp_hidden)
  int64_t mtp_hidden_pos0_ = 0;
  // Keeps the hidden states of a forward over positions [pos0, pos0 + T), after the previous one's last row when
  // that was position pos0 - 1.
  void keep_mtp_hidden(const float* h, int64_t pos0, int64_t T, int64_t D) {
    const int64_t rows = int64_t(mtp_hidden_.size()) / D;
    std::vector<float> kept;
    int64_t first = pos0;
    if (rows > 0 && mtp_hidden_pos0_ + rows == pos0) {
      kept.assign(mtp_hidden_.end() - D, mtp_hidden_.end());
      first = pos0 - 1;
    }
    kept.insert(kept.end(), h, h + T * D);
    mtp_hidden_.swap(kept);
    mtp_hidden_pos0_ = first;
  }
};

void CpuSession::copy_kv_prefix(const Session& from, int64_t n) {
  const auto* src = dynamic_cast<const CpuSession*>(&from);
  TERN_CHECK(src != nullptr && src->owner_ == owner_, "cpu copy_kv_prefix: the session was not made by this runner");
  TERN_CHECK(!part_way_, "cpu copy_kv_prefix: the session holds a prompt chunk part way");
  TERN_CHECK(n >= 0 && n <= src->allocated_ && n <= capacity_, "cpu copy_kv_prefix: ", n, " rows from a session of ",
             src->allocated_, " into one of capacity ", capacity_);
  if (src == this || n == 0) return;
  mtp_.clear();  // the MTP head's cache is not copied: its pairs are fed again from the hidden states
  reserve_kv(*cfg_, n);
  const int Hkv = cfg_->num_key_value_heads;
  const int64_t dh = cfg_->head_dim;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (cfg_->layer_types[i] != LayerType::full_attention) continue;
    for (int h = 0; h < Hkv; ++h) {
      std::memcpy(layers_[i].k_cache.data() + h * allocated_ * dh, src->layers_[i].k_cache.data() + h * src->allocated_ * dh,
                  size_t(n * dh) * sizeof(float));
      std::memcpy(layers_[i].v_cache.data() + h * allocated_ * dh, src->layers_[i].v_cache.data() + h * src->allocated_ * dh,
                  size_t(n * dh) * sizeof(float));
    }
  }
}

class CpuRunner final : public ModelRunner {
 public:
  CpuRunner(std::shared_ptr<const ModelWeights> w, const CpuRunnerOptions& o) : w_(std::move(w)), opt_(o) {
    TERN_CHECK(w_ != nullptr, "cpu runner: no weights");
    const Config& c = w_->config;
    TERN_CHECK(int(w_->layers.size()) == c.num_hidden_layers && c.layer_types.size() == w_->layers.size(),
               "cpu runner: ", w_->layers.size(), " layers of weights for a config of ", c.num_hidden_layers);
    TERN_CHECK(w_->embed.rows == c.vocab_size && w_->embed.cols == c.hidden_size, "cpu runner: embedding is [",
               w_->embed.rows, ", ", w_->embed.cols, "], expected [", c.vocab_size, ", ", c.hidden_size, "]");
    TERN_CHECK(w_->lm_head.rows == c.vocab_size && w_->lm_head.cols == c.hidden_size, "cpu runner: lm_head is [",
               w_->lm_head.rows, ", ", w_->lm_head.cols, "], expected [", c.vocab_size, ", ", c.hidden_size, "]");
    TERN_CHECK(int64_t(w_->final_norm.size()) == c.hidden_size, "cpu runner: final norm has ",
               w_->final_norm.size(), " values, expected ", c.hidden_size);
    TERN_CHECK(c.rotary_dims() % 2 == 0 && c.rotary_dims() <= c.head_dim, "cpu runner: rotary dims ",
               c.rotary_dims(), " for head dim ", c.head_dim);
    for (size_t i = 0; i < w_->layers.size(); ++i)
      validate_layer(w_->layers[i], c.layer_types[i], layer_name("layer", int(i)));
    if (w_->mtp) validate_mtp();
  }

  std::string backend_name() const override { return "cpu"; }
  const Config& config() const override { return w_->config; }
  int64_t vocab_real() const override {
    return w_->vocab_real > 0 ? std::min(w_->vocab_real, w_->config.vocab_size) : w_->config.vocab_size;
  }

  std::unique_ptr<Session> create_session(int64_t max_context) override {
    TERN_CHECK(max_context > 0, "session capacity must be positive, got ", max_context);
    return std::make_unique<CpuSession>(this, w_->config, max_context);
  }
  // A full session: fp32 K and V of every attention layer and of the MTP head's (grown on demand up to this), the
  // Gated DeltaNet states.
  int64_t session_bytes(int64_t max_context) const override {
    const Config& c = w_->config;
    int64_t floats = 0;
    for (LayerType t : c.layer_types)
      floats += t == LayerType::full_attention
                    ? 2 * max_context * int64_t(c.num_key_value_heads) * c.head_dim
                    : int64_t(c.linear_conv_kernel_dim - 1) * c.conv_channels() +
                          int64_t(c.linear_num_value_heads) * c.linear_value_head_dim * c.linear_key_head_dim;
    if (w_->mtp) floats += 2 * max_context * int64_t(c.num_key_value_heads) * c.head_dim;
    return floats * 4;
  }
  int64_t free_memory_bytes() const override { return available_ram_bytes(); }

  void set_activation_dump_dir(const std::string& dir) override { dump_dir_ = dir; }

  void forward(Session& session, std::span<const int32_t> tokens, bool all_logits,
               std::vector<float>& logits) override {
    run(session, tokens, {}, all_logits, /*verify=*/false, logits);
  }
  // A forward call of two tokens or more splits its Gated DeltaNet layers at the kept position: the arithmetic of two
  // calls cut there.
  bool keeps_state_inside(int64_t tokens) const override { return tokens >= 2; }
  bool supports_verify() const override { return true; }
  // The states before the first token and after each (T + 1 per Gated DeltaNet layer, fp32, in RAM: gdn_layer), kept
  // by the session for its life (resized to the largest verify).
  int64_t verify_state_bytes(int tokens) const override {
    if (tokens <= 0) return 0;
    const Config& c = w_->config;
    int64_t floats = 0;
    for (LayerType t : c.layer_types)
      if (t != LayerType::full_attention)
        floats += int64_t(c.linear_conv_kernel_dim - 1) * c.conv_channels() +
                  int64_t(c.linear_num_value_heads) * c.linear_value_head_dim * c.linear_key_head_dim;
    return (int64_t(tokens) + 1) * floats * 4;
  }
  void forward_verify(Session& session, std::span<const int32_t> tokens, std::vector<float>& logits) override {
    run(session, tokens, {}, /*all_logits=*/true, /*verify=*/true, logits);
  }

  // A chunk in pieces of layers: any text chunk of two tokens or more (each session keeps its own piece's rows).
  bool runs_layers_apart(const Session& session, int64_t tokens) const override {
    return tokens >= 2 && w_->layers.size() >= 2 && own(session).keep_at_ < 0;
  }
  void forward_layers(Session& session, std::span<const int32_t> tokens, int layers) override;

  // ---- images (cpu/vision_encoder.h, cpu/image_tokens.h) ----
  std::string images_unavailable() const override {
    if (w_->vision) return "";
    return "this model has no vision encoder: its checkpoint holds no vision weights, so it reads text only";
  }
  ImageEmbeddings encode_image(const ImagePixels& pixels) override;
  void forward_images(Session& session, std::span<const int32_t> tokens, std::span<const ImageSpan> images,
                      bool all_logits, std::vector<float>& logits) override {
    run(session, tokens, images, all_logits, /*verify=*/false, logits);
  }

  // ---- the MTP draft head (cpu/mtp_forward.h) ----
  bool supports_mtp() const override { return w_->mtp.has_value(); }
  std::span<const float> mtp_hidden(const Session& session, int64_t* pos0) const override {
    const CpuSession& s = own(session);
    TERN_CHECK(supports_mtp(), "cpu runner: the weights have no MTP head");
    if (pos0) *pos0 = s.mtp_hidden_pos0_;
    return s.mtp_hidden_;
  }
  void forward_mtp(Session& session, std::span<const float> hidden, std::span<const int32_t> tokens, int64_t pos0,
                   bool all_logits, std::vector<float>& logits, std::vector<float>& hidden_out) override;
  int64_t mtp_rows(const Session& session) const override { return own(session).mtp_.rows; }

 private:
  // forward (verify false) or forward_verify (true: the Gated DeltaNet layers token by token in the recurrent
  // form, their states after every token kept); `images`: forward_images' spans.
  void run(Session& session, std::span<const int32_t> tokens, std::span<const ImageSpan> images, bool all_logits,
           bool verify, std::vector<float>& logits);
  void dump(const std::string& name, const float* data, std::vector<int64_t> shape) const {
    if (dump_dir_.empty()) return;
    std::filesystem::create_directories(dump_dir_);
    npy_write_f32(std::filesystem::path(dump_dir_) / (name + ".npy"), data, shape);
  }
  const CpuSession& own(const Session& session) const {
    auto* sp = dynamic_cast<const CpuSession*>(&session);
    TERN_CHECK(sp != nullptr && sp->owner_ == this, "cpu runner: the session was not created by this runner");
    return *sp;
  }
  void validate_layer(const LayerWeights& l, LayerType type, const std::string& where) const;
  void validate_mtp() const;
  // logits [rows, V] = lm_head · h [rows, D], padding ids -inf.
  void lm_head_logits(const float* h, int64_t rows, std::vector<float>& logits) const;
  // keep_t > 0: the states after the call's first keep_t tokens also into `kept` (Session::keep_state_at).
  void gdn_layer(int li, CpuSession& s, const float* a, int64_t T, bool verify, int64_t keep_t, CpuSnapshot* kept,
                 float* out);
  // rope_angles: the call's M-RoPE angles when it holds image tokens, else null (positions + the session's delta).
  void attention_layer(int li, CpuSession& s, const float* a, int64_t T, const float* rope_angles, float* out);
  // Layers [l0, l1) over the residual x [T, D] (a, mix: [T, D] scratch); the arguments of gdn_layer and
  // attention_layer.
  void run_layers(CpuSession& s, int l0, int l1, float* x, float* a, float* mix, int64_t T, bool verify, int64_t keep_t,
                  CpuSnapshot* kept, const float* rope_angles);
  CpuSession& own_mut(Session& session) const { return const_cast<CpuSession&>(own(session)); }

  std::shared_ptr<const ModelWeights> w_;
  CpuRunnerOptions opt_;
  std::string dump_dir_;
};

// Every shape the forward pass relies on, checked once, so that a malformed ModelWeights is an error up front and
// never an out-of-bounds read (or a half-updated session) later.
void CpuRunner::validate_layer(const LayerWeights& l, LayerType type, const std::string& where) const {
  const Config& c = w_->config;
  const int64_t D = c.hidden_size;
  auto mat = [&](const Matrix& m, const char* name, int64_t rows, int64_t cols, int64_t experts = 1) {
    TERN_CHECK(!m.empty(), "cpu runner: ", where, " has no ", name);
    TERN_CHECK(m.rows == rows && m.cols == cols && m.experts == experts, "cpu runner: ", where, " ", name, " is [",
               m.experts, ", ", m.rows, ", ", m.cols, "], expected [", experts, ", ", rows, ", ", cols, "]");
    TERN_CHECK(!m.quantized() || (m.group_size > 0 && m.group_size % 8 == 0 && m.cols % m.group_size == 0),
               "cpu runner: ", where, " ", name, " has group size ", m.group_size, " for ", m.cols, " columns");
  };
  auto vec = [&](const std::vector<float>& v, const char* name, int64_t n) {
    TERN_CHECK(int64_t(v.size()) == n, "cpu runner: ", where, " ", name, " has ", v.size(), " values, expected ", n);
  };
  TERN_CHECK(l.type == type, "cpu runner: ", where, " weights do not match the layer type");
  vec(l.input_norm, "input_layernorm", D);
  vec(l.post_attn_norm, "post_attention_layernorm", D);
  if (l.type == LayerType::linear_attention) {
    const int64_t C = c.conv_channels(), HV = int64_t(c.linear_num_value_heads) * c.linear_value_head_dim;
    TERN_CHECK(c.linear_num_key_heads > 0 && c.linear_num_value_heads % c.linear_num_key_heads == 0,
               "cpu runner: ", c.linear_num_value_heads, " value heads do not group over ", c.linear_num_key_heads,
               " key heads");
    mat(l.in_proj_qkv, "in_proj_qkv", C, D);
    mat(l.in_proj_z, "in_proj_z", HV, D);
    mat(l.in_proj_b, "in_proj_b", c.linear_num_value_heads, D);
    mat(l.in_proj_a, "in_proj_a", c.linear_num_value_heads, D);
    mat(l.out_proj, "out_proj", D, HV);
    vec(l.conv1d, "conv1d", C * c.linear_conv_kernel_dim);
    vec(l.A_log, "A_log", c.linear_num_value_heads);
    vec(l.dt_bias, "dt_bias", c.linear_num_value_heads);
    vec(l.gdn_norm, "linear_attn.norm", c.linear_value_head_dim);
  } else {
    const int64_t dh = c.head_dim;
    TERN_CHECK(c.num_key_value_heads > 0 && c.num_attention_heads % c.num_key_value_heads == 0, "cpu runner: ",
               c.num_attention_heads, " query heads do not group over ", c.num_key_value_heads, " KV heads");
    mat(l.q_proj, "q_proj", c.num_attention_heads * 2 * dh, D);
    mat(l.k_proj, "k_proj", c.num_key_value_heads * dh, D);
    mat(l.v_proj, "v_proj", c.num_key_value_heads * dh, D);
    mat(l.o_proj, "o_proj", D, c.num_attention_heads * dh);
    vec(l.q_norm, "q_norm", dh);
    vec(l.k_norm, "k_norm", dh);
  }
  const int E = c.num_experts;
  TERN_CHECK(c.num_experts_per_tok > 0 && c.num_experts_per_tok <= E, "cpu runner: top-", c.num_experts_per_tok,
             " of ", E, " experts");
  mat(l.router, "router", E, D);
  mat(l.expert_gate, "expert gate_proj", c.moe_intermediate_size, D, E);
  mat(l.expert_up, "expert up_proj", c.moe_intermediate_size, D, E);
  mat(l.expert_down, "expert down_proj", D, c.moe_intermediate_size, E);
  mat(l.shared_gate, "shared_expert.gate_proj", c.shared_expert_intermediate_size, D);
  mat(l.shared_up, "shared_expert.up_proj", c.shared_expert_intermediate_size, D);
  mat(l.shared_down, "shared_expert.down_proj", D, c.shared_expert_intermediate_size);
  mat(l.shared_expert_gate, "shared_expert_gate", 1, D);
}

void CpuRunner::validate_mtp() const {
  const MtpWeights& m = *w_->mtp;
  const int64_t D = w_->config.hidden_size;
  validate_layer(m.layer, LayerType::full_attention, "mtp.layers.0");
  TERN_CHECK(!m.fc.empty() && m.fc.experts == 1 && m.fc.rows == D && m.fc.cols == 2 * D, "cpu runner: mtp.fc is [",
             m.fc.rows, ", ", m.fc.cols, "], expected [", D, ", ", 2 * D, "]");
  for (const auto* v : {&m.pre_fc_norm_embedding, &m.pre_fc_norm_hidden, &m.norm})
    TERN_CHECK(int64_t(v->size()) == D, "cpu runner: an MTP norm has ", v->size(), " values, expected ", D);
}

void CpuRunner::lm_head_logits(const float* h, int64_t rows, std::vector<float>& logits) const {
  const int64_t V = w_->config.vocab_size, vr = vocab_real();
  logits.resize(size_t(rows * V));
  matmul(w_->lm_head, h, rows, logits.data());
  for (int64_t r = 0; r < rows; ++r)
    std::fill(logits.begin() + r * V + vr, logits.begin() + (r + 1) * V, -std::numeric_limits<float>::infinity());
}

void CpuRunner::forward_mtp(Session& session, std::span<const float> hidden, std::span<const int32_t> tokens,
                            int64_t pos0, bool all_logits, std::vector<float>& logits, std::vector<float>& hidden_out) {
  TERN_CHECK(supports_mtp(), "cpu runner: the weights have no MTP head");
  CpuSession& s = const_cast<CpuSession&>(own(session));
  const int64_t T = int64_t(tokens.size()), D = w_->config.hidden_size;
  TERN_CHECK(int64_t(hidden.size()) == T * D, "forward_mtp: ", hidden.size(), " hidden values for ", T,
             " tokens of width ", D);
  hidden_out.resize(size_t(T * D));
  mtp_forward({.weights = w_.get(), .cache = &s.mtp_, .capacity = s.capacity_, .hidden = hidden.data(),
               .tokens = tokens, .pos0 = pos0, .out = hidden_out.data()});
  const int64_t first = all_logits ? 0 : T - 1;
  lm_head_logits(hidden_out.data() + first * D, T - first, logits);
}

// a [T, D] normed hidden -> out [T, D] mixer output. verify: one token at a time (the arithmetic of T one-token
// calls), the states after each token kept in st.kept_*. keep_t in (0, T): in two pieces, [0, keep_t) and [keep_t, T)
// (the arithmetic of two calls cut there), the states between them copied into kept's layer li.
void CpuRunner::gdn_layer(int li, CpuSession& s, const float* a, int64_t T, bool verify, int64_t keep_t,
                          CpuSnapshot* kept, float* out) {
  const Config& c = w_->config;
  const LayerWeights& lw = w_->layers[size_t(li)];
  LayerState& st = s.layers_[size_t(li)];
  const GdnDims d{.Hk = c.linear_num_key_heads, .Hv = c.linear_num_value_heads, .dk = c.linear_key_head_dim,
                  .dv = c.linear_value_head_dim};
  const int64_t C = c.conv_channels(), HV = int64_t(d.Hv) * d.dv;
  
  std::vector<float> raw(static_cast<size_t>(T * C)), qkv(static_cast<size_t>(T * C)), z(static_cast<size_t>(T * HV));
  const size_t TH = static_cast<size_t>(T * d.Hv);
  std::vector<float> ga(TH), gb(TH), g(TH), beta(TH);  // [T, Hv] each
  matmul(lw.in_proj_qkv, a, T, raw.data());      // [T, C]
  matmul(lw.in_proj_z, a, T, z.data());          // [T, Hv*dv]
  matmul(lw.in_proj_b, a, T, gb.data());         // [T, Hv]
  matmul(lw.in_proj_a, a, T, ga.data());         // [T, Hv]
  const size_t nc = st.conv_state.size(), ng = st.gdn_state.size();
  if (verify) {  // the states before the first token: rollback to the verify's start
    st.kept_conv.resize((size_t(T) + 1) * nc);
    st.kept_gdn.resize((size_t(T) + 1) * ng);
    std::copy(st.conv_state.begin(), st.conv_state.end(), st.kept_conv.begin());
    std::copy(st.gdn_state.begin(), st.gdn_state.end(), st.kept_gdn.begin());
  }
  const bool keep = !verify && kept && keep_t > 0 && keep_t < T;
  // The pieces the conv and the delta rule run in: one token each (verify), two (keep), else one of T.
  const auto piece_end = [&](int64_t t0) { return verify ? t0 + 1 : keep && t0 < keep_t ? keep_t : T; };
  std::pair<std::vector<float>, std::vector<float>>* const kept_layer = keep ? &kept->layers_[size_t(li)] : nullptr;
  for (int64_t t0 = 0; t0 < T; t0 = piece_end(t0)) {
    const int64_t n = piece_end(t0) - t0;
    conv1d_causal_silu({.x = raw.data() + t0 * C, .T = n, .C = C, .w = lw.conv1d.data(),
                        .Ck = c.linear_conv_kernel_dim, .state = st.conv_state.data(), .y = qkv.data() + t0 * C});
    if (verify)
      std::copy(st.conv_state.begin(), st.conv_state.end(), st.kept_conv.begin() + ptrdiff_t(size_t(t0 + 1) * nc));
    if (keep && t0 + n == keep_t) kept_layer->first = st.conv_state;
  }
  dump(layer_name("gdn_conv", li), qkv.data(), {T, C});
  gdn_qk_norm(qkv.data(), T, d);
  gdn_gates(ga.data(), gb.data(), lw.A_log.data(), lw.dt_bias.data(), T, d.Hv, g.data(), beta.data());
  std::vector<float> core(static_cast<size_t>(T * HV));
  const GdnArgs args{.q = qkv.data(), .k = qkv.data() + int64_t(d.Hk) * d.dk,
                     .v = qkv.data() + 2LL * d.Hk * d.dk, .ld = C, .g = g.data(), .beta = beta.data(), .T = T,
                     .dims = d, .state = st.gdn_state.data(), .out = core.data()};
  for (int64_t t0 = 0; t0 < T; t0 = piece_end(t0)) {
    GdnArgs piece = args;
    piece.q += t0 * C;
    piece.k += t0 * C;
    piece.v += t0 * C;
    piece.g += t0 * d.Hv;
    piece.beta += t0 * d.Hv;
    piece.out += t0 * HV;
    piece.T = piece_end(t0) - t0;
    if (piece.T > 1 && opt_.gdn_chunked)
      gdn_chunked(piece, opt_.gdn_chunk);
    else
      gdn_recurrent(piece);
    if (verify)
      std::copy(st.gdn_state.begin(), st.gdn_state.end(), st.kept_gdn.begin() + ptrdiff_t(size_t(t0 + 1) * ng));
    if (keep && t0 + piece.T == keep_t) kept_layer->second = st.gdn_state;
  }
  dump(layer_name("gdn_core", li), core.data(), {T, d.Hv, d.dv});
  gated_rms_norm(core.data(), z.data(), lw.gdn_norm.data(), T * d.Hv, d.dv, float(c.rms_norm_eps), core.data());
  matmul(lw.out_proj, core.data(), T, out);
}

void CpuRunner::attention_layer(int li, CpuSession& s, const float* a, int64_t T, const float* rope_angles,
                                float* out) {
  const Config& c = w_->config;
  LayerState& st = s.layers_[size_t(li)];
  std::vector<float> core(dump_dir_.empty() ? 0 : size_t(T * c.num_attention_heads * c.head_dim));
  gated_attention({.config = &c, .layer = &w_->layers[size_t(li)],
                   .cache = {.k = st.k_cache.data(), .v = st.v_cache.data(), .capacity = s.allocated_},
                   .pos0 = s.position_, .rope_offset = s.rope_delta_, .rope_angles = rope_angles, .a = a, .T = T,
                   .out = out, .core = core.empty() ? nullptr : core.data()});
  if (!core.empty()) dump(layer_name("attn_core", li), core.data(), {T, c.num_attention_heads, c.head_dim});
}

ImageEmbeddings CpuRunner::encode_image(const ImagePixels& pixels) {
  TERN_CHECK(w_->vision, images_unavailable());
  const VisionWeights& v = *w_->vision;
  const MropeGrid& g = pixels.grid;
  const int64_t tokens = mrope_grid_tokens(g, v.config.spatial_merge_size);
  TERN_CHECK(pixels.patch_dim == v.config.patch_dim() &&
                 int64_t(pixels.values.size()) == g.t * g.h * g.w * pixels.patch_dim,
             "encode_image: ", pixels.values.size(), " pixel values of patch width ", pixels.patch_dim, " for a grid (",
             g.t, ", ", g.h, ", ", g.w, ") of patches of width ", v.config.patch_dim());
  ImageEmbeddings out;
  out.grid = g;
  out.tokens = tokens;
  out.values = vision_encode(v, pixels.values.data(), g.t * g.h * g.w, pixels.patch_dim, {{g.t, g.h, g.w}});
  return out;
}

void CpuRunner::run(Session& session, std::span<const int32_t> tokens, std::span<const ImageSpan> images,
                    bool all_logits, bool verify, std::vector<float>& logits) {
  auto* sp = dynamic_cast<CpuSession*>(&session);
  TERN_CHECK(sp != nullptr && sp->owner_ == this, "cpu forward: the session was not created by this runner");
  CpuSession& s = *sp;
  const int64_t keep_at = std::exchange(s.keep_at_, -1);  // this call's, whether it runs or throws
  const Config& c = w_->config;
  const int64_t T = int64_t(tokens.size()), D = c.hidden_size;
  TERN_CHECK(T > 0, "cpu forward: no tokens");
  TERN_CHECK(s.position_ + T <= s.capacity_, "the session holds ", s.position_, " tokens; ", T,
             " more would exceed its capacity of ", s.capacity_, " tokens");
  const float eps = float(c.rms_norm_eps);

  std::vector<float> x(static_cast<size_t>(T * D)), a(static_cast<size_t>(T * D)), mix(static_cast<size_t>(T * D));
  // A chunk run part way (forward_layers): its rows go on from the layer it stopped at.
  int l0 = 0;
  if (s.part_way_) {
    TERN_CHECK(!verify && images.empty() && std::ranges::equal(tokens, s.part_way_->tokens),
               "cpu forward: the session holds a prompt chunk part way; its next forward must carry that chunk");
    x.swap(s.part_way_->x);
    l0 = s.part_way_->done;
    s.part_way_.reset();
  } else {
    embed_lookup(w_->embed, tokens, x.data());  // throws on a bad id before any state changes
  }
  // Image tokens: their rows from the encoder, their rotary angles from the 3-axis positions (checked up front too).
  ImageTokenRope rope;
  if (!images.empty()) {
    TERN_CHECK(w_->vision, images_unavailable());
    image_spans_check(images, T, D, w_->vision->config.spatial_merge_size);
    image_embeddings_insert(images, D, x.data());
    rope = image_token_rope(c, s.position_, s.rope_delta_, T, images);
  }
  s.reserve_kv(c, s.position_ + T);
  s.drop_kept();
  // Session::keep_state_at: the states after keep_t of the call's tokens (text only) into a snapshot.
  const int64_t keep_t = l0 == 0 && !verify && images.empty() && keep_at > s.position_ && keep_at < s.position_ + T
                             ? keep_at - s.position_
                             : -1;
  std::unique_ptr<CpuSnapshot> kept;
  if (keep_t > 0) {
    kept = std::make_unique<CpuSnapshot>();
    kept->owner_ = this;
    kept->position_ = keep_at;
    kept->rope_delta_ = s.rope_delta_;
    kept->layers_.resize(s.layers_.size());  // the Gated DeltaNet layers' filled by gdn_layer
  }
  if (l0 == 0) dump("embed", x.data(), {T, D});
  run_layers(s, l0, int(w_->layers.size()), x.data(), a.data(), mix.data(), T, verify, keep_t, kept.get(),
             images.empty() ? nullptr : rope.angles.data());
  if (w_->mtp) {  // the MTP head's input: every token's hidden after the final norm
    std::vector<float> h(static_cast<size_t>(T * D));
    rms_norm(x.data(), w_->final_norm.data(), T, D, eps, h.data());
    s.keep_mtp_hidden(h.data(), s.position_, T, D);
    if (kept) kept->mtp_hidden_.assign(h.begin() + (keep_t - 1) * D, h.begin() + keep_t * D);  // at keep_at - 1
  }
  if (kept) {
    for (const LayerState& l : s.layers_) {
      kept->sizes_.emplace_back(l.conv_state.size(), l.gdn_state.size());
      kept->elems_ += l.conv_state.size() + l.gdn_state.size();
    }
    s.kept_snap_ = std::move(kept);
  }
  if (verify) s.kept_from_ = s.position_;
  s.position_ += T;
  if (!images.empty()) s.rope_delta_ = rope.delta_after;

  const int64_t first = all_logits ? 0 : T - 1, rows = T - first;
  rms_norm(x.data() + first * D, w_->final_norm.data(), rows, D, eps, a.data());
  dump("final_norm", a.data(), {rows, D});
  lm_head_logits(a.data(), rows, logits);
}

void CpuRunner::run_layers(CpuSession& s, int l0, int l1, float* x, float* a, float* mix, int64_t T, bool verify,
                           int64_t keep_t, CpuSnapshot* kept, const float* rope_angles) {
  const Config& c = w_->config;
  const int64_t D = c.hidden_size;
  const float eps = float(c.rms_norm_eps);
  for (int li = l0; li < l1; ++li) {
    const LayerWeights& lw = w_->layers[size_t(li)];
    rms_norm(x, lw.input_norm.data(), T, D, eps, a);
    dump(layer_name("attn_norm", li), a, {T, D});
    if (c.layer_types[size_t(li)] == LayerType::linear_attention)
      gdn_layer(li, s, a, T, verify, keep_t, kept, mix);
    else
      attention_layer(li, s, a, T, rope_angles, mix);
    dump(layer_name("attn_out", li), mix, {T, D});
    add_inplace(x, mix, T * D);
    rms_norm(x, lw.post_attn_norm.data(), T, D, eps, a);
    dump(layer_name("moe_norm", li), a, {T, D});
    std::vector<int32_t> ids(dump_dir_.empty() ? 0 : size_t(T * c.num_experts_per_tok));
    moe_forward({.layer = &lw, .config = &c, .x = a, .T = T, .y = mix, .ids = ids.empty() ? nullptr : ids.data()});
    dump(layer_name("moe_out", li), mix, {T, D});
    if (!ids.empty()) {
      const std::vector<float> idf(ids.begin(), ids.end());
      dump(layer_name("route_ids", li), idf.data(), {T, c.num_experts_per_tok});
    }
    add_inplace(x, mix, T * D);
    dump(layer_name("layer_out", li), x, {T, D});
  }
}

// The first piece embeds the tokens and keeps the states it will change (drop_pending_layers); each piece runs its
// layers over the rows the last one left, exactly as run() would in one call.
void CpuRunner::forward_layers(Session& session, std::span<const int32_t> tokens, int layers) {
  CpuSession& s = own_mut(session);
  const Config& c = w_->config;
  const int64_t T = int64_t(tokens.size()), D = c.hidden_size;
  const int L = int(w_->layers.size());
  const int done = s.part_way_ ? s.part_way_->done : 0;
  TERN_CHECK(layers >= 1 && done + layers < L, "cpu forward_layers: ", layers, " more layers of a chunk at layer ", done,
             " of ", L, " (the last layers run in a forward call)");
  if (s.part_way_) {
    TERN_CHECK(std::ranges::equal(tokens, s.part_way_->tokens),
               "cpu forward_layers: the session holds another prompt chunk part way");
  } else {
    TERN_CHECK(runs_layers_apart(session, T), "cpu forward_layers: a chunk of ", T, " tokens does not run in pieces");
    TERN_CHECK(s.position_ + T <= s.capacity_, "the session holds ", s.position_, " tokens; ", T,
               " more would exceed its capacity of ", s.capacity_, " tokens");
    CpuSession::PartWay pw;
    pw.x.resize(size_t(T * D));
    embed_lookup(w_->embed, tokens, pw.x.data());  // throws on a bad id before any state changes
    pw.tokens.assign(tokens.begin(), tokens.end());
    for (const LayerState& l : s.layers_) pw.gdn_before.emplace_back(l.conv_state, l.gdn_state);
    s.reserve_kv(c, s.position_ + T);
    s.drop_kept();
    dump("embed", pw.x.data(), {T, D});
    s.part_way_ = std::move(pw);
  }
  std::vector<float> a(size_t(T * D)), mix(size_t(T * D));
  run_layers(s, done, done + layers, s.part_way_->x.data(), a.data(), mix.data(), T, false, -1, nullptr, nullptr);
  s.part_way_->done = done + layers;
}

}  // namespace

std::vector<float> cpu_session_gdn_states(const Session& session) {
  const auto* s = dynamic_cast<const CpuSession*>(&session);
  TERN_CHECK(s != nullptr, "cpu_session_gdn_states: not a CPU session");
  std::vector<float> out;
  for (const LayerState& l : s->layers_) {
    out.insert(out.end(), l.conv_state.begin(), l.conv_state.end());
    out.insert(out.end(), l.gdn_state.begin(), l.gdn_state.end());
  }
  return out;
}

std::unique_ptr<ModelRunner> cpu_runner_create(std::shared_ptr<const ModelWeights> weights) {
  return cpu_runner_create(std::move(weights), CpuRunnerOptions{});
}

std::unique_ptr<ModelRunner> cpu_runner_create(std::shared_ptr<const ModelWeights> weights,
                                               const CpuRunnerOptions& options) {
  return std::make_unique<CpuRunner>(std::move(weights), options);
}

}  // namespace tern
