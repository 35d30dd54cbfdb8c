// The decode plan of the CUDA runner (cuda_runner_impl.cuh): chunks of at most kQmvMaxTokens tokens through the fused
// decode kernels (qmv with the RMSNorm in its prologue, gdn_decode, split-KV attention, moe_decode), the L2 prefetch
// plan, the one-step CUDA graph (embed, every layer, LM head, sampling) and the token mask of constrained decoding.
#include "cuda/runner/cuda_runner_impl.cuh"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/l2_ranges.h"
#include "cuda/common/step_omit.h"
#include "cuda/kernels/attention/attention.cuh"
#include "cuda/kernels/gdn/gdn.cuh"
#include "cuda/kernels/moe/moe_decode.cuh"
#include "cuda/kernels/norm/norm.cuh"
#include "cuda/kernels/qmv/qmv.cuh"
#include "cuda/kernels/sampling/sampling.cuh"
#include "cuda/kernels/token_mask/token_mask.cuh"

namespace tern::cuda {

// The decode plan's buffers: the fused input projection's output and the MoE block's scratch, for up to
// kQmvMaxTokens tokens, and gdn_decode's tickets; and the per-layer MoE weight bundles.
void CudaRunner::allocate_decode_scratch() {
  const Config& c = w_->config;
  const int T = kQmvMaxTokens;
  const int64_t D = c.hidden_size, C = c.conv_channels(), Hv = c.linear_num_value_heads;
  const int64_t dv = c.linear_value_head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, dh = c.head_dim;
  proj_cols_ = std::max(C + Hv * dv + 2 * Hv, Hq * 2 * dh + 2 * Hkv * dh);
  const size_t moe_bytes = moe_decode_scratch_bytes(T, D, c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size);
  const size_t tickets = size_t(gdn_decode_ticket_count(c.linear_num_key_heads));
  decode_scratch_ = DeviceArena(size_t(T * proj_cols_) * 4 + moe_bytes + tickets * 4 + 3 * 256, "decode scratch");
  proj_ = decode_scratch_.take_n<float>(size_t(T * proj_cols_));
  moe_scratch_ = moe_decode_scratch_view(decode_scratch_.take(moe_bytes), T, D, c.num_experts, c.num_experts_per_tok,
                                         c.moe_intermediate_size);
  moe_decode_scratch_init(moe_scratch_, stream_);
  if (step_omits(StepPart::router))  // TERN_STEP_OMIT: a routing as the router's would spread the experts
    moe_decode_scratch_stand_in_routing(moe_scratch_, T, c.num_experts, c.num_experts_per_tok, stream_);
  gdn_tickets_ = decode_scratch_.take_n<unsigned>(tickets);
  TERN_CUDA(cudaMemsetAsync(gdn_tickets_, 0, tickets * 4, stream_));
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
void CudaRunner::plan_l2_prefetch() {
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

// y [T, w.rows] (row stride ldy) (+)= x̂ · Wᵀ with x̂ = x or RMSNorm(x)·norm_w (x [T, w.cols], row stride ldx).
// ahead: ranges to ask L2 for on behalf of later kernels (one token only).
QmvArgs CudaRunner::decode_product(const DMat& w, const float* x, int64_t ldx, int64_t T, const float* norm_w,
                                   float* y, int64_t ldy, bool accumulate, const L2Ranges& ahead) const {
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
  return a;
}

void CudaRunner::qmv_into(const DMat& w, const float* x, int64_t ldx, int64_t T, const float* norm_w, float* y,
                          int64_t ldy, bool accumulate, const L2Ranges& ahead) {
  qmv(decode_product(w, x, ldx, T, norm_w, y, ldy, accumulate, ahead), stream_);
}

// One decode step through a CUDA graph (embed, 40 layers, LM head, sampling): the token and the sampling
// parameters are copied into device memory, then the graph bound to this session replays.
// With a token mask (constrained decoding) the graph holds only the forward: the host fills the mask while it
// runs, then the mask is uploaded and applied, and the sampler runs outside the graph.
int32_t CudaRunner::decode_graph_step(CudaSession& s, int32_t token, const DeviceSampling& sampling) {
  const int64_t V = w_->config.vocab_size;
  const bool masked = sampling.mask != nullptr;
  cudaGraphExec_t exec = nullptr;
  if (auto found = decode_graphs_.find({s.id, masked}); found != decode_graphs_.end()) {
    exec = found->second.exec;
    found->second.last_use = ++graph_clock_;
  } else {
    exec = capture_decode(s, /*with_sampling=*/!masked);  // marked as just used
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
  TERN_CUDA(cudaGraphLaunch(exec, stream_));
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

// Captures the decode step of session s into decode_graphs_ (with_sampling false: the forward only, for the
// token-mask path) and returns it; the least recently used graph goes when kMaxDecodeGraphs are held.
cudaGraphExec_t CudaRunner::capture_decode(CudaSession& s, bool with_sampling) {
  const std::pair<uint64_t, bool> key{s.id, !with_sampling};
  if (auto old = decode_graphs_.find(key); old != decode_graphs_.end()) {
    TERN_CUDA(cudaGraphExecDestroy(old->second.exec));
    decode_graphs_.erase(old);
  }
  if (decode_graphs_.size() >= kMaxDecodeGraphs) {
    auto lru = std::min_element(decode_graphs_.begin(), decode_graphs_.end(),
                                [](const auto& a, const auto& b) { return a.second.last_use < b.second.last_use; });
    TERN_CUDA(cudaGraphExecDestroy(lru->second.exec));
    decode_graphs_.erase(lru);
  }
  const int64_t V = w_->config.vocab_size;
  cudaGraphExec_t exec = capture_graph([&] {
    chunk_body(s, 1);
    lm_head_device(0, 1);
    if (with_sampling) {
      sample_token_device(logits_, V, sample_scratch_, sample_out_, stream_);
      TERN_CUDA(cudaMemcpyAsync(tokens_, sample_out_, 4, cudaMemcpyDeviceToDevice, stream_));  // the next input
    }
  });
  decode_graphs_[key] = DecodeGraph{exec, ++graph_clock_};
  return exec;
}

// What `body` launches on the stream, captured and instantiated (capturing_ set meanwhile: no activation dumps); on
// an error the capture is ended and dropped, and the error rethrown.
cudaGraphExec_t CudaRunner::capture_graph(const std::function<void()>& body) {
  TERN_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  cudaGraph_t graph = nullptr;
  capturing_ = true;
  try {
    body();
  } catch (...) {
    capturing_ = false;
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  capturing_ = false;
  TERN_CUDA(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  TERN_CUDA(e);
  return exec;
}

// ---- token mask (constrained decoding, src/cuda/kernels/token_mask/token_mask.cuh) ----
// Asks the request's mask source for this step's mask (the host work overlaps the forward already launched on
// the stream), copies it through pinned memory to the device and sets the disallowed logits to -inf.
void CudaRunner::apply_step_mask(const DeviceSampling& sampling) {
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
void CudaRunner::gdn_decode_mixer(const DeviceLayer& l, CudaSession::LayerCache& lc, int64_t T) {
  const Config& c = w_->config;
  const GdnDims d = gdn_dims(T);
  const int64_t C = d.C(), Z = int64_t(d.Hv) * d.dv, D = c.hidden_size;
  if (!gdn_decode_supported(d)) {  // other head shapes (small test models): the prefill plan's kernels
    gdn_mixer(l, lc, T);
    return;
  }
  if (step_omits(StepPart::in)) {
    // left out (TERN_STEP_OMIT)
  } else if (l.in_proj_all.rows > 0) {
    qmv_into(l.in_proj_all, hidden_, D, T, l.input_norm, proj_, proj_cols_);
  } else {
    qmv_into(l.in_proj_qkv, hidden_, D, T, l.input_norm, proj_, proj_cols_);
    qmv_into(l.in_proj_z, hidden_, D, T, l.input_norm, proj_ + C, proj_cols_);
    qmv_into(l.in_proj_b, hidden_, D, T, l.input_norm, proj_ + C + Z, proj_cols_);
    qmv_into(l.in_proj_a, hidden_, D, T, l.input_norm, proj_ + C + Z + d.Hv, proj_cols_);
  }
  GdnDecodeArgs g = gdn_decode_args(l, T, proj_, gated_);
  g.conv_state = lc.conv;
  g.rec_state = lc.rec;
  if (!step_omits(StepPart::gdn)) gdn_decode(g, stream_);
  if (!step_omits(StepPart::out))
    qmv_into(l.out_proj, gated_, Z, T, nullptr, hidden_, D, /*accumulate=*/true, output_ahead(l));
}

// gdn_decode's arguments for layer l over T tokens: proj [T, proj_cols_] in, out [T, Hv·dv]; the states are the
// caller's to set. Every plan's launches share the tickets (one stream: never two at once).
GdnDecodeArgs CudaRunner::gdn_decode_args(const DeviceLayer& l, int64_t T, const float* proj, float* out) const {
  const Config& c = w_->config;
  GdnDecodeArgs g;
  g.proj = proj;
  g.ld_proj = proj_cols_;
  g.conv_w = l.conv1d;
  g.Ck = c.linear_conv_kernel_dim;
  g.A_log = l.A_log;
  g.dt_bias = l.dt_bias;
  g.norm_w = l.gdn_norm;
  g.eps = float(c.rms_norm_eps);
  g.d = gdn_dims(T);
  g.out = out;
  g.tickets = gdn_tickets_;
  return g;
}

// Decode plan, attention layer: q|k|v in one product for one token (three for several), then the cache append,
// split-KV attention with the gate, and o_proj added to the residual.
void CudaRunner::attention_decode_mixer(const DeviceLayer& l, CudaSession::LayerCache& lc, CudaSession& s, int64_t T) {
  const Config& c = w_->config;
  const AttnDims d = attn_dims(T, s.capacity());
  const int64_t D = c.hidden_size, Q = int64_t(d.Hq) * 2 * d.dh, KV = int64_t(d.Hkv) * d.dh;
  const float *qg = qg_, *k = k_, *v = v_;
  const bool in = !step_omits(StepPart::in);
  if (T == 1 && l.attn_qkv.rows > 0) {
    if (in) qmv_into(l.attn_qkv, hidden_, D, T, l.input_norm, proj_, proj_cols_);
    qg = proj_;
    k = proj_ + Q;
    v = proj_ + Q + KV;
  } else if (in) {
    qmv_into(l.q_proj, hidden_, D, T, l.input_norm, qg_, Q);
    qmv_into(l.k_proj, hidden_, D, T, l.input_norm, k_, KV);
    qmv_into(l.v_proj, hidden_, D, T, l.input_norm, v_, KV);
  }
  if (!step_omits(StepPart::attention)) {
    attn_prepare(qg, k, v, l.q_norm, l.k_norm, s.d_pos, d, q_, lc.k, lc.v, stream_, attn_rope(s));
    attention(q_, qg, lc.k, lc.v, s.d_pos, d, attn_part_, attn_out_, stream_);
  }
  if (!step_omits(StepPart::out))
    qmv_into(l.o_proj, attn_out_, int64_t(d.Hq) * d.dh, T, nullptr, hidden_, D, /*accumulate=*/true,
             output_ahead(l));
}

size_t CudaRunner::layer_index(const DeviceLayer& l) const {
  const size_t i = size_t(&l - w_->layers.data());
  TERN_CHECK(i < w_->layers.size(), "layer_index: not a layer of this runner's weights");
  return i;
}

}  // namespace tern::cuda
