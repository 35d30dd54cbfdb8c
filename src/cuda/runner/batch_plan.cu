// The batched decode step of the CUDA runner (cuda_runner_impl.cuh): forward_batch runs one new token of each of up
// to batch_max() sessions in one step (the server's parallel streams), through the one-token kernels of the decode
// plan with a batch index added (qmv_dp4a_batched, gdn_decode_batched, attn_prepare_batched / attention_batched,
// moe_decode_batched): every session's token goes through exactly the arithmetic of its step alone
// (decode_plan.cu), so its sampled id is bit for bit the same whatever the batch. The weights are read once per
// step for all the tokens. Each session's caches, states and position come from device tables that every step
// fills through pinned memory (one copy), so one CUDA graph per (batch size, largest capacity) serves any sessions.
//
// Entries the batched kernels do not take run alone (ModelRunner::forward_alone): several tokens (a prompt chunk),
// logits asked for instead of a device sample, a token mask (constrained decoding: its host work overlaps a step
// of its own), and every entry when a model's shapes or the switches keep the one-token kernels off.
#include "cuda/runner/cuda_runner_impl.cuh"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/step_omit.h"
#include "cuda/kernels/attention/attention.cuh"
#include "cuda/kernels/gdn/gdn.cuh"
#include "cuda/kernels/moe/moe_decode.cuh"
#include "cuda/kernels/norm/norm.cuh"
#include "cuda/kernels/qmv/qmv.cuh"
#include "cuda/kernels/qmv/qmv_dp4a.cuh"
#include "cuda/kernels/qmv/qmv_dp4a_mma.cuh"
#include "cuda/kernels/sampling/sampling.cuh"
#include "cuda/runner/batch_tables.cuh"

namespace tern::cuda {
namespace {

constexpr int kSlots = kBatchSlots;

__global__ void advance_positions_kernel(int* const* pos, int B) {
  const int b = int(threadIdx.x);
  if (b < B) *pos[b] += 1;
}

}  // namespace

// The batch size a step takes at most; 0 when the batched kernels do not apply (then every entry runs alone). Read
// per call: tests switch qmv's variant at run time.
int CudaRunner::batch_max() const {
  if (!use_decode_kernels_ || !decode_plan(1) || max_chunk_ < 2) return 0;
  auto integer = [&](const DMat& m, const float* norm) {
    return !m.empty() && qmv_takes_dp4a(decode_product(m, hidden_, m.cols, 1, norm, logits_, m.rows));
  };
  if (!integer(w_->lm_head, w_->final_norm)) return 0;
  for (size_t i = 0; i < w_->layers.size(); ++i) {
    const DeviceLayer& l = w_->layers[i];
    const bool mixer = l.type == LayerType::linear_attention
                           ? gdn_decode_supported(gdn_dims(1)) && l.in_proj_all.rows > 0 &&
                                 integer(l.in_proj_all, l.input_norm) && integer(l.out_proj, nullptr)
                           : l.attn_qkv.rows > 0 && integer(l.attn_qkv, l.input_norm) && integer(l.o_proj, nullptr);
    if (!mixer || !moe_decode_batched_supported(moe_w_[i])) return 0;
  }
  return int(std::min<int64_t>(kSlots, max_chunk_));
}

// Whether an entry can join the batched step: one token (no image's), sampled on the device without a token mask.
bool CudaRunner::batch_joins(const BatchEntry& e) const {
  return e.session && e.tokens.size() == 1 && e.images.empty() && e.sampling && !e.sampling->mask && !dump_.on();
}

void CudaRunner::forward_batch(std::span<BatchEntry> batch) {
  check_distinct_sessions(batch);
  const int max_b = batch_max();
  std::vector<BatchEntry*> together;
  for (BatchEntry& e : batch) {
    if (max_b < 2 || !batch_joins(e)) {
      forward_alone(e);
      continue;
    }
    e.sampled.reset();
    e.error = nullptr;
    e.layers_left = 0;
    try {
      CudaSession& s = own(*e.session);
      check_tokens(s, e.tokens);
      sample_check(*e.sampling);
      together.push_back(&e);
    } catch (...) {
      e.error = std::current_exception();
    }
  }
  for (size_t i = 0; i < together.size(); i += size_t(max_b)) {
    const size_t n = std::min(together.size() - i, size_t(max_b));
    if (n == 1) {
      forward_alone(*together[i]);
      continue;
    }
    const std::span<BatchEntry* const> step(together.data() + i, n);
    try {
      batch_step(step);
    } catch (...) {
      for (BatchEntry* e : step) e->error = std::current_exception();
    }
  }
}

// Allocated with the runner when the batched kernels apply (else at the first batched step, should a test switch
// them on later).
void CudaRunner::allocate_batch_scratch() {
  if (batch_tables_) return;
  const Config& c = w_->config;
  const int B = kSlots;
  const int64_t V = c.vocab_size, Hv = c.linear_num_value_heads, dv = c.linear_value_head_dim;
  const int Hq = c.num_attention_heads, dh = c.head_dim;
  const size_t moe_bytes = moe_decode_scratch_bytes(B, c.hidden_size, c.num_experts, c.num_experts_per_tok,
                                                    c.moe_intermediate_size);
  const int64_t floats = B * proj_cols_ + B * Hv * dv + 2 * B * Hq * dh + attn_batch_partial_floats(B, Hq, dh) +
                         B * sample_scratch_floats(V);
  // The quantised activations of slot_layers' products: hidden's, and the mixers' outputs' (the wider of the two).
  const size_t xq_hidden = DeviceArena::align(qmv_dp4a_mma_scratch_bytes(B, c.hidden_size));
  const size_t xq_mixer = DeviceArena::align(qmv_dp4a_mma_scratch_bytes(B, std::max(Hv * dv, int64_t(Hq) * dh)));
  batch_tables_bytes_ = layer_table_offset(w_->layers.size());
  batch_scratch_ = DeviceArena(size_t(floats) * 4 + moe_bytes + batch_tables_bytes_ + 2 * B * 4 + xq_hidden +
                                   xq_mixer + (B + 18) * 256,
                               "batched step scratch");
  batch_proj_ = batch_scratch_.take_n<float>(size_t(B * proj_cols_));
  batch_gated_ = batch_scratch_.take_n<float>(size_t(B * Hv * dv));
  batch_q_ = batch_scratch_.take_n<float>(size_t(B * Hq * dh));
  batch_attn_out_ = batch_scratch_.take_n<float>(size_t(B * Hq * dh));
  batch_attn_part_ = batch_scratch_.take_n<float>(size_t(attn_batch_partial_floats(B, Hq, dh)));
  batch_moe_ = moe_decode_scratch_view(batch_scratch_.take(moe_bytes), B, c.hidden_size, c.num_experts,
                                       c.num_experts_per_tok, c.moe_intermediate_size);
  moe_decode_scratch_init(batch_moe_, stream_);
  if (step_omits(StepPart::router))  // TERN_STEP_OMIT: a routing as the router's would spread the experts
    moe_decode_scratch_stand_in_routing(batch_moe_, B, c.num_experts, c.num_experts_per_tok, stream_);
  // One sampler scratch per slot, at a fixed stride (sample_tokens_device samples every slot in one launch each).
  batch_sample_stride_ = int64_t(DeviceArena::align(size_t(sample_scratch_floats(V)) * 4) / 4);
  float* const samplers = batch_scratch_.take_n<float>(size_t(B * batch_sample_stride_));
  batch_sample_scratch_.clear();
  for (int b = 0; b < B; ++b) batch_sample_scratch_.push_back(samplers + b * batch_sample_stride_);
  batch_sampled_ = batch_scratch_.take_n<int>(size_t(B));
  verify_pos_ = batch_scratch_.take_n<int>(size_t(B));
  batch_xq_hidden_bytes_ = xq_hidden;
  batch_xq_hidden_ = xq_hidden ? batch_scratch_.take(xq_hidden) : nullptr;
  batch_xq_mixer_bytes_ = xq_mixer;
  batch_xq_mixer_ = xq_mixer ? batch_scratch_.take(xq_mixer) : nullptr;
  // Zeros: a tile's token slots past a step's B are read (their outputs never written) before any step writes them.
  if (batch_xq_hidden_) TERN_CUDA(cudaMemsetAsync(batch_xq_hidden_, 0, xq_hidden, stream_));
  if (batch_xq_mixer_) TERN_CUDA(cudaMemsetAsync(batch_xq_mixer_, 0, xq_mixer, stream_));
  batch_tables_ = static_cast<uint8_t*>(batch_scratch_.take(batch_tables_bytes_));
  // Pinned: the tables, then B sampling parameters, B sampled ids, B verify positions.
  TERN_CUDA(cudaMallocHost(&batch_pinned_, batch_tables_bytes_ + B * (sizeof(DeviceSampling) + 8)));
  TERN_CUDA(cudaStreamSynchronize(stream_));
}

// One step over entries (2..batch_max(), checked by forward_batch): the tables and sampling parameters to the
// device, the graph of this batch size (captured on first use, after one step outside capture), the sampled ids back.
void CudaRunner::batch_step(std::span<BatchEntry* const> entries) {
  allocate_batch_scratch();
  const int B = int(entries.size());
  const int64_t V = w_->config.vocab_size;
  BatchHeader& h = *reinterpret_cast<BatchHeader*>(batch_pinned_);
  std::memset(batch_pinned_, 0, batch_tables_bytes_);
  int64_t max_capacity = 0;
  for (int b = 0; b < B; ++b) {
    CudaSession& s = own(*entries[size_t(b)]->session);
    h.tokens[b] = entries[size_t(b)]->tokens[0];
    h.capacity[b] = s.capacity();
    h.splits[b] = attn_batch_splits(attn_dims(1, s.capacity()));
    h.pos[b] = s.d_pos;
    h.rope_delta[b] = s.d_rope_delta;
    max_capacity = std::max(max_capacity, s.capacity());
    for (size_t i = 0; i < w_->layers.size(); ++i) {
      void** t = reinterpret_cast<void**>(batch_pinned_ + layer_table_offset(i));
      const CudaSession::LayerCache& lc = s.layers[i];
      const bool gdn = w_->layers[i].type == LayerType::linear_attention;
      t[b] = gdn ? static_cast<void*>(lc.conv) : static_cast<void*>(lc.k);
      t[kSlots + b] = gdn ? static_cast<void*>(lc.rec) : static_cast<void*>(lc.v);
    }
  }
  TERN_CUDA(cudaMemcpyAsync(batch_tables_, batch_pinned_, batch_tables_bytes_, cudaMemcpyHostToDevice, stream_));
  uint8_t* params_pinned = batch_pinned_ + batch_tables_bytes_;
  for (int b = 0; b < B; ++b) {
    DeviceSampling p = *entries[size_t(b)]->sampling;
    p.mask = nullptr;  // a host pointer: not part of what the device reads
    std::memcpy(params_pinned + b * sizeof(DeviceSampling), &p, sizeof(DeviceSampling));
  }
  copy_sample_params(params_pinned, B);
  if (use_graphs_ && batch_warm_) {
    const std::pair<int, int64_t> key{B, max_capacity};
    auto found = batch_graphs_.find(key);
    if (found == batch_graphs_.end())
      found = batch_graphs_.emplace(key, capture_graph([&] { batch_body(B, max_capacity); })).first;
    TERN_CUDA(cudaGraphLaunch(found->second, stream_));
  } else {
    batch_body(B, max_capacity);  // kernels set their one-time attributes outside any capture
    batch_warm_ = true;
  }
  int* sampled_pinned = reinterpret_cast<int*>(params_pinned + kSlots * sizeof(DeviceSampling));
  TERN_CUDA(cudaMemcpyAsync(sampled_pinned, batch_sampled_, size_t(B) * 4, cudaMemcpyDeviceToHost, stream_));
  TERN_CUDA(cudaStreamSynchronize(stream_));
  for (int b = 0; b < B; ++b) {
    BatchEntry& e = *entries[size_t(b)];
    own(*e.session).pos += 1;
    e.sampled = sampled_pinned[b];
  }
  ++batched_steps_;
}

// Every kernel of a batched step of B sessions (tables already on the device): slot_layers, the positions, one
// sampler per session. No host value depends on the sessions but B and the largest capacity (the attention grid's
// splits).
void CudaRunner::batch_body(int B, int64_t max_capacity) {
  const int64_t V = w_->config.vocab_size;
  slot_layers(B, max_capacity, /*one_session=*/false);
  advance_positions_kernel<<<1, kSlots, 0, stream_>>>(reinterpret_cast<const BatchHeader*>(batch_tables_)->pos, B);
  TERN_CUDA_LAUNCHED("advance_positions");
  sample_tokens_device(logits_, V, B, batch_sample_scratch_[0], batch_sample_stride_, batch_sampled_, stream_);
}

// The sampling parameters of slots 0..n-1 (pinned, packed) into their samplers' scratch: one strided copy.
void CudaRunner::copy_sample_params(const uint8_t* params_pinned, int n) {
  const int64_t V = w_->config.vocab_size;
  TERN_CUDA(cudaMemcpy2DAsync(sample_params_slot(batch_sample_scratch_[0], V), size_t(batch_sample_stride_) * 4,
                              params_pinned, sizeof(DeviceSampling), sizeof(DeviceSampling), size_t(n),
                              cudaMemcpyHostToDevice, stream_));
}

// The kernels the multi-token steps share (batch_body, verify_body; the tables on the device): embed, each layer as
// the decode plan runs it for one token (decode_plan.cu) with the slot index, the LM head over the B slots.
// one_session: the slots are one session's consecutive tokens (a verify step): the GDN layers run gdn_decode over
// them in order (keeping each token's states, verify_plan.cu), and attention slot j reads the rows slots 0..j-1
// write in this step. Otherwise each slot is its own session.
void CudaRunner::slot_layers(int B, int64_t capacity, bool one_session, bool keep_one) {
  const Config& c = w_->config;
  const int64_t D = c.hidden_size, V = c.vocab_size;
  const BatchHeader* dev = reinterpret_cast<const BatchHeader*>(batch_tables_);
  embed_lookup(w_->embed, dev->tokens, B, hidden_, stream_);
  // Every product's B tokens are quantised once into its scratch (hidden's or the mixers'): by the kernel before it
  // (producer tables, qmv_dp4a_producer_tables(): the MoE down for the next layer's first product and the LM head,
  // the GDN core for out_proj, the attention merge for o_proj; `written` says they did) or by the product's own
  // pre-quantising kernel. (part: which TERN_STEP_OMIT part the product is, step_omit.h.)
  // One token (a verify of one token; the batched step has B >= 2): its products are qmv_dp4a's one-token kernel,
  // which quantises its own input, so no kernel writes tables for it.
  const bool producer_tables = qmv_dp4a_producer_tables() && B >= 2;
  auto product = [&](StepPart part, QmvArgs a, bool mixer, bool written) {
    if (step_omits(part)) return;
    a.xq = mixer ? batch_xq_mixer_ : batch_xq_hidden_;
    a.xq_bytes = mixer ? batch_xq_mixer_bytes_ : batch_xq_hidden_bytes_;
    a.xq_written = written;
    qmv_dp4a_batched(a, B, stream_);
  };
  // The first product of layer i (in_proj or q|k|v), or for i = the layer count the LM head: what the MoE down
  // before it writes the tables for.
  auto first_product = [&](size_t i) {
    if (i == w_->layers.size()) return decode_product(w_->lm_head, hidden_, D, 1, w_->final_norm, logits_, V);
    const DeviceLayer& l = w_->layers[i];
    return l.type == LayerType::linear_attention
               ? decode_product(l.in_proj_all, hidden_, D, 1, l.input_norm, batch_proj_, proj_cols_)
               : decode_product(l.attn_qkv, hidden_, D, 1, l.input_norm, batch_proj_, proj_cols_);
  };
  bool hidden_written = false;  // the last MoE down wrote hidden's tables for the next product
  for (size_t i = 0; i < w_->layers.size(); ++i) {
    const DeviceLayer& l = w_->layers[i];
    void* const* table = reinterpret_cast<void* const*>(batch_tables_ + layer_table_offset(i));
    if (l.type == LayerType::linear_attention) {
      const int64_t Z = int64_t(c.linear_num_value_heads) * c.linear_value_head_dim;
      product(StepPart::in, first_product(i), false, hidden_written);
      GdnDecodeArgs g = gdn_decode_args(l, one_session ? B : 1, batch_proj_, batch_gated_);
      float* const* states = reinterpret_cast<float* const*>(table);
      bool gated_written = false;
      if (!step_omits(StepPart::gdn)) {
        if (producer_tables) g.out_tables = static_cast<uint8_t*>(batch_xq_mixer_);
        if (one_session) {
          gated_written = gdn_decode_from_tables(g, states, states + kSlots, states + 1, states + kSlots + 1,
                                                 keep_one ? &dev->keep_token : nullptr, stream_);
        } else {
          gated_written = gdn_decode_batched(g, B, states, states + kSlots, stream_);
        }
      }
      product(StepPart::out,
              decode_product(l.out_proj, batch_gated_, Z, 1, nullptr, hidden_, D, true, batch_ahead(l, B)), true,
              gated_written);
    } else {
      const AttnDims d = attn_dims(1, capacity);
      const int64_t Q = int64_t(d.Hq) * 2 * d.dh, KV = int64_t(d.Hkv) * d.dh;
      product(StepPart::in, first_product(i), false, hidden_written);
      AttnBatch ab;
      ab.B = B;
      ab.ld_qkv = proj_cols_;
      ab.pos0 = dev->pos;
      ab.cache_k = table;
      ab.cache_v = table + kSlots;
      ab.splits = dev->splits;
      ab.capacity = dev->capacity;
      ab.rope_delta = dev->rope_delta;
      ab.one_session = one_session;
      ab.out_tables = producer_tables ? static_cast<uint8_t*>(batch_xq_mixer_) : nullptr;
      const bool attended = !step_omits(StepPart::attention);
      if (attended) {
        attn_prepare_batched(batch_proj_, batch_proj_ + Q, batch_proj_ + Q + KV, l.q_norm, l.k_norm, ab, d,
                             batch_q_, stream_);
        attention_batched(batch_q_, batch_proj_, ab, d, batch_attn_part_, batch_attn_out_, stream_);
      }
      product(StepPart::out, decode_product(l.o_proj, batch_attn_out_, int64_t(d.Hq) * d.dh, 1, nullptr, hidden_, D,
                                            true, batch_ahead(l, B)),
              true, attended && ab.out_tables);
    }
    // The gate_up's L2 request for the chosen experts' down matrices (a hint: results unchanged): by default only in a
    // step of one token (B <= batch_down_prefetch_tokens_, 1; measured slower at 2 to 4 tokens).
    MoeDecodeWeights m = moe_w_[i];
    m.prefetch_down = m.prefetch_down && B <= batch_down_prefetch_tokens_;
    MoeTablesOut next;
    if (producer_tables) {
      const QmvArgs n = first_product(i + 1);
      next = MoeTablesOut{static_cast<uint8_t*>(batch_xq_hidden_), n.norm_w, n.eps};
    }
    hidden_written = moe_decode_batched(m, hidden_, B, batch_moe_, stream_, next);
  }
  product(StepPart::head, first_product(w_->layers.size()), false, hidden_written);
  mask_padding(logits_, B, V, w_->vocab_real, stream_);
}

}  // namespace tern::cuda
