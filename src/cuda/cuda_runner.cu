#include "cuda/cuda_runner.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "cuda/attention.cuh"
#include "cuda/conv1d.cuh"
#include "cuda/cuda_common.cuh"
#include "cuda/device_weights.cuh"
#include "cuda/gdn.cuh"
#include "cuda/moe.cuh"
#include "cuda/norm.cuh"
#include "cuda/qmatmul.cuh"
#include "cuda/sampling.cuh"

namespace tern {
namespace {

using namespace tern::cuda;

__global__ void advance_position_kernel(int* pos, int n) { *pos += n; }

class CudaSession final : public Session {
 public:
  CudaSession(const DeviceWeights& w, int64_t capacity, const void* owner, uint64_t id)
      : owner(owner), id(id), capacity_(capacity) {
    const Config& c = w.config;
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

  struct LayerCache {
    uint16_t* k = nullptr;  // [Hkv, capacity, dh] bf16
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

 private:
  int64_t capacity_;
};

class CudaRunner final : public ModelRunner {
 public:
  CudaRunner(std::unique_ptr<DeviceWeights> w, std::shared_ptr<const ModelWeights> host, const CudaRunnerOptions& o)
      : w_(std::move(w)), host_(std::move(host)), max_chunk_(std::max<int64_t>(1, o.max_chunk)) {
    TERN_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    allocate_scratch();
    TERN_CUDA(cudaMallocHost(&pinned_, 256));
    const char* g = std::getenv("TERN_CUDA_GRAPHS");
    use_graphs_ = !(g && std::string(g) == "0");
  }
  ~CudaRunner() override {
    cudaStreamSynchronize(stream_);
    if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
    cudaFreeHost(pinned_);
    cudaStreamDestroy(stream_);
  }

  std::string backend_name() const override { return "cuda"; }
  const Config& config() const override { return w_->config; }
  int64_t vocab_real() const override { return w_->vocab_real; }
  int64_t weight_bytes() const { return w_->bytes; }

  std::unique_ptr<Session> create_session(int64_t max_context) override {
    TERN_CHECK(max_context > 0, "session capacity must be positive, got ", max_context);
    TERN_CHECK(max_context < (int64_t(1) << 31), "session capacity ", max_context, " is too large");
    return std::make_unique<CudaSession>(*w_, max_context, this, ++session_ids_);
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
    if (n == 1 && use_graphs_) return decode_graph_step(s, tokens[0], sampling);
    for (int64_t c0 = 0; c0 < n; c0 += max_chunk_) {
      const int64_t T = std::min(max_chunk_, n - c0);
      run_chunk(s, tokens.subspan(size_t(c0), size_t(T)));
      if (c0 + T == n) lm_head_device(T - 1, 1);
    }
    sample_token(logits_, V, sampling, sample_scratch_, sample_out_, stream_);
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
    // T·splits <= max(T, 128) for every chunk length up to T (attn_splits_for).
    const int64_t attn_parts = attn_partial_floats(std::max<int64_t>(T, 128), int(Hq), int(dh), 1);
    const int64_t mixer_attn = T * (Hq * 2 * dh + 2 * Hkv * dh + 2 * Hq * dh) + attn_parts;
    const int64_t floats = 2 * T * D + std::max(mixer_gdn, mixer_attn) + T * E + T * k + T +
                           T * k * (2 * F + D) + T * (2 * Fs + D) + kLmRows * V + sample_scratch_floats(V);
    const int64_t ints = T + T * k + moe_group_ints(T, E, k) + 1;
    scratch_ = DeviceArena(size_t(floats) * 4 + size_t(ints) * 4 + 64 * 256, "activation scratch");
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

  // y [T, rows] (+)= x [T, cols] · Wᵀ
  void proj(const DMat& w, const float* x, int64_t T, float* y, bool accumulate = false) {
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
      matmul(a, stream_);
    }
  }

  void run_chunk(CudaSession& s, std::span<const int32_t> tokens) {
    const int64_t T = int64_t(tokens.size());
    TERN_CUDA(cudaMemcpyAsync(tokens_, tokens.data(), size_t(T) * 4, cudaMemcpyHostToDevice, stream_));
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
    for (size_t i = 0; i < w_->layers.size(); ++i) {
      const DeviceLayer& l = w_->layers[i];
      CudaSession::LayerCache& lc = s.layers[i];
      rmsnorm(hidden_, l.input_norm, eps, T, D, normed_, stream_);
      if (l.type == LayerType::linear_attention) {
        gdn_mixer(l, lc, T);
      } else {
        attention_mixer(l, lc, s, T, s.capacity());
      }
      rmsnorm(hidden_, l.post_attn_norm, eps, T, D, normed_, stream_);
      moe(l, T);
    }
    advance_position_kernel<<<1, 1, 0, stream_>>>(s.d_pos, int(T));
    TERN_CUDA_LAUNCHED("advance_position");
  }

  // One decode step through a CUDA graph (embed, 40 layers, LM head, sampling): the token and the sampling
  // parameters are copied into device memory, then the graph bound to this session replays.
  int32_t decode_graph_step(CudaSession& s, int32_t token, const DeviceSampling& sampling) {
    const int64_t V = w_->config.vocab_size;
    std::memcpy(pinned_, &token, 4);
    std::memcpy(static_cast<uint8_t*>(pinned_) + 64, &sampling, sizeof(DeviceSampling));
    TERN_CUDA(cudaMemcpyAsync(tokens_, pinned_, 4, cudaMemcpyHostToDevice, stream_));
    TERN_CUDA(cudaMemcpyAsync(sample_params_slot(sample_scratch_, V), static_cast<uint8_t*>(pinned_) + 64,
                              sizeof(DeviceSampling), cudaMemcpyHostToDevice, stream_));
    if (!graph_exec_ || graph_session_ != s.id) capture_decode(s);
    TERN_CUDA(cudaGraphLaunch(graph_exec_, stream_));
    s.pos += 1;
    TERN_CUDA(cudaMemcpyAsync(pinned_, sample_out_, 4, cudaMemcpyDeviceToHost, stream_));
    TERN_CUDA(cudaStreamSynchronize(stream_));
    int32_t id;
    std::memcpy(&id, pinned_, 4);
    return id;
  }

  void capture_decode(CudaSession& s) {
    if (graph_exec_) {
      TERN_CUDA(cudaGraphExecDestroy(graph_exec_));
      graph_exec_ = nullptr;
    }
    const int64_t V = w_->config.vocab_size;
    TERN_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
    cudaGraph_t graph = nullptr;
    try {
      chunk_body(s, 1);
      lm_head_device(0, 1);
      sample_token_device(logits_, V, sample_scratch_, sample_out_, stream_);
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    TERN_CUDA(cudaStreamEndCapture(stream_, &graph));
    const cudaError_t e = cudaGraphInstantiate(&graph_exec_, graph, 0);
    cudaGraphDestroy(graph);
    TERN_CUDA(e);
    graph_session_ = s.id;
  }

  void gdn_mixer(const DeviceLayer& l, CudaSession::LayerCache& lc, int64_t T) {
    const Config& c = w_->config;
    GdnDims d;
    d.T = T;
    d.Hk = c.linear_num_key_heads;
    d.Hv = c.linear_num_value_heads;
    d.dk = c.linear_key_head_dim;
    d.dv = c.linear_value_head_dim;
    const int64_t C = d.C();
    proj(l.in_proj_qkv, normed_, T, qkv_raw_);
    proj(l.in_proj_z, normed_, T, z_);
    proj(l.in_proj_b, normed_, T, b_);
    proj(l.in_proj_a, normed_, T, a_);
    conv1d_silu(qkv_raw_, C, T, C, c.linear_conv_kernel_dim, l.conv1d, lc.conv, conv_out_, stream_);
    gdn_prepare(conv_out_, b_, a_, l.A_log, l.dt_bias, d, g_, beta_, stream_);
    if (T >= 64)  // prefill: the chunked (WY) form; short prompts and decode stay on the token-by-token recurrence
      gdn_chunked(conv_out_, g_, beta_, lc.rec, d, o_, stream_);
    else
      gdn_recurrent(conv_out_, g_, beta_, lc.rec, d, o_, stream_);
    gdn_gated_norm(o_, z_, l.gdn_norm, float(c.rms_norm_eps), d, gated_, stream_);
    proj(l.out_proj, gated_, T, hidden_, /*accumulate=*/true);
  }

  void attention_mixer(const DeviceLayer& l, CudaSession::LayerCache& lc, CudaSession& s, int64_t T, int64_t cap) {
    const Config& c = w_->config;
    AttnDims d;
    d.T = T;
    d.Hq = c.num_attention_heads;
    d.Hkv = c.num_key_value_heads;
    d.dh = c.head_dim;
    d.rot = c.rotary_dims();
    d.theta = float(c.rope_theta);
    d.eps = float(c.rms_norm_eps);
    d.capacity = cap;
    proj(l.q_proj, normed_, T, qg_);
    proj(l.k_proj, normed_, T, k_);
    proj(l.v_proj, normed_, T, v_);
    attn_prepare(qg_, k_, v_, l.q_norm, l.k_norm, s.d_pos, d, q_, lc.k, lc.v, stream_);
    attention(q_, qg_, lc.k, lc.v, s.d_pos, d, attn_part_, attn_out_, stream_);
    proj(l.o_proj, attn_out_, T, hidden_, /*accumulate=*/true);
  }

  void moe(const DeviceLayer& l, int64_t T) {
    const Config& c = w_->config;
    const int E = c.num_experts, k = c.num_experts_per_tok;
    const int64_t D = c.hidden_size, F = c.moe_intermediate_size, Fs = c.shared_expert_intermediate_size;
    proj(l.router, normed_, T, router_logits_);
    proj(l.shared_expert_gate, normed_, T, shared_logit_);
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
    } else {
      moe_group(route_ids_, T, E, k, kMatmulTileTokens, groups_, stream_);
      MatmulArgs a;
      a.tile_expert = groups_.tile_expert;
      a.tile_start = groups_.tile_start;
      a.tile_count = groups_.tile_count;
      a.num_tiles = groups_.num_tiles;
      a.max_tiles = moe_max_tiles(T, E, k);
      a.gather = groups_.sorted_token;
      a.x = normed_;
      a.ldx = D;
      a.ldy = F;
      a.w = l.expert_gate;
      a.y = hg_;
      matmul(a, stream_);
      a.w = l.expert_up;
      a.y = hu_;
      matmul(a, stream_);
      swiglu(hg_, hu_, T * k * F, hg_, stream_);
      a.gather = nullptr;
      a.x = hg_;
      a.ldx = F;
      a.w = l.expert_down;
      a.y = yd_;
      a.ldy = D;
      matmul(a, stream_);
      pos_of = groups_.pos_of;
    }
    proj(l.shared_gate, normed_, T, sg_);
    proj(l.shared_up, normed_, T, su_);
    swiglu(sg_, su_, T * Fs, sg_, stream_);
    proj(l.shared_down, sg_, T, ys_);
    moe_combine(hidden_, yd_, pos_of, route_w_, ys_, shared_logit_, T, D, k, stream_);
  }

  // Logits of chunk rows [r0, r0 + n) into logits_ (device), n <= kLmRows.
  void lm_head_device(int64_t r0, int64_t n) {
    const Config& c = w_->config;
    const int64_t D = c.hidden_size;
    rmsnorm(hidden_ + r0 * D, w_->final_norm, float(c.rms_norm_eps), n, D, normed_, stream_);
    proj(w_->lm_head, normed_, n, logits_);
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
  cudaGraphExec_t graph_exec_ = nullptr;
  uint64_t graph_session_ = 0, session_ids_ = 0;
  void* pinned_ = nullptr;              // [256 B] token in, sampled id out, sampling parameters
  float *hidden_ = nullptr, *normed_ = nullptr;
  float *qkv_raw_ = nullptr, *conv_out_ = nullptr, *z_ = nullptr, *o_ = nullptr, *gated_ = nullptr, *b_ = nullptr,
        *a_ = nullptr, *g_ = nullptr, *beta_ = nullptr;
  float *qg_ = nullptr, *k_ = nullptr, *v_ = nullptr, *q_ = nullptr, *attn_out_ = nullptr, *attn_part_ = nullptr;
  float *router_logits_ = nullptr, *route_w_ = nullptr, *shared_logit_ = nullptr;
  float *hg_ = nullptr, *hu_ = nullptr, *yd_ = nullptr, *sg_ = nullptr, *su_ = nullptr, *ys_ = nullptr;
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
  return std::make_unique<CudaRunner>(std::move(dw), nullptr, options);
}

int cuda_device_count() { return device_count(); }
std::string cuda_device_name() { return device_count() > 0 ? device_description() : std::string("no CUDA device"); }

int64_t cuda_runner_weight_bytes(const ModelRunner& runner) {
  const auto* r = dynamic_cast<const CudaRunner*>(&runner);
  return r ? r->weight_bytes() : 0;
}

}  // namespace tern
