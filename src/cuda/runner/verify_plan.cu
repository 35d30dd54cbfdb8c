// The verify step of the CUDA runner (cuda_runner_impl.cuh), speculative decoding's multi-token step: a session's last
// sampled token and its drafts (T <= kQmvMaxTokens; a short call's step without kept states: up to kGdnDecodeMaxTokens)
// run as the T slots of one batched step (batch_plan.cu), slot j at position p0 + j of the same session. The products,
// attention and MoE take the batched kernels, whose every slot is bit for bit its token's one-token step; the Gated
// DeltaNet layers take gdn_decode over the T tokens in order (the same per-token arithmetic as one token at a time),
// which also keeps the states before each token (CudaSession::kept_buffers: room for T tokens in a buffer of the
// runner's pool; the recurrent ones as the state before the first token and each token's update values) for
// Session::rollback. So row j of the logits is what feeding the tokens one step at a time gives, and a rollback copies
// each layer's conv state and replays its recurrent one (a kernel launch each for all layers,
// CudaSession::copy_kept_states): no second pass. The step's tables (batch_tables.cuh) carry every session pointer,
// the kept buffers' too (they may change from step to step), so one CUDA graph per (tokens, capacity) serves any
// session.
#include "cuda/runner/cuda_runner_impl.cuh"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/step_omit.h"
#include "cuda/kernels/attention/attention.cuh"
#include "cuda/kernels/gdn/gdn.cuh"
#include "cuda/kernels/sampling/sampling.cuh"
#include "cuda/runner/batch_tables.cuh"

namespace tern::cuda {
namespace {

__global__ void advance_session_kernel(int* const* pos, int n) { **pos += n; }

}  // namespace

// The batched kernels carry verification (batch_max: every product on the integer one-token kernels, the model's
// Gated DeltaNet shape) and no switch keeps the decode kernels off.
bool CudaRunner::supports_verify() const { return batch_max() >= 2; }

int64_t CudaRunner::max_verify_tokens() const {
  return std::min<int64_t>(kQmvMaxTokens, batch_max());  // the drafts' kept states: 8 tokens at most
}

// A short call keeps a state inside (Session::keep_state_at) where gdn_decode has the kernels for it, unless
// TERN_SHORT_CALL_KEEP=0 (an A/B: the engine then cuts the call at its checkpoint, one step more).
bool CudaRunner::keeps_state_inside(int64_t tokens) const {
  static const bool on = !env_is("TERN_SHORT_CALL_KEEP", "0");
  return on && short_call(tokens) && gdn_decode_keeps_one(gdn_tickets_ != nullptr);
}

// The tokens of one verify step without kept states (a short call's step): gdn_decode's most per call, and at most
// short_step_tokens_ (TERN_SHORT_STEP_TOKENS).
int64_t CudaRunner::max_step_tokens() const {
  return std::min<int64_t>({int64_t(kGdnDecodeMaxTokens), batch_max(), short_step_tokens_});
}

// The device memory a verify of `tokens` tokens keeps until the session's next forward or rollback: its kept-state
// buffer (0 where this runner cannot verify).
int64_t CudaRunner::verify_state_bytes(int tokens) const {
  if (!supports_verify() || tokens <= 0) return 0;
  return int64_t(kept_state_bytes_of(*w_, int(std::min<int64_t>(tokens, max_verify_tokens()))));
}

// The verify step of `tokens` on session s up to its logits in logits_ [T, V] (device); the session then at
// p0 + T with the states before each token kept (keep), or without them (a short forward call, run_short_call);
// snapshot_token >= 0 (not with keep): the states before that token into the session's kept snapshot
// (CudaSession::begin_kept_snapshot, called before). The step's tables go through pinned memory: the caller syncs
// the stream before the next step.
void CudaRunner::verify_step(CudaSession& s, std::span<const int32_t> tokens, bool keep, int snapshot_token) {
  TERN_CHECK(supports_verify(), "forward_verify: this model or configuration has no batched one-token kernels");
  TERN_CHECK(!s.holds_part_way(), "forward_verify: the session holds a prompt chunk part way");
  const int T = int(tokens.size());
  const int64_t most = keep ? max_verify_tokens() : max_step_tokens();
  TERN_CHECK(T >= 1 && T <= most, "forward_verify: ", T, " tokens (1 to ", most, ")");
  const bool keep_one = snapshot_token >= 0;
  TERN_INTERNAL_CHECK(!keep_one || (!keep && snapshot_token < T && !s.kept_snapshot_layers().empty()),
                      "verify step: a kept snapshot before token ", snapshot_token, " of ", T);
  allocate_batch_scratch();
  // Room for exactly T tokens' states; the buffer may differ from the last step's (the tables below carry it).
  static const std::vector<CudaSession::KeptStates> none;
  const std::vector<CudaSession::KeptStates>& kept = keep       ? s.kept_buffers(T)
                                                     : keep_one ? s.kept_snapshot_layers()
                                                                : none;
  const int64_t p0 = s.pos;
  BatchHeader& h = *reinterpret_cast<BatchHeader*>(batch_pinned_);
  std::memset(batch_pinned_, 0, batch_tables_bytes_);
  const int splits = attn_batch_splits(attn_dims(1, s.capacity()));
  for (int j = 0; j < T; ++j) {
    h.tokens[j] = tokens[size_t(j)];
    h.capacity[j] = s.capacity();
    h.splits[j] = splits;
    h.pos[j] = verify_pos_ + j;
    h.rope_delta[j] = s.d_rope_delta;
  }
  h.session_pos = s.d_pos;
  h.keep_token = keep_one ? snapshot_token : 0;
  // TERN_STEP_OMIT=kept (a timing diagnostic): a verify's GDN layers keep no states, so a rollback restores wrong
  // ones (a short call's snapshot is kept all the same).
  const bool keeps = (keep && !step_omits(StepPart::kept)) || keep_one;
  for (size_t i = 0; i < w_->layers.size(); ++i) {
    void** t = reinterpret_cast<void**>(batch_pinned_ + layer_table_offset(i));
    const CudaSession::LayerCache& lc = s.layers[i];
    if (w_->layers[i].type == LayerType::linear_attention) {
      t[0] = lc.conv;
      t[kBatchSlots] = lc.rec;
      t[1] = keeps ? kept[i].conv : nullptr;  // null entries: gdn_decode keeps nothing
      t[kBatchSlots + 1] = keeps ? kept[i].rec : nullptr;
    } else {
      for (int j = 0; j < T; ++j) {
        t[j] = lc.k;
        t[kBatchSlots + j] = lc.v;
      }
    }
  }
  int* pos_pinned = reinterpret_cast<int*>(batch_pinned_ + batch_tables_bytes_ +
                                           kBatchSlots * (sizeof(DeviceSampling) + 4));
  for (int j = 0; j < T; ++j) pos_pinned[j] = int(p0 + j);
  TERN_CUDA(cudaMemcpyAsync(batch_tables_, batch_pinned_, batch_tables_bytes_, cudaMemcpyHostToDevice, stream_));
  TERN_CUDA(cudaMemcpyAsync(verify_pos_, pos_pinned, size_t(T) * 4, cudaMemcpyHostToDevice, stream_));
  if (use_graphs_ && verify_warm_) {
    const std::tuple<int, int64_t, bool> key{T, s.capacity(), keep_one};
    auto found = verify_graphs_.find(key);
    if (found == verify_graphs_.end())
      found = verify_graphs_.emplace(key, capture_graph([&] { verify_body(T, s.capacity(), keep_one); })).first;
    TERN_CUDA(cudaGraphLaunch(found->second, stream_));
  } else {
    verify_body(T, s.capacity(), keep_one);  // kernels set their one-time attributes outside any capture
    verify_warm_ = true;
  }
  s.pos = p0 + T;
  if (keep) s.kept_states_from(p0, T);
}

void CudaRunner::forward_verify(Session& session, std::span<const int32_t> tokens, std::vector<float>& logits) {
  CudaSession& s = own(session);
  check_tokens(s, tokens);
  verify_step(s, tokens);
  const size_t n = tokens.size() * size_t(w_->config.vocab_size);
  logits.resize(n);
  TERN_CUDA(cudaMemcpyAsync(logits.data(), logits_, n * 4, cudaMemcpyDeviceToHost, stream_));
  TERN_CUDA(cudaStreamSynchronize(stream_));
}

// Row j sampled by the sampler a one-token step runs (sample_tokens_device, row j on slot j's scratch), with the
// parameters of step sampling.step + j: the ids forward_sample would return, without copying the logits.
bool CudaRunner::forward_verify_sample(Session& session, std::span<const int32_t> tokens,
                                       const DeviceSampling& sampling, std::vector<int32_t>& ids) {
  CudaSession& s = own(session);
  check_tokens(s, tokens);
  sample_check(sampling);
  TERN_CHECK(sampling.mask == nullptr, "forward_verify_sample: a token mask is the host's (use forward_verify)");
  const int T = int(tokens.size());
  const int64_t V = w_->config.vocab_size;
  // The rows' sampling parameters go first, so that no copy stands between the step's last kernel and the sampler's
  // first (verify_step checks T before it launches anything; the samplers' slots are read by the sampler only).
  allocate_batch_scratch();
  TERN_CHECK(T >= 1 && T <= kBatchSlots, "forward_verify_sample: ", T, " tokens (1 to ", kBatchSlots, ")");
  uint8_t* params_pinned = batch_pinned_ + batch_tables_bytes_;
  for (int j = 0; j < T; ++j) {
    DeviceSampling p = sampling;
    p.step = sampling.step + uint64_t(j);
    std::memcpy(params_pinned + j * sizeof(DeviceSampling), &p, sizeof(DeviceSampling));
  }
  copy_sample_params(params_pinned, T);
  verify_step(s, tokens);
  sample_tokens_device(logits_, V, T, batch_sample_scratch_[0], batch_sample_stride_, batch_sampled_, stream_);
  int* sampled_pinned = reinterpret_cast<int*>(params_pinned + kBatchSlots * sizeof(DeviceSampling));
  TERN_CUDA(cudaMemcpyAsync(sampled_pinned, batch_sampled_, size_t(T) * 4, cudaMemcpyDeviceToHost, stream_));
  TERN_CUDA(cudaStreamSynchronize(stream_));
  ids.assign(sampled_pinned, sampled_pinned + T);
  return true;
}

// Every kernel of a verify step of T tokens of one session (tables already on the device; the session's capacity
// sets the attention grid): slot_layers over the T tokens as one session, the session's position, no sampling. No
// host value depends on the session but its capacity, so one graph per (T, capacity) serves all.
void CudaRunner::verify_body(int T, int64_t capacity, bool keep_one) {
  slot_layers(T, capacity, /*one_session=*/true, keep_one);
  const BatchHeader* dev = reinterpret_cast<const BatchHeader*>(batch_tables_);
  advance_session_kernel<<<1, 1, 0, stream_>>>(&dev->session_pos, T);
  TERN_CUDA_LAUNCHED("advance_session");
}

}  // namespace tern::cuda
