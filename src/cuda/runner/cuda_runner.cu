#include "cuda/runner/cuda_runner.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/kernels/attention/attention.cuh"
#include "cuda/kernels/conv1d/conv1d.cuh"
#include "cuda/kernels/gdn/gdn.cuh"
#include "cuda/kernels/moe/moe.cuh"
#include "cuda/kernels/moe/moe_decode.cuh"
#include "cuda/kernels/norm/norm.cuh"
#include "cuda/kernels/qmatmul/qmatmul.cuh"
#include "cuda/kernels/qmatmul/qmatmul_int8.cuh"
#include "cuda/kernels/qmatmul/qmatmul_wgmma.cuh"
#include "cuda/kernels/qmv/qmv.cuh"
#include "cuda/kernels/sampling/sampling.cuh"
#include "cuda/kernels/token_mask/token_mask.cuh"
#include "cuda/runner/activation_dump.cuh"
#include "cuda/runner/step_timer.cuh"
#include "cuda/weights/device_weights.cuh"

namespace tern {
namespace {

using namespace tern::cuda;

__global__ void advance_position_kernel(int* pos, int n) { *pos += n; }

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
  size_t size;
  uint8_t* dev = nullptr;
  uint8_t* host = nullptr;

 private:
  std::shared_ptr<SnapshotBuffers> buffers_;
};

// Bytes of a session's Gated DeltaNet states (every linear-attention layer's conv and recurrent state): a snapshot.
size_t gdn_state_bytes_of(const DeviceWeights& w) {
  const Config& c = w.config;
  const int64_t conv_elems = int64_t(c.linear_conv_kernel_dim - 1) * c.conv_channels();
  const int64_t rec_elems = int64_t(c.linear_num_value_heads) * c.linear_value_head_dim * c.linear_key_head_dim;
  size_t bytes = 0;
  for (const DeviceLayer& l : w.layers)
    if (l.type != LayerType::full_attention) bytes += size_t(conv_elems) * 4 + size_t(rec_elems) * 4;
  return bytes;
}

class CudaSession final : public Session {
 public:
  CudaSession(const DeviceWeights& w, int64_t capacity, const void* owner, uint64_t id,
              std::shared_ptr<SnapshotBuffers> snapshot_buffers)
      : owner(owner), id(id), capacity_(capacity), snapshot_buffers_(std::move(snapshot_buffers)) {
    const Config& c = w.config;
    kv_heads = c.num_key_value_heads;
    head_dim = c.head_dim;
    const int64_t kv_elems = int64_t(c.num_key_value_heads) * capacity * c.head_dim;
    const int64_t conv_elems = int64_t(c.linear_conv_kernel_dim - 1) * c.conv_channels();
    const int64_t rec_elems = int64_t(c.linear_num_value_heads) * c.linear_value_head_dim * c.linear_key_head_dim;
    size_t bytes = DeviceArena::align(sizeof(int));
    for (const DeviceLayer& l : w.layers)
      bytes += l.type == LayerType::full_attention ? 2 * DeviceArena::align(size_t(kv_elems) * 2)
                                                   : DeviceArena::align(size_t(conv_elems) * 4) +
                                                         DeviceArena::align(size_t(rec_elems) * 4);
    arena = DeviceArena(bytes, "session caches");
    d_pos = arena.take_n<int>(1);
    for (const DeviceLayer& l : w.layers) {
      LayerCache lc;
      if (l.type == LayerType::full_attention) {
        lc.k = arena.take_n<uint16_t>(size_t(kv_elems));
        lc.v = arena.take_n<uint16_t>(size_t(kv_elems));
      } else {
        lc.conv = arena.take_n<float>(size_t(conv_elems));
        lc.rec = arena.take_n<float>(size_t(rec_elems));
        lc.conv_bytes = size_t(conv_elems) * 4;
        lc.rec_bytes = size_t(rec_elems) * 4;
      }
      layers.push_back(lc);
    }
    reset();
  }
  int64_t position() const override { return pos; }
  int64_t capacity() const override { return capacity_; }
  void reset() override {
    TERN_CUDA(cudaDeviceSynchronize());
    for (const LayerCache& lc : layers) {
      if (lc.conv) TERN_CUDA(cudaMemset(lc.conv, 0, lc.conv_bytes));
      if (lc.rec) TERN_CUDA(cudaMemset(lc.rec, 0, lc.rec_bytes));
    }
    TERN_CUDA(cudaMemset(d_pos, 0, sizeof(int)));
    TERN_CUDA(cudaDeviceSynchronize());
    pos = 0;
  }

  // Prefix reuse (runner.h). The runner's stream is non-blocking: synchronize the device before and after the
  // copies (plain cudaMemcpy on the legacy stream), so that no kernel of the runner races them. Buffers never
  // move, so the decode graph bound to this session stays valid.
  bool can_snapshot() const override { return true; }
  size_t gdn_state_bytes() const {
    size_t bytes = 0;
    for (const LayerCache& lc : layers) bytes += lc.conv_bytes + lc.rec_bytes;
    return bytes;
  }
  std::unique_ptr<StateSnapshot> snapshot() const override {
    TERN_CUDA(cudaDeviceSynchronize());
    TERN_CHECK(snapshot_buffers_->bytes() == gdn_state_bytes(), "cuda snapshot: buffers of ", snapshot_buffers_->bytes(),
               " bytes for states of ", gdn_state_bytes());
    auto snap = std::make_unique<CudaSnapshot>(owner, pos, snapshot_buffers_);
    const cudaStream_t cs = snapshot_buffers_->stream();
    uint8_t* p = snap->dev;
    for (const LayerCache& lc : layers) {
      if (lc.conv) TERN_CUDA(cudaMemcpyAsync(p, lc.conv, lc.conv_bytes, cudaMemcpyDeviceToDevice, cs));
      p += lc.conv_bytes;
      if (lc.rec) TERN_CUDA(cudaMemcpyAsync(p, lc.rec, lc.rec_bytes, cudaMemcpyDeviceToDevice, cs));
      p += lc.rec_bytes;
    }
    TERN_CUDA(cudaStreamSynchronize(cs));
    return snap;
  }
  void restore(const StateSnapshot& snapshot) override {
    const auto* snap = dynamic_cast<const CudaSnapshot*>(&snapshot);
    TERN_CHECK(snap != nullptr && snap->owner == owner, "cuda restore: the snapshot was not made by this runner");
    TERN_CHECK(snap->pos <= capacity_, "cuda restore: the snapshot is at ", snap->pos,
               " tokens, over this session's capacity of ", capacity_);
    TERN_CHECK(snap->size == gdn_state_bytes(), "cuda restore: the snapshot holds ", snap->size,
               " bytes, the session's states ", gdn_state_bytes());
    TERN_CUDA(cudaDeviceSynchronize());
    const cudaStream_t cs = snapshot_buffers_->stream();
    const uint8_t* p = snap->data();  // device, or pinned host memory
    for (const LayerCache& lc : layers) {
      if (lc.conv) TERN_CUDA(cudaMemcpyAsync(lc.conv, p, lc.conv_bytes, cudaMemcpyDefault, cs));
      p += lc.conv_bytes;
      if (lc.rec) TERN_CUDA(cudaMemcpyAsync(lc.rec, p, lc.rec_bytes, cudaMemcpyDefault, cs));
      p += lc.rec_bytes;
    }
    TERN_CUDA(cudaStreamSynchronize(cs));
    const int p32 = int(snap->pos);
    TERN_CUDA(cudaMemcpy(d_pos, &p32, sizeof(int), cudaMemcpyHostToDevice));
    TERN_CUDA(cudaDeviceSynchronize());
    pos = snap->pos;
  }
  void copy_kv_prefix(const Session& from, int64_t n) override {
    const auto* src = dynamic_cast<const CudaSession*>(&from);
    TERN_CHECK(src != nullptr && src->owner == owner, "cuda copy_kv_prefix: the session was not made by this runner");
    TERN_CHECK(n >= 0 && n <= src->capacity_ && n <= capacity_, "cuda copy_kv_prefix: ", n,
               " rows from a session of capacity ", src->capacity_, " into one of ", capacity_);
    if (src == this || n == 0) return;
    TERN_CUDA(cudaDeviceSynchronize());
    const size_t row = size_t(head_dim) * 2, width = size_t(n) * row;  // 16-bit rows of [Hkv, capacity, dh]
    for (size_t i = 0; i < layers.size(); ++i) {
      if (!layers[i].k) continue;
      TERN_CUDA(cudaMemcpy2D(layers[i].k, size_t(capacity_) * row, src->layers[i].k, size_t(src->capacity_) * row,
                             width, size_t(kv_heads), cudaMemcpyDeviceToDevice));
      TERN_CUDA(cudaMemcpy2D(layers[i].v, size_t(capacity_) * row, src->layers[i].v, size_t(src->capacity_) * row,
                             width, size_t(kv_heads), cudaMemcpyDeviceToDevice));
    }
    TERN_CUDA(cudaDeviceSynchronize());
  }

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
};

// x [T, cols] prepared once for the products that read it. main: the layout of the 4-bit products' kernel (fp16
// with a per-token scale for the Hopper warpgroup kernel, or bf16 hi + lo with TERN_PREFILL_WGMMA=2; 16 bits for the
// integer kernel; split into bf16 hi + lo with TERN_PREFILL_INT8=0); q16: the integer kernel's layout for 8-bit
// matrices (the router and shared-expert gate), the same buffer as main when the integer kernel runs everything.
struct PreparedX {
  const void* main = nullptr;
  const void* q16 = nullptr;
  bool split = false;  // main holds bf16 hi + lo (matmul_prepare_x), not fp16, under the fp16 plan
};

// The prefill plan's product inputs, for choosing which take x as fp16 on Hopper (TERN_PREFILL_F16_SITES).
enum PrefillSite : int { kGdnIn = 1, kAttnIn = 2, kMixerOut = 4, kMoeIn = 8, kMoeDown = 16, kAllSites = 31 };

class CudaRunner final : public ModelRunner {
 public:
  CudaRunner(std::unique_ptr<DeviceWeights> w, std::shared_ptr<const ModelWeights> host, const CudaRunnerOptions& o)
      : w_(std::move(w)), host_(std::move(host)), max_chunk_(std::max<int64_t>(1, o.max_chunk)) {
    TERN_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    allocate_scratch();
    TERN_CUDA(cudaMallocHost(&pinned_, 256));
    use_graphs_ = !env_is("TERN_CUDA_GRAPHS", "0");
    // TERN_CUDA_FP32=1: the prefill plan's matrix products and chunked Gated DeltaNet on the fp32 SIMT kernels
    // (slow; for locating precision differences).
    fp32_prefill_ = env_is("TERN_CUDA_FP32", "1");
    // TERN_PREFILL_INT8=0: the prefill products on the split-x bf16 tensor-core kernel instead of the integer one.
    // TERN_PREFILL_WGMMA=0: the integer kernel for the 4-bit products on Hopper too; 2: the warpgroup kernel with x as
    // bf16 hi + lo (twice the tensor work, 16 significant bits) instead of one fp16 term (11).
    if (env_is("TERN_PREFILL_INT8", "0")) {
      prefill_kernel_ = PrefillKernel::split;
    } else if (!env_is("TERN_PREFILL_WGMMA", "0") && !o.exact_prefill && matmul_wgmma_available()) {
      prefill_kernel_ = env_is("TERN_PREFILL_WGMMA", "2") ? PrefillKernel::wgmma_split : PrefillKernel::wgmma_f16;
    } else {
      prefill_kernel_ = PrefillKernel::int8;
    }
    // TERN_PREFILL_EXACT_GATES=0: the GDN gate products (b, a) on the fp16 kernel too.
    exact_gates_ = prefill_kernel_ == PrefillKernel::wgmma_f16 && !env_is("TERN_PREFILL_EXACT_GATES", "0");
    // TERN_PREFILL_F16_SITES (a bit mask of PrefillSite, default 30): the inputs that take x as fp16 under the fp16
    // plan; the others take bf16 hi + lo (16 significant bits) on the same kernel. The GDN in_proj's input stays off
    // fp16 by default: against transformers (8 layers, 640 positions, two seeds) it alone moved the prefill's mean KL
    // from ~4.1e-4 to ~0.9e-4 nats (one fp16 run reached 1.4e-3, over the 1e-3 bar), for ~4% of a 4K prefill.
    if (const char* e = std::getenv("TERN_PREFILL_F16_SITES")) f16_sites_ = std::atoi(e) & kAllSites;
    // TERN_PREFILL_F16_MIN_TOKENS (default 512): chunks of fewer tokens take bf16 hi + lo at every site. The fp16
    // error concentrates at a sequence's first positions (8 layers against transformers, one seed: 63-65-token
    // prompts mean KL ~8e-4 and perplexity +1.3% on fp16, ~1e-4 and < 0.1% on hi + lo; the same model's 640-token
    // prompt 1.6e-4, +0.08%), and a short chunk is where fp16 saves the least time.
    if (const char* e = std::getenv("TERN_PREFILL_F16_MIN_TOKENS")) f16_min_tokens_ = std::max<int64_t>(0, std::atoll(e));
    if (o.f16_min_tokens >= 0) f16_min_tokens_ = o.f16_min_tokens;
    use_decode_kernels_ = !env_is("TERN_CUDA_DECODE_KERNELS", "0");
    // The KV cache in fp16 (11 significant bits) unless TERN_KV_BF16=1 or the option asks for bf16 (8 bits).
    kv_f16_ = o.kv_f16 && !env_is("TERN_KV_BF16", "1");
    // TERN_L2_PREFETCH (a bit mask, default 12 = both; the one-token decode plan on Hopper; l2_prefetch.cuh): 4 the MoE
    // gate_up asks L2 for the chosen experts' down matrices; 8 each mixer's output projection for the next layer's
    // first projection; 0 neither.
    if (const char* e = std::getenv("TERN_L2_PREFETCH")) l2_prefetch_ = std::atoi(e) & 12;
    allocate_decode_scratch();
    attention_init();  // kernel attributes set once, outside any graph capture
    // A head shape the attention kernels do not take is refused at load, not at the first step.
    if (std::any_of(w_->layers.begin(), w_->layers.end(),
                    [](const DeviceLayer& l) { return l.type == LayerType::full_attention; }))
      attention_check(attn_dims(1, 1));
  }
  ~CudaRunner() override {
    cudaStreamSynchronize(stream_);
    if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
    if (mask_graph_exec_) cudaGraphExecDestroy(mask_graph_exec_);  // token mask (constrained decoding)
    if (mask_pinned_) cudaFreeHost(mask_pinned_);
    if (mask_device_) cudaFree(mask_device_);
    cudaFreeHost(pinned_);
    cudaStreamDestroy(stream_);
  }

  std::string backend_name() const override { return "cuda"; }
  void set_activation_dump_dir(const std::string& dir) override { dump_.set_dir(dir); }
  const Config& config() const override { return w_->config; }
  int64_t vocab_real() const override { return w_->vocab_real; }
  // The forward chunk: a 4K prompt in one call instead of two of 2K (H200: 225 against 257 ms).
  int64_t preferred_prefill_chunk() const override { return max_chunk_; }
  int64_t weight_bytes() const { return w_->bytes; }

  std::unique_ptr<Session> create_session(int64_t max_context) override {
    TERN_CHECK(max_context > 0, "session capacity must be positive, got ", max_context);
    TERN_CHECK(max_context < (int64_t(1) << 31), "session capacity ", max_context, " is too large");
    if (!snapshot_buffers_) snapshot_buffers_ = std::make_shared<SnapshotBuffers>(gdn_state_bytes_of(*w_));
    return std::make_unique<CudaSession>(*w_, max_context, this, ++session_ids_, snapshot_buffers_);
  }

  void forward(Session& session, std::span<const int32_t> tokens, bool all_logits, std::vector<float>& logits) override {
    CudaSession& s = own(session);
    check_tokens(s, tokens);
    const int64_t V = w_->config.vocab_size, n = int64_t(tokens.size());
    logits.assign(size_t((all_logits ? n : 1) * V), 0.0f);
    for (int64_t c0 = 0; c0 < n; c0 += max_chunk_) {
      const int64_t T = std::min(max_chunk_, n - c0);
      run_chunk(s, tokens.subspan(size_t(c0), size_t(T)));
      if (all_logits) {
        lm_head_rows(0, T, logits.data() + c0 * V);
      } else if (c0 + T == n) {
        lm_head_rows(T - 1, 1, logits.data());
      }
    }
    TERN_CUDA(cudaStreamSynchronize(stream_));
  }

  std::optional<int32_t> forward_sample(Session& session, std::span<const int32_t> tokens,
                                        const DeviceSampling& sampling) override {
    CudaSession& s = own(session);
    check_tokens(s, tokens);
    sample_check(sampling);
    const int64_t n = int64_t(tokens.size());
    const int64_t V = w_->config.vocab_size;
    // The first decode step runs eagerly: kernels set their one-time attributes outside any graph capture.
    if (n == 1 && use_graphs_ && decode_warm_) return decode_graph_step(s, tokens[0], sampling);
    if (n == 1) decode_warm_ = true;
    for (int64_t c0 = 0; c0 < n; c0 += max_chunk_) {
      const int64_t T = std::min(max_chunk_, n - c0);
      run_chunk(s, tokens.subspan(size_t(c0), size_t(T)));
      if (c0 + T == n) lm_head_device(T - 1, 1);
    }
    apply_step_mask(sampling);  // token mask: filled on the host while the forward above runs
    sample_token(logits_, V, sampling, sample_scratch_, sample_out_, stream_);
    params_valid_ = false;  // sample_token wrote its own copy of the parameters
    int32_t id = 0;
    TERN_CUDA(cudaMemcpyAsync(&id, sample_out_, sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
    TERN_CUDA(cudaStreamSynchronize(stream_));
    return id;
  }

 private:
  static constexpr int64_t kLmRows = 128;  // logits rows computed at a time

  CudaSession& own(Session& session) {
    auto* s = dynamic_cast<CudaSession*>(&session);
    TERN_CHECK(s && s->owner == this, "this session was created by another runner");
    return *s;
  }

  void check_tokens(const CudaSession& s, std::span<const int32_t> tokens) {
    TERN_CHECK(!tokens.empty(), "forward needs at least one token");
    TERN_CHECK(s.pos + int64_t(tokens.size()) <= s.capacity(), "context full: ", s.pos, " + ", tokens.size(),
               " tokens exceed the session capacity of ", s.capacity());
    const int64_t V = w_->config.vocab_size;
    for (int32_t t : tokens) TERN_CHECK(t >= 0 && t < V, "token id ", t, " out of range [0, ", V, ")");
  }

  void allocate_scratch() {
    const Config& c = w_->config;
    const int64_t T = max_chunk_, D = c.hidden_size, C = c.conv_channels();
    const int64_t Hv = c.linear_num_value_heads, dv = c.linear_value_head_dim;
    const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, dh = c.head_dim;
    const int E = c.num_experts, k = c.num_experts_per_tok;
    const int64_t F = c.moe_intermediate_size, Fs = c.shared_expert_intermediate_size, V = c.vocab_size;
    const int64_t mixer_gdn = T * (2 * C + 3 * Hv * dv + 4 * Hv);
    const int64_t attn_parts = attn_partial_floats(T, int(Hq), int(dh));  // split-KV partials of the decode plan
    const int64_t mixer_attn = T * (Hq * 2 * dh + 2 * Hkv * dh + 2 * Hq * dh) + attn_parts;
    const int64_t floats = 2 * T * D + std::max(mixer_gdn, mixer_attn) + T * E + T * k + T +
                           T * k * (2 * F + D) + T * (2 * Fs + D) + kLmRows * V + sample_scratch_floats(V);
    const int64_t ints = T + T * k + moe_group_ints(T, E, k) + 1;
    // The split activations of every prefill product input: normed x, the GDN and attention outputs, h of the experts.
    prep_bytes_ = size_t(std::max({matmul_prepared_bytes(T, D), matmul_prepared_bytes(T, Hv * dv),
                                   matmul_prepared_bytes(T, Hq * dh), matmul_prepared_bytes(T * k, F)}));
    prep_q16_bytes_ = size_t(matmul_q16_bytes(T, D));
    scratch_ = DeviceArena(size_t(floats) * 4 + size_t(ints) * 4 + prep_bytes_ + prep_q16_bytes_ + 64 * 256,
                           "activation scratch");
    hidden_ = scratch_.take_n<float>(size_t(T * D));
    normed_ = scratch_.take_n<float>(size_t(T * D));
    float* mixer = scratch_.take_n<float>(size_t(std::max(mixer_gdn, mixer_attn)));
    // Gated DeltaNet view of the mixer scratch.
    qkv_raw_ = mixer;
    conv_out_ = qkv_raw_ + T * C;
    z_ = conv_out_ + T * C;
    o_ = z_ + T * Hv * dv;
    gated_ = o_ + T * Hv * dv;
    b_ = gated_ + T * Hv * dv;
    a_ = b_ + T * Hv;
    g_ = a_ + T * Hv;
    beta_ = g_ + T * Hv;
    // Attention view of the same scratch.
    qg_ = mixer;
    k_ = qg_ + T * Hq * 2 * dh;
    v_ = k_ + T * Hkv * dh;
    q_ = v_ + T * Hkv * dh;
    attn_out_ = q_ + T * Hq * dh;
    attn_part_ = attn_out_ + T * Hq * dh;
    router_logits_ = scratch_.take_n<float>(size_t(T * E));
    route_w_ = scratch_.take_n<float>(size_t(T * k));
    shared_logit_ = scratch_.take_n<float>(size_t(T));
    hg_ = scratch_.take_n<float>(size_t(T * k * F));
    hu_ = scratch_.take_n<float>(size_t(T * k * F));
    yd_ = scratch_.take_n<float>(size_t(T * k * D));
    yd_bytes_ = size_t(T * k * D) * 4;
    prep_ = scratch_.take(prep_bytes_);
    prep_q16_ = scratch_.take(prep_q16_bytes_);
    sg_ = scratch_.take_n<float>(size_t(T * Fs));
    su_ = scratch_.take_n<float>(size_t(T * Fs));
    ys_ = scratch_.take_n<float>(size_t(T * D));
    logits_ = scratch_.take_n<float>(size_t(kLmRows * V));
    sample_scratch_ = scratch_.take_n<float>(size_t(sample_scratch_floats(V)));
    tokens_ = scratch_.take_n<int>(size_t(T));
    route_ids_ = scratch_.take_n<int>(size_t(T * k));
    int* group_scratch = scratch_.take_n<int>(size_t(moe_group_ints(T, E, k)));
    groups_ = moe_groups_view(group_scratch, T, E, k);
    sample_out_ = scratch_.take_n<int>(1);
  }

  // The decode plan's buffers: the fused input projection's output and the MoE block's scratch, for up to
  // kQmvMaxTokens tokens; and the per-layer MoE weight bundles.
  void allocate_decode_scratch() {
    const Config& c = w_->config;
    const int T = kQmvMaxTokens;
    const int64_t D = c.hidden_size, C = c.conv_channels(), Hv = c.linear_num_value_heads;
    const int64_t dv = c.linear_value_head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, dh = c.head_dim;
    proj_cols_ = std::max(C + Hv * dv + 2 * Hv, Hq * 2 * dh + 2 * Hkv * dh);
    const size_t moe_bytes = moe_decode_scratch_bytes(T, D, c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size);
    decode_scratch_ = DeviceArena(size_t(T * proj_cols_) * 4 + moe_bytes + 2 * 256, "decode scratch");
    proj_ = decode_scratch_.take_n<float>(size_t(T * proj_cols_));
    moe_scratch_ = moe_decode_scratch_view(decode_scratch_.take(moe_bytes), T, D, c.num_experts, c.num_experts_per_tok,
                                           c.moe_intermediate_size);
    moe_decode_scratch_init(moe_scratch_, stream_);
    for (const DeviceLayer& l : w_->layers) {
      MoeDecodeWeights m;
      m.norm_w = l.post_attn_norm;
      m.eps = float(c.rms_norm_eps);
      m.router = l.router;
      m.shared_expert_gate = l.shared_expert_gate;
      m.expert_gate = l.expert_gate;
      m.expert_up = l.expert_up;
      m.expert_down = l.expert_down;
      m.shared_gate = l.shared_gate;
      m.shared_up = l.shared_up;
      m.shared_down = l.shared_down;
      m.top_k = c.num_experts_per_tok;
      m.prefetch_down = l2_prefetch_ & 4;
      moe_w_.push_back(m);
    }
    plan_l2_prefetch();
    TERN_CUDA(cudaStreamSynchronize(stream_));
  }

  // What each mixer's one-token output projection asks L2 for (TERN_L2_PREFETCH bit 8): the next layer's first
  // projection (in_proj_all or attn_qkv), read ~20 µs later, after the MoE block.
  void plan_l2_prefetch() {
    const size_t L = w_->layers.size();
    l2_output_ahead_.assign(L, {});
    if (!(l2_prefetch_ & 8)) return;
    for (size_t i = 0; i + 1 < L; ++i) {
      const DeviceLayer& n = w_->layers[i + 1];
      const DMat& m = n.type == LayerType::linear_attention ? n.in_proj_all : n.attn_qkv;
      if (m.empty() || m.format != WeightFormat::affine4) continue;
      L2Ranges& r = l2_output_ahead_[i];
      r.add(m.data, m.rows * m.row_words * 4);
      r.add(m.scales, m.rows * m.groups_per_row * 2);
      r.add(m.biases, m.rows * m.groups_per_row * 2);
    }
  }

  GdnDims gdn_dims(int64_t T) const {
    const Config& c = w_->config;
    GdnDims d;
    d.T = T;
    d.Hk = c.linear_num_key_heads;
    d.Hv = c.linear_num_value_heads;
    d.dk = c.linear_key_head_dim;
    d.dv = c.linear_value_head_dim;
    return d;
  }
  AttnDims attn_dims(int64_t T, int64_t capacity) const {
    const Config& c = w_->config;
    AttnDims d;
    d.T = T;
    d.Hq = c.num_attention_heads;
    d.Hkv = c.num_key_value_heads;
    d.dh = c.head_dim;
    d.rot = c.rotary_dims();
    d.theta = float(c.rope_theta);
    d.eps = float(c.rms_norm_eps);
    d.capacity = capacity;
    d.kv_f16 = kv_f16_;
    return d;
  }

  // Chunks of at most this many tokens run the decode plan (fused decode kernels); longer ones the prefill plan.
  bool decode_plan(int64_t T) const {
    return use_decode_kernels_ && T <= std::min<int64_t>(kQmvMaxTokens, max_chunk_) &&
           w_->config.shared_expert_intermediate_size == w_->config.moe_intermediate_size;
  }

  // y [T, w.rows] (row stride ldy) (+)= x̂ · Wᵀ with x̂ = x or RMSNorm(x)·norm_w (x [T, w.cols], row stride ldx).
  // ahead: ranges to ask L2 for on behalf of later kernels (one token only).
  void qmv_into(const DMat& w, const float* x, int64_t ldx, int64_t T, const float* norm_w, float* y, int64_t ldy,
                bool accumulate = false, const L2Ranges& ahead = {}) {
    QmvArgs a;
    if (T == 1) a.l2_ahead = ahead;
    a.w = w;
    a.x = x;
    a.ldx = ldx;
    a.T = int(T);
    a.norm_w = norm_w;
    a.eps = float(w_->config.rms_norm_eps);
    a.y = y;
    a.ldy = ldy;
    a.accumulate = accumulate;
    qmv(a, stream_);
  }

  // y [T, rows] (+)= x [T, cols] · Wᵀ
  // prep: x prepared by prepare_x (the kernels read it instead of converting x in every block); exact: the product
  // takes prep.q16 (the integer kernel's 16-bit x) whenever it is there.
  void proj(const DMat& w, const float* x, int64_t T, float* y, bool accumulate = false, const PreparedX& prep = {},
            bool exact = false) {
    if (T == 1) {
      GemvArgs a;
      a.w = w;
      a.x = x;
      a.y = y;
      a.accumulate = accumulate;
      gemv(a, stream_);
    } else {
      MatmulArgs a;
      a.w = w;
      a.x = x;
      a.ldx = w.cols;
      a.y = y;
      a.ldy = w.rows;
      a.tokens = T;
      a.accumulate = accumulate;
      matmul(a, stream_, with_prepared_x(a, prep, exact));
    }
  }

  PreparedX prepare_x(const float* x, int64_t ldx, int64_t T, int64_t cols, PrefillSite site, bool with_8bit = false) {
    PreparedX p;
    if (fp32_prefill_ || T <= 1) return p;
    PrefillKernel kernel = prefill_kernel_;
    if (kernel == PrefillKernel::wgmma_f16 && !(chunk_f16_sites_ & site)) {
      kernel = PrefillKernel::wgmma_split;
      p.split = true;
    }
    switch (kernel) {
      case PrefillKernel::int8:
        if (cols % 128 != 0 || matmul_q16_bytes(T, cols) > int64_t(prep_bytes_)) return p;
        matmul_quantize_x(x, ldx, T, cols, prep_, stream_);
        p.main = p.q16 = prep_;
        return p;
      case PrefillKernel::wgmma_f16:
        if (cols % 512 != 0 || matmul_f16_bytes(T, cols) > int64_t(prep_bytes_)) return p;
        matmul_prepare_x_f16(x, ldx, T, cols, prep_, stream_);
        p.main = prep_;
        break;
      case PrefillKernel::split:  // no 16-bit x: the 8-bit products take the fp32 SIMT kernel
        with_8bit = false;
        [[fallthrough]];
      case PrefillKernel::wgmma_split:
        if (cols % 64 != 0 || matmul_prepared_bytes(T, cols) > int64_t(prep_bytes_)) return p;
        matmul_prepare_x(x, ldx, T, cols, prep_, stream_);
        p.main = prep_;
        break;
    }
    if (with_8bit && cols % 128 == 0 && matmul_q16_bytes(T, cols) <= int64_t(prep_q16_bytes_)) {
      matmul_quantize_x(x, ldx, T, cols, prep_q16_, stream_);
      p.q16 = prep_q16_;
    }
    return p;
  }
  // Sets the prepared input on `a` (when a kernel that reads it takes the matrix) and picks the tile: the integer and
  // warpgroup kernels choose their own; the split-x kernel's fastest with prepared x is 128×64 (docs/benchmarks.md).
  MatmulTile with_prepared_x(MatmulArgs& a, const PreparedX& prep, bool exact = false) const {
    if (fp32_prefill_) return MatmulTile::simt;
    if (prep.q16 && matmul_int8_takes(a.w) &&
        (exact || prefill_kernel_ == PrefillKernel::int8 || a.w.format != WeightFormat::affine4)) {
      a.x_q16 = prep.q16;
      a.x_q16_cols = a.w.cols;
      return MatmulTile::automatic;
    }
    if (!prep.main || a.w.format != WeightFormat::affine4) return MatmulTile::automatic;
    switch (prep.split ? PrefillKernel::wgmma_split : prefill_kernel_) {
      case PrefillKernel::int8: return MatmulTile::automatic;
      case PrefillKernel::wgmma_f16:
        if (matmul_wgmma_takes(a.w)) {
          a.x_f16 = prep.main;
          a.x_f16_cols = a.w.cols;
        }
        return MatmulTile::automatic;
      case PrefillKernel::wgmma_split:
        a.x_prep = prep.main;
        a.x_prep_cols = a.w.cols;
        return matmul_wgmma_takes(a.w) ? MatmulTile::wgmma : MatmulTile::tc128x64;
      case PrefillKernel::split: break;
    }
    a.x_prep = prep.main;
    a.x_prep_cols = a.w.cols;
    return MatmulTile::tc128x64;
  }

  void run_chunk(CudaSession& s, std::span<const int32_t> tokens) {
    const int64_t T = int64_t(tokens.size());
    TERN_CUDA(cudaMemcpyAsync(tokens_, tokens.data(), size_t(T) * 4, cudaMemcpyHostToDevice, stream_));
    device_token_valid_ = false;
    chunk_f16_sites_ = T >= f16_min_tokens_ ? f16_sites_ : 0;
    chunk_body(s, T);
    s.pos += T;
  }

  // Every kernel of one chunk of T tokens (already in tokens_); no host value depends on the step, so a T = 1
  // body can be captured once in a CUDA graph and replayed.
  void chunk_body(CudaSession& s, int64_t T) {
    const Config& c = w_->config;
    const int64_t D = c.hidden_size;
    const float eps = float(c.rms_norm_eps);
    embed_lookup(w_->embed, tokens_, T, hidden_, stream_);
    if (decode_plan(T)) {
      for (size_t i = 0; i < w_->layers.size(); ++i) {
        const DeviceLayer& l = w_->layers[i];
        if (l.type == LayerType::linear_attention)
          gdn_decode_mixer(l, s.layers[i], T);
        else
          attention_decode_mixer(l, s.layers[i], s, T);
        dump_layer("mixer_res", i, T);
        moe_decode(moe_w_[i], hidden_, int(T), moe_scratch_, stream_);
        dump_layer("layer_out", i, T, moe_scratch_.ids);
      }
      advance_position_kernel<<<1, 1, 0, stream_>>>(s.d_pos, int(T));
      TERN_CUDA_LAUNCHED("advance_position");
      return;
    }
    for (size_t i = 0; i < w_->layers.size(); ++i) {
      const DeviceLayer& l = w_->layers[i];
      CudaSession::LayerCache& lc = s.layers[i];
      rmsnorm(hidden_, l.input_norm, eps, T, D, normed_, stream_);
      if (l.type == LayerType::linear_attention) {
        gdn_mixer(l, lc, T);
      } else {
        attention_mixer(l, lc, s, T, s.capacity());
      }
      dump_layer("mixer_res", i, T);
      rmsnorm(hidden_, l.post_attn_norm, eps, T, D, normed_, stream_);
      moe(l, T);
      dump_layer("layer_out", i, T, route_ids_);
    }
    advance_position_kernel<<<1, 1, 0, stream_>>>(s.d_pos, int(T));
    TERN_CUDA_LAUNCHED("advance_position");
  }

  // Activation dumps (activation_dump.cuh): the residual hidden_ [T, D] of layer i under `base`, and with ids the
  // layer's routing [T, k]. Never while a graph is being captured.
  void dump_layer(const char* base, size_t i, int64_t T, const int* ids = nullptr) {
    if (!dump_.on() || capturing_) return;
    std::string suffix(".");
    suffix += std::to_string(i);
    dump_.add(std::string(base).append(suffix), hidden_, T, w_->config.hidden_size, stream_);
    if (ids) dump_.add_ids(std::string("route_ids").append(suffix), ids, T, w_->config.num_experts_per_tok, stream_);
  }

  // One decode step through a CUDA graph (embed, 40 layers, LM head, sampling): the token and the sampling
  // parameters are copied into device memory, then the graph bound to this session replays.
  // With a token mask (constrained decoding) the graph holds only the forward: the host fills the mask while it
  // runs, then the mask is uploaded and applied, and the sampler runs outside the graph.
  int32_t decode_graph_step(CudaSession& s, int32_t token, const DeviceSampling& sampling) {
    const int64_t V = w_->config.vocab_size;
    const bool masked = sampling.mask != nullptr;
    if (masked ? (!mask_graph_exec_ || mask_graph_session_ != s.id) : (!graph_exec_ || graph_session_ != s.id)) {
      capture_decode(s, /*with_sampling=*/!masked);
      device_token_valid_ = params_valid_ = false;
    }
    step_timer_.begin(stream_);
    // The graph leaves its sampled token in tokens_ for the next step, and the parameters stay where they were put:
    // copy only what changed.
    if (!(device_token_valid_ && device_token_ == token)) {
      std::memcpy(pinned_, &token, 4);
      TERN_CUDA(cudaMemcpyAsync(tokens_, pinned_, 4, cudaMemcpyHostToDevice, stream_));
    }
    DeviceSampling params = sampling;
    params.mask = nullptr;  // a host pointer: not part of what the device reads
    if (!(params_valid_ && std::memcmp(&last_params_, &params, sizeof(DeviceSampling)) == 0)) {
      std::memcpy(static_cast<uint8_t*>(pinned_) + 64, &params, sizeof(DeviceSampling));
      TERN_CUDA(cudaMemcpyAsync(sample_params_slot(sample_scratch_, V), static_cast<uint8_t*>(pinned_) + 64,
                                sizeof(DeviceSampling), cudaMemcpyHostToDevice, stream_));
      last_params_ = params;
      params_valid_ = true;
    }
    TERN_CUDA(cudaGraphLaunch(masked ? mask_graph_exec_ : graph_exec_, stream_));
    if (masked) {
      apply_step_mask(sampling);
      sample_token_device(logits_, V, sample_scratch_, sample_out_, stream_);
      TERN_CUDA(cudaMemcpyAsync(tokens_, sample_out_, 4, cudaMemcpyDeviceToDevice, stream_));  // the next input
    }
    s.pos += 1;
    TERN_CUDA(cudaMemcpyAsync(pinned_, sample_out_, 4, cudaMemcpyDeviceToHost, stream_));
    step_timer_.end(stream_);
    TERN_CUDA(cudaStreamSynchronize(stream_));
    step_timer_.collect();
    int32_t id;
    std::memcpy(&id, pinned_, 4);
    device_token_ = id;
    device_token_valid_ = true;
    return id;
  }

  // with_sampling false: the forward only (the token-mask path), kept in mask_graph_exec_.
  void capture_decode(CudaSession& s, bool with_sampling = true) {
    cudaGraphExec_t& exec = with_sampling ? graph_exec_ : mask_graph_exec_;
    if (exec) {
      TERN_CUDA(cudaGraphExecDestroy(exec));
      exec = nullptr;
    }
    const int64_t V = w_->config.vocab_size;
    TERN_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
    cudaGraph_t graph = nullptr;
    capturing_ = true;
    try {
      chunk_body(s, 1);
      lm_head_device(0, 1);
      if (with_sampling) {
        sample_token_device(logits_, V, sample_scratch_, sample_out_, stream_);
        TERN_CUDA(cudaMemcpyAsync(tokens_, sample_out_, 4, cudaMemcpyDeviceToDevice, stream_));  // the next input
      }
    } catch (...) {
      capturing_ = false;
      cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    capturing_ = false;
    TERN_CUDA(cudaStreamEndCapture(stream_, &graph));
    const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    TERN_CUDA(e);
    (with_sampling ? graph_session_ : mask_graph_session_) = s.id;
  }

  // ---- token mask (constrained decoding, src/cuda/token_mask.cuh) ----
  // Asks the request's mask source for this step's mask (the host work overlaps the forward already launched on
  // the stream), copies it through pinned memory to the device and sets the disallowed logits to -inf.
  void apply_step_mask(const DeviceSampling& sampling) {
    if (!sampling.mask) return;
    const std::span<const uint32_t> mask = sampling.mask->fill();
    if (mask.empty()) return;
    const int64_t V = w_->config.vocab_size, words = std::min<int64_t>(int64_t(mask.size()), (V + 31) / 32);
    if (!mask_device_) {
      TERN_CUDA(cudaMalloc(&mask_device_, size_t((V + 31) / 32) * 4));
      TERN_CUDA(cudaMallocHost(&mask_pinned_, size_t((V + 31) / 32) * 4));
    }
    // The previous step's copy out of mask_pinned_ has completed: every step ends with a stream synchronize.
    std::memcpy(mask_pinned_, mask.data(), size_t(words) * 4);
    TERN_CUDA(cudaMemcpyAsync(mask_device_, mask_pinned_, size_t(words) * 4, cudaMemcpyHostToDevice, stream_));
    token_mask_apply(logits_, V, mask_device_, words, stream_);
  }

  // Decode plan, Gated DeltaNet layer: fused in_proj (RMSNorm in its prologue) → one GDN kernel (conv, norms,
  // gates, state update, gated norm) → out_proj added to the residual. proj_ [T, proj_cols_] = [qkv | z | b | a].
  void gdn_decode_mixer(const DeviceLayer& l, CudaSession::LayerCache& lc, int64_t T) {
    const Config& c = w_->config;
    const GdnDims d = gdn_dims(T);
    const int64_t C = d.C(), Z = int64_t(d.Hv) * d.dv, D = c.hidden_size;
    if (!gdn_decode_supported(d)) {  // other head shapes (small test models): the prefill plan's kernels
      rmsnorm(hidden_, l.input_norm, float(c.rms_norm_eps), T, D, normed_, stream_);
      gdn_mixer(l, lc, T);
      return;
    }
    if (l.in_proj_all.rows > 0) {
      qmv_into(l.in_proj_all, hidden_, D, T, l.input_norm, proj_, proj_cols_);
    } else {
      qmv_into(l.in_proj_qkv, hidden_, D, T, l.input_norm, proj_, proj_cols_);
      qmv_into(l.in_proj_z, hidden_, D, T, l.input_norm, proj_ + C, proj_cols_);
      qmv_into(l.in_proj_b, hidden_, D, T, l.input_norm, proj_ + C + Z, proj_cols_);
      qmv_into(l.in_proj_a, hidden_, D, T, l.input_norm, proj_ + C + Z + d.Hv, proj_cols_);
    }
    GdnDecodeArgs g;
    g.proj = proj_;
    g.ld_proj = proj_cols_;
    g.conv_w = l.conv1d;
    g.Ck = c.linear_conv_kernel_dim;
    g.conv_state = lc.conv;
    g.rec_state = lc.rec;
    g.A_log = l.A_log;
    g.dt_bias = l.dt_bias;
    g.norm_w = l.gdn_norm;
    g.eps = float(c.rms_norm_eps);
    g.d = d;
    g.out = gated_;
    gdn_decode(g, stream_);
    qmv_into(l.out_proj, gated_, Z, T, nullptr, hidden_, D, /*accumulate=*/true, output_ahead(l));
  }

  // Decode plan, attention layer: q|k|v in one product for one token (three for several), then the cache append,
  // split-KV attention with the gate, and o_proj added to the residual.
  void attention_decode_mixer(const DeviceLayer& l, CudaSession::LayerCache& lc, CudaSession& s, int64_t T) {
    const Config& c = w_->config;
    const AttnDims d = attn_dims(T, s.capacity());
    const int64_t D = c.hidden_size, Q = int64_t(d.Hq) * 2 * d.dh, KV = int64_t(d.Hkv) * d.dh;
    const float *qg = qg_, *k = k_, *v = v_;
    if (T == 1 && l.attn_qkv.rows > 0) {
      qmv_into(l.attn_qkv, hidden_, D, T, l.input_norm, proj_, proj_cols_);
      qg = proj_;
      k = proj_ + Q;
      v = proj_ + Q + KV;
    } else {
      qmv_into(l.q_proj, hidden_, D, T, l.input_norm, qg_, Q);
      qmv_into(l.k_proj, hidden_, D, T, l.input_norm, k_, KV);
      qmv_into(l.v_proj, hidden_, D, T, l.input_norm, v_, KV);
    }
    attn_prepare(qg, k, v, l.q_norm, l.k_norm, s.d_pos, d, q_, lc.k, lc.v, stream_);
    attention(q_, qg, lc.k, lc.v, s.d_pos, d, attn_part_, attn_out_, stream_);
    qmv_into(l.o_proj, attn_out_, int64_t(d.Hq) * d.dh, T, nullptr, hidden_, D, /*accumulate=*/true, output_ahead(l));
  }

  size_t layer_index(const DeviceLayer& l) const {
    const size_t i = size_t(&l - w_->layers.data());
    TERN_CHECK(i < w_->layers.size(), "layer_index: not a layer of this runner's weights");
    return i;
  }
  const L2Ranges& output_ahead(const DeviceLayer& l) const { return l2_output_ahead_[layer_index(l)]; }

  void gdn_mixer(const DeviceLayer& l, CudaSession::LayerCache& lc, int64_t T) {
    const Config& c = w_->config;
    const GdnDims d = gdn_dims(T);
    const int64_t C = d.C();
    // The decay and write-strength gates (b, a: 32 rows each) steer the recurrence over the whole sequence: with the
    // fp16 products they take the 16-bit integer x (exact_gates_).
    const PreparedX xp = prepare_x(normed_, c.hidden_size, T, c.hidden_size, kGdnIn, exact_gates_);
    proj(l.in_proj_qkv, normed_, T, qkv_raw_, false, xp);
    proj(l.in_proj_z, normed_, T, z_, false, xp);
    proj(l.in_proj_b, normed_, T, b_, false, xp, /*exact=*/true);
    proj(l.in_proj_a, normed_, T, a_, false, xp, /*exact=*/true);
    if (d.dk == 128) {  // the q/k norms inside the convolution (a warp per 128-channel head), then the gates
      conv1d_silu_qknorm(qkv_raw_, C, T, C, c.linear_conv_kernel_dim, l.conv1d, lc.conv, conv_out_,
                         int64_t(d.Hk) * d.dk, int64_t(d.Hk) * d.dk, d.dk, stream_);
      gdn_gates(b_, a_, l.A_log, l.dt_bias, d, g_, beta_, stream_);
    } else {
      conv1d_silu(qkv_raw_, C, T, C, c.linear_conv_kernel_dim, l.conv1d, lc.conv, conv_out_, stream_);
      gdn_prepare(conv_out_, b_, a_, l.A_log, l.dt_bias, d, g_, beta_, stream_);
    }
    // Prefill: the chunked (WY) form through a workspace that aliases the MoE down-projection output (yd_, not live
    // here); short prompts and decode stay on the token-by-token recurrence.
    if (T >= 64)
      gdn_chunked(conv_out_, g_, beta_, lc.rec, d, o_, stream_, 64,
                  fp32_prefill_ ? GdnChunkedKernel::simt : GdnChunkedKernel::automatic, yd_, yd_bytes_);
    else
      gdn_recurrent(conv_out_, g_, beta_, lc.rec, d, o_, stream_);
    gdn_gated_norm(o_, z_, l.gdn_norm, float(c.rms_norm_eps), d, gated_, stream_);
    const int64_t Z = int64_t(d.Hv) * d.dv;
    proj(l.out_proj, gated_, T, hidden_, /*accumulate=*/true, prepare_x(gated_, Z, T, Z, kMixerOut));
  }

  void attention_mixer(const DeviceLayer& l, CudaSession::LayerCache& lc, CudaSession& s, int64_t T, int64_t cap) {
    const Config& c = w_->config;
    const AttnDims d = attn_dims(T, cap);
    const PreparedX xp = prepare_x(normed_, c.hidden_size, T, c.hidden_size, kAttnIn);
    proj(l.q_proj, normed_, T, qg_, false, xp);
    proj(l.k_proj, normed_, T, k_, false, xp);
    proj(l.v_proj, normed_, T, v_, false, xp);
    attn_prepare(qg_, k_, v_, l.q_norm, l.k_norm, s.d_pos, d, q_, lc.k, lc.v, stream_);
    attention(q_, qg_, lc.k, lc.v, s.d_pos, d, attn_part_, attn_out_, stream_);
    const int64_t O = int64_t(d.Hq) * d.dh;
    proj(l.o_proj, attn_out_, T, hidden_, /*accumulate=*/true, prepare_x(attn_out_, O, T, O, kMixerOut));
  }

  void moe(const DeviceLayer& l, int64_t T) {
    const Config& c = w_->config;
    const int E = c.num_experts, k = c.num_experts_per_tok;
    const int64_t D = c.hidden_size, F = c.moe_intermediate_size;
    // normed_ prepared once for the router, the shared-expert gate and the routed and shared gate/up products.
    const PreparedX xp = prepare_x(normed_, D, T, D, kMoeIn, /*with_8bit=*/true);
    proj(l.router, normed_, T, router_logits_, false, xp);
    proj(l.shared_expert_gate, normed_, T, shared_logit_, false, xp);
    moe_route(router_logits_, T, E, k, route_ids_, route_w_, stream_);
    const int* pos_of = nullptr;
    if (T == 1) {
      GemvArgs a;
      a.x = normed_;
      a.ids = route_ids_;
      a.slots = k;
      a.y_stride = F;
      a.w = l.expert_gate;
      a.y = hg_;
      gemv(a, stream_);
      a.w = l.expert_up;
      a.y = hu_;
      gemv(a, stream_);
      swiglu(hg_, hu_, k * F, hg_, stream_);
      a.w = l.expert_down;
      a.x = hg_;
      a.x_stride = F;
      a.y = yd_;
      a.y_stride = D;
      gemv(a, stream_);
      shared_expert(l, T, PreparedX{});
    } else {
      // hg_ prepared for the down product once the gate/up products are done.
      moe_group(route_ids_, T, E, k, kMatmulTileTokens, groups_, stream_);
      MatmulArgs a;
      set_tiles(a, groups_, moe_max_tiles(T, E, k));
      a.gather = groups_.sorted_token;
      a.x = normed_;
      a.ldx = D;
      a.ldy = F;
      a.w = l.expert_gate;
      a.y = hg_;
      const MatmulTile tile = with_prepared_x(a, xp);
      if (!fp32_prefill_ && matmul_swiglu_supported(a, l.expert_up)) {  // h = silu(gate·x) ⊙ (up·x) in one pass
        matmul_swiglu(a, l.expert_up, stream_, tile);
      } else {
        matmul(a, stream_, tile);
        a.w = l.expert_up;
        a.y = hu_;
        matmul(a, stream_, tile);
        swiglu(hg_, hu_, T * k * F, hg_, stream_);
      }
      shared_expert(l, T, xp);
      a.gather = nullptr;
      a.x = hg_;
      a.ldx = F;
      a.x_prep = nullptr;
      a.x_q16 = nullptr;
      a.x_f16 = nullptr;
      a.w = l.expert_down;
      a.y = yd_;
      a.ldy = D;
      matmul(a, stream_, with_prepared_x(a, prepare_x(hg_, F, T * k, F, kMoeDown)));
      pos_of = groups_.pos_of;
    }
    moe_combine(hidden_, yd_, pos_of, route_w_, ys_, shared_logit_, T, D, k, stream_);
  }

  // The shared expert of the prefill plan: ys_ [T, D] = down(silu(gate·x) ⊙ (up·x)), x = normed_ (split in xp).
  void shared_expert(const DeviceLayer& l, int64_t T, const PreparedX& xp) {
    const Config& c = w_->config;
    const int64_t D = c.hidden_size, Fs = c.shared_expert_intermediate_size;
    MatmulArgs sa;
    sa.w = l.shared_gate;
    sa.x = normed_;
    sa.ldx = D;
    sa.y = sg_;
    sa.ldy = Fs;
    sa.tokens = T;
    const MatmulTile tile = with_prepared_x(sa, xp);
    if (T > 1 && !fp32_prefill_ && matmul_swiglu_supported(sa, l.shared_up)) {
      matmul_swiglu(sa, l.shared_up, stream_, tile);
    } else {
      proj(l.shared_gate, normed_, T, sg_, false, xp);
      proj(l.shared_up, normed_, T, su_, false, xp);
      swiglu(sg_, su_, T * Fs, sg_, stream_);
    }
    proj(l.shared_down, sg_, T, ys_, false, prepare_x(sg_, Fs, T, Fs, kMoeDown));  // xp is not read after this
  }

  // Logits of chunk rows [r0, r0 + n) into logits_ (device), n <= kLmRows.
  void lm_head_device(int64_t r0, int64_t n) {
    const Config& c = w_->config;
    const int64_t D = c.hidden_size;
    if (n <= kQmvMaxTokens && use_decode_kernels_) {
      qmv_into(w_->lm_head, hidden_ + r0 * D, D, n, w_->final_norm, logits_, c.vocab_size);
    } else {
      rmsnorm(hidden_ + r0 * D, w_->final_norm, float(c.rms_norm_eps), n, D, normed_, stream_);
      proj(w_->lm_head, normed_, n, logits_);
    }
    mask_padding(logits_, n, c.vocab_size, w_->vocab_real, stream_);
  }

  void lm_head_rows(int64_t r0, int64_t n, float* host) {
    const int64_t V = w_->config.vocab_size;
    for (int64_t i = 0; i < n; i += kLmRows) {
      const int64_t m = std::min(kLmRows, n - i);
      lm_head_device(r0 + i, m);
      TERN_CUDA(cudaMemcpyAsync(host + i * V, logits_, size_t(m * V) * 4, cudaMemcpyDeviceToHost, stream_));
      TERN_CUDA(cudaStreamSynchronize(stream_));
    }
  }

  std::unique_ptr<DeviceWeights> w_;
  std::shared_ptr<const ModelWeights> host_;  // keeps the source alive (not read after upload)
  int64_t max_chunk_;
  cudaStream_t stream_{};
  DeviceArena scratch_;
  bool use_graphs_ = true;              // TERN_CUDA_GRAPHS=0 turns the decode graph off
  StepTimer step_timer_;                // TERN_STEP_TIMING=1: device span vs host wall time per graph step
  bool fp32_prefill_ = false;           // TERN_CUDA_FP32=1
  // The 4-bit prefill products' kernel: the Hopper warpgroup kernel (x in one fp16 term, or two bf16), the integer
  // kernel, or the split-x mma.sync kernel (TERN_PREFILL_INT8=0). 8-bit matrices take the integer kernel in every mode
  // but split.
  enum class PrefillKernel { wgmma_f16, wgmma_split, int8, split };
  PrefillKernel prefill_kernel_ = PrefillKernel::int8;
  bool exact_gates_ = false;  // the GDN b and a products on the integer kernel (see gdn_mixer)
  int32_t device_token_ = 0;            // the token the last graph step left in tokens_ (when valid)
  bool device_token_valid_ = false;
  DeviceSampling last_params_{};        // the parameters in sample_params_slot (when valid)
  bool params_valid_ = false;
  bool decode_warm_ = false;           // a decode step has run outside capture
  bool use_decode_kernels_ = true;      // TERN_CUDA_DECODE_KERNELS=0: decode through the prefill plan's kernels
  bool kv_f16_ = true;                  // the KV cache in fp16, else bf16 (TERN_KV_BF16=1, CudaRunnerOptions::kv_f16)
  bool capturing_ = false;              // a decode graph is being captured (no activation dumps)
  ActivationDump dump_;                 // set_activation_dump_dir
  int f16_sites_ = kAllSites & ~kGdnIn;  // TERN_PREFILL_F16_SITES (see the constructor)
  int64_t f16_min_tokens_ = 512;         // TERN_PREFILL_F16_MIN_TOKENS (see the constructor)
  int chunk_f16_sites_ = 0;              // f16_sites_, or 0 for a chunk under f16_min_tokens_ (run_chunk)
  int l2_prefetch_ = 12;                // TERN_L2_PREFETCH bit mask (see the constructor)
  std::vector<L2Ranges> l2_output_ahead_;  // per layer: what its output projection asks L2 for (plan_l2_prefetch)
  DeviceArena decode_scratch_;
  float* proj_ = nullptr;               // [kQmvMaxTokens, proj_cols_] fused input projection output
  int64_t proj_cols_ = 0;
  MoeDecodeScratch moe_scratch_;
  std::vector<MoeDecodeWeights> moe_w_;  // per layer
  cudaGraphExec_t graph_exec_ = nullptr;
  uint64_t graph_session_ = 0, session_ids_ = 0;
  std::shared_ptr<SnapshotBuffers> snapshot_buffers_;  // made with the first session
  cudaGraphExec_t mask_graph_exec_ = nullptr;  // the decode graph without sampling (token-mask steps)
  uint64_t mask_graph_session_ = 0;
  uint32_t *mask_device_ = nullptr, *mask_pinned_ = nullptr;  // [ceil(V / 32)] the step's token mask
  void* pinned_ = nullptr;              // [256 B] token in, sampled id out, sampling parameters
  float *hidden_ = nullptr, *normed_ = nullptr;
  float *qkv_raw_ = nullptr, *conv_out_ = nullptr, *z_ = nullptr, *o_ = nullptr, *gated_ = nullptr, *b_ = nullptr,
        *a_ = nullptr, *g_ = nullptr, *beta_ = nullptr;
  float *qg_ = nullptr, *k_ = nullptr, *v_ = nullptr, *q_ = nullptr, *attn_out_ = nullptr, *attn_part_ = nullptr;
  float *router_logits_ = nullptr, *route_w_ = nullptr, *shared_logit_ = nullptr;
  float *hg_ = nullptr, *hu_ = nullptr, *yd_ = nullptr, *sg_ = nullptr, *su_ = nullptr, *ys_ = nullptr;
  size_t yd_bytes_ = 0;                 // also the chunked Gated DeltaNet's workspace
  void* prep_ = nullptr;                // prepared activations of the prefill products (PreparedX::main)
  size_t prep_bytes_ = 0;
  void* prep_q16_ = nullptr;            // the MoE input quantised for the 8-bit products (PreparedX::q16)
  size_t prep_q16_bytes_ = 0;
  float *logits_ = nullptr, *sample_scratch_ = nullptr;
  int *tokens_ = nullptr, *route_ids_ = nullptr, *sample_out_ = nullptr;
  MoeGroups groups_;
};

void require_gpu() {
  TERN_CHECK(device_count() > 0, "--device cuda was asked for, but no CUDA GPU is visible (no driver or no device)");
}

}  // namespace

std::unique_ptr<ModelRunner> cuda_runner_create(std::shared_ptr<const ModelWeights> weights,
                                                const CudaRunnerOptions& options) {
  require_gpu();
  TERN_CHECK(weights != nullptr, "cuda_runner_create: no weights");
  auto dw = device_weights_upload(*weights, options.progress);
  return std::make_unique<CudaRunner>(std::move(dw), std::move(weights), options);
}

std::unique_ptr<ModelRunner> cuda_runner_create_synthetic(const Config& config, uint64_t seed,
                                                          const CudaRunnerOptions& options) {
  require_gpu();
  auto dw = device_weights_synthetic(config, seed, options.progress);
  if (options.vocab_real > 0) dw->vocab_real = std::min<int64_t>(options.vocab_real, config.vocab_size);
  return std::make_unique<CudaRunner>(std::move(dw), nullptr, options);
}

int cuda_device_count() { return device_count(); }
std::string cuda_device_name() { return device_count() > 0 ? device_description() : std::string("no CUDA device"); }

int64_t cuda_runner_weight_bytes(const ModelRunner& runner) {
  const auto* r = dynamic_cast<const CudaRunner*>(&runner);
  return r ? r->weight_bytes() : 0;
}

}  // namespace tern
