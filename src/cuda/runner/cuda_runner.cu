// The CUDA runner (cuda_runner.h): construction (CudaRunnerOptions and the TERN_* switches), sessions, the forward
// loop over chunks, each through the decode plan (decode_plan.cu) or the prefill plan (prefill_plan.cu), the
// activation scratch and the LM head; the factories.
#include "cuda/runner/cuda_runner.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "core/check.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/step_omit.h"
#include "cuda/kernels/attention/attention.cuh"
#include "cuda/kernels/moe/moe.cuh"
#include "cuda/kernels/moe/moe_decode.cuh"
#include "cuda/kernels/norm/norm.cuh"
#include "cuda/kernels/qmatmul/qmatmul.cuh"
#include "cuda/kernels/qmatmul/qmatmul_int8.cuh"
#include "cuda/kernels/qmatmul/qmatmul_wgmma.cuh"
#include "cuda/kernels/qmv/qmv.cuh"
#include "cuda/kernels/sampling/sampling.cuh"
#include "cuda/runner/cuda_runner_impl.cuh"
#include "cuda/runner/cuda_session.cuh"
#include "cuda/weights/device_weights.cuh"

namespace tern {
namespace cuda {
namespace {

__global__ void advance_position_kernel(int* pos, int n) { *pos += n; }

// A bound of tokens from the environment: the count `name` is set to (0 or more), or `fallback` where it is unset or
// empty.
int token_bound(const char* name, int fallback) {
  const char* e = std::getenv(name);
  return e && *e ? env_count(name, e, 0, INT_MAX, "a count of tokens") : fallback;
}

}  // namespace

CudaRunner::CudaRunner(std::unique_ptr<DeviceWeights> w, std::shared_ptr<const ModelWeights> host,
                       const CudaRunnerOptions& o)
    : w_(std::move(w)), host_(std::move(host)), max_chunk_(std::max<int64_t>(1, o.max_chunk)) {
  TERN_CHECK(o.prefill_pair_sites >= -1 && o.prefill_pair_sites <= kAllSites,
             "prefill_pair_sites must be a mask of the prefill sites (0 to ", int(kAllSites), ") or -1; got ",
             o.prefill_pair_sites);
  TERN_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  allocate_scratch();
  if (host_ && host_->vision) build_vision_plan(*host_->vision);
  TERN_CUDA(cudaMallocHost(&pinned_, 256));
  use_graphs_ = !env_is("TERN_CUDA_GRAPHS", "0");
  // TERN_CUDA_FP32=1: the prefill plan's matrix products and chunked Gated DeltaNet on the fp32 SIMT kernels
  // (slow; for locating precision differences).
  fp32_prefill_ = env_is("TERN_CUDA_FP32", "1");
  // Without the warpgroup kernel (before Hopper, TERN_GPU_PATH=portable, TERN_PREFILL_WGMMA=0) the prefill products
  // take the split-x bf16 tensor-core kernel (x as bf16 hi + lo, the numerics of Hopper's default), or with
  // TERN_PREFILL_INT8=1 the integer kernel (x in 16-bit integers per token: faster, but on trained-scale weights the
  // portable path measured prefill mean KL 2.0e-3 and a 63-token prompt 7.6e-2, perplexity +3.2%; H200,
  // 2026-12-03). TERN_PREFILL_WGMMA=2: the warpgroup kernel with x as bf16 hi + lo (twice the tensor work, 16
  // significant bits) instead of one fp16 term (11).
  const bool wgmma = !env_is("TERN_PREFILL_WGMMA", "0") && !o.exact_prefill && matmul_wgmma_available();
  if (env_is("TERN_PREFILL_INT8", "0") || (!wgmma && !env_is("TERN_PREFILL_INT8", "1"))) {
    prefill_kernel_ = PrefillKernel::split;
  } else if (wgmma) {
    prefill_kernel_ = env_is("TERN_PREFILL_WGMMA", "2") ? PrefillKernel::wgmma_split : PrefillKernel::wgmma_f16;
  } else {
    prefill_kernel_ = PrefillKernel::int8;
  }
  // TERN_PREFILL_EXACT_GATES=0: the GDN gate products (b, a) on the fp16 kernel too.
  exact_gates_ = prefill_kernel_ == PrefillKernel::wgmma_f16 && !env_is("TERN_PREFILL_EXACT_GATES", "0");
  // TERN_PREFILL_ROUTER: how the prefill plan's 8-bit router takes x. exact (default): the integer kernel twice, on
  // x in 16 bits per group of 64 and on the residual quantised again (matmul_quantize_x's residual: x to fp32's
  // precision; the shared-expert gate takes the first term only). q16: the first product alone, whose rounding swapped
  // experts at near-ties (trained-scale weights, 8 layers, 640 positions: prefill mean KL 5.2e-3 against 3.2e-5 with
  // the router in fp32; issue 29, docs/benchmarks.md). fp32: both on the fp32 SIMT kernel.
  if (env_is("TERN_PREFILL_ROUTER", "q16")) router_prefill_ = RouterPrefill::q16;
  if (env_is("TERN_PREFILL_ROUTER", "fp32")) router_prefill_ = RouterPrefill::fp32;
  // TERN_GDN_PREFILL=simt|tf32x3|twopass: the chunked Gated DeltaNet kernel of the prefill plan (default: the
  // fastest that fits; for locating precision differences).
  if (env_is("TERN_GDN_PREFILL", "simt")) gdn_prefill_kernel_ = GdnChunkedKernel::simt;
  if (env_is("TERN_GDN_PREFILL", "tf32x3")) gdn_prefill_kernel_ = GdnChunkedKernel::tf32x3;
  if (env_is("TERN_GDN_PREFILL", "twopass")) gdn_prefill_kernel_ = GdnChunkedKernel::twopass_tf32x3;
  // TERN_PREFILL_F16_SITES (a bit mask of PrefillSite, default 0): the inputs that take x as fp16 (11 significant
  // bits) on the warpgroup kernel; the others take bf16 hi + lo (16 significant bits) on the same kernel. Default:
  // none. On weights at trained scales (router near-ties; 8 layers, 640 positions against transformers in fp32) the
  // fp16 inputs put the prefill's mean KL at 2.7e-3 and 4.4e-3 nats (two seeds, 30 = every site but the GDN
  // in_proj) against 1.7e-3 and 2.2e-5 with none; they save 8% of a 4K prefill (25,977 against 23,863 tok/s, H200,
  // docs/benchmarks.md).
  if (const char* e = std::getenv("TERN_PREFILL_F16_SITES")) f16_sites_ = std::atoi(e) & kAllSites;
  if (o.f16_sites >= 0) f16_sites_ = o.f16_sites & kAllSites;
  // TERN_PREFILL_F16_MIN_TOKENS (default 512): chunks of fewer tokens take bf16 hi + lo at every site. The fp16
  // error concentrates at a sequence's first positions (8 layers against transformers, one seed: 63-65-token
  // prompts mean KL ~8e-4 and perplexity +1.3% on fp16, ~1e-4 and < 0.1% on hi + lo; the same model's 640-token
  // prompt 1.6e-4, +0.08%), and a short chunk is where fp16 saves the least time.
  if (const char* e = std::getenv("TERN_PREFILL_F16_MIN_TOKENS")) f16_min_tokens_ = std::max<int64_t>(0, std::atoll(e));
  if (o.f16_min_tokens >= 0) f16_min_tokens_ = o.f16_min_tokens;
  // TERN_MOE_TILE_TOKENS: the most tokens of the prefill plan's grouped expert tiles (moe_group): auto (the default;
  // moe_tile_tokens: by the chunk's average tokens per expert, where the warpgroup kernel runs the grouped products),
  // or 64, 32 or 16 (forced, for tests and A/Bs; any kernel takes them). On narrow tiles the warpgroup kernel runs
  // blocks of 16 or 32 tokens (m64n16k16, m64n32k16) instead of 64: a short chunk gives each expert few tokens (256
  // tokens: 8 on average), which a 64-token block pads with tensor work. The outputs are the same bits at every width
  // (each output's sums run in the same order; CudaMatmulWgmma.GroupedOutputsAreTheSameBitsAtEveryWidth and
  // CudaRunner.MoeTileWidthsGiveTheSameLogits, H200 2026-12-05). The H200's prefill, ms at 256 / 512 / 1K / 4K tokens:
  // 64-wide 39.8 / 44.9 / 55.8 / 169.1; 32-wide 30.8 / 36.1 / 52.0 / 170.1; 16-wide 28.0 / 36.9 / 55.9 / 191.1.
  if (const char* e = std::getenv("TERN_MOE_TILE_TOKENS")) {
    const std::string v = e;
    moe_tile_tokens_ = v == "auto" ? 0 : v == "16" ? 16 : v == "32" ? 32 : v == "64" ? 64 : -1;
    TERN_CHECK(moe_tile_tokens_ >= 0, "TERN_MOE_TILE_TOKENS must be 16, 32, 64 or auto; got '", v, "'");
  }
  use_decode_kernels_ = !env_is("TERN_CUDA_DECODE_KERNELS", "0");
  // TERN_SHORT_CALL_TOKENS (default 64; 0: off): a forward call of 2 to this many tokens (a short prompt, a chat
  // turn after prefix reuse) runs as verify steps instead of one prefill-plan chunk, whose fixed cost sets a short
  // prompt's time (short_call).
  if (const char* e = std::getenv("TERN_SHORT_CALL_TOKENS")) short_call_tokens_ = std::max<int64_t>(0, std::atoll(e));
  if (const char* e = std::getenv("TERN_SHORT_STEP_TOKENS")) short_step_tokens_ = std::max<int64_t>(2, std::atoll(e));
  // TERN_LAYER_PIECES=0: every prompt chunk runs all its layers in one step (forward_layers refused; the server's
  // scheduler then shrinks the chunk to its budget instead), for the A/B of the admission test.
  layer_pieces_ = !env_is("TERN_LAYER_PIECES", "0");
  // The KV cache in fp16 (11 significant bits) unless the option asks for bf16 (8 bits) or fp8 (4 bits and a scale
  // per row), or TERN_KV_BF16=1 turns the default into bf16, or TERN_KV_DTYPE=f16|bf16|fp8|i16 sets the default's type
  // (measurement switches: the whole-model checks of test_cuda run on any type with them).
  kv_ = o.kv;
  if (kv_ == KvDtype::f16 && env_is("TERN_KV_BF16", "1")) kv_ = KvDtype::bf16;
  if (const char* e = std::getenv("TERN_KV_DTYPE"); e && kv_ == KvDtype::f16) kv_ = kv_dtype_parse(e);
  // The prefill inputs that take x as fp16 hi + lo (matmul_prepare_x_f16x2: x/σ to 22 significant bits, σ a power of
  // two per token) where they would take bf16 hi + lo (16 bits) on the warpgroup kernel (Hopper), for the same tensor
  // work: a bit mask of PrefillSite from CudaRunnerOptions::prefill_pair_sites, else TERN_PREFILL_PAIR_SITES (0 to
  // 31), else with the i16 cache (the choice of fidelity over speed) every site but the MoE down inputs (15) and none
  // with the other caches. On the trained-scale oracle with the i16 cache (H100, docs/benchmarks.md, forty-eighth and
  // forty-ninth sessions) 15 put the 640-position prefill of six seeds within every bar (mean KL 6e-9 to 1.6e-4,
  // perplexity within 0.043%; on the four seeds also run on bf16 hi + lo, 4.4e-5 to 2.2e-4 there), but one seed's
  // 65-token prompt read −0.49% (a near-tie at its position 7 that site 1 meets too). The GDN's input projections
  // alone (1) did as well on those six prefills and ran the 4K prefill 3.3–3.5% faster, but in the CPU emulation (the
  // GDN, the routers and the sums exact) met near-ties on two seeds of five that 15 did not (a third, at one seed's
  // position 356, both met): so 15. Every site (31) met fp32-scale near-ties on 566307818's positions 43–47, and the
  // down inputs are the dearest site (the 4K prefill 1.9% faster with 15 than with 31).
  pair_sites_ = kv_ == KvDtype::i16 ? int(kGdnIn | kAttnIn | kMixerOut | kMoeIn) : 0;
  if (const char* e = std::getenv("TERN_PREFILL_PAIR_SITES"); e && *e)
    pair_sites_ = env_count("TERN_PREFILL_PAIR_SITES", e, 0, int(kAllSites), "a mask of the prefill sites");
  if (o.prefill_pair_sites >= 0) pair_sites_ = o.prefill_pair_sites;
  // TERN_L2_PREFETCH (a bit mask, default 12 = both; the one-token decode plan on Hopper; l2_prefetch.cuh): 4 the MoE
  // gate_up asks L2 for the chosen experts' down matrices; 8 each mixer's output projection for the next layer's
  // first projection; 0 neither.
  if (const char* e = std::getenv("TERN_L2_PREFETCH")) l2_prefetch_ = std::atoi(e) & 12;
  if (!sm90_features()) l2_prefetch_ = 0;  // the bulk prefetch is sm_90+ (a no-op in older code): skip its launches' work
  // TERN_BATCH_DOWN_PREFETCH_TOKENS (default 1: a verify of one token only, which runs the one-token plan's kernels and
  // asks as that plan does): the most tokens a batched or verify step asks L2 for the chosen experts' down matrices
  // with (where TERN_L2_PREFETCH has 4), for an A/B of that bound. The bound was 4 until measured (H100,
  // docs/benchmarks.md, thirty-fourth session): without the request 2 streams run 3.1% and 4 streams 13.3% faster,
  // and a verify of 4 tokens costs 1.75x a plain step instead of 1.96x.
  batch_down_prefetch_tokens_ = token_bound("TERN_BATCH_DOWN_PREFETCH_TOKENS", batch_down_prefetch_tokens_);
  // TERN_BATCH_OUTPUT_AHEAD_TOKENS (default 1: as above): the most tokens a batched or verify step's output projections
  // ask L2 for the next layer's first projection with (where TERN_L2_PREFETCH has 8). A step of several tokens streams
  // more expert bytes between the request and the read than L2 holds; without the request (H200, docs/benchmarks.md,
  // thirty-fifth session) 4 / 8 streams ran ~1% faster and a verify of 4 tokens cost 1.62x a plain step, not 1.67x.
  batch_output_ahead_tokens_ = token_bound("TERN_BATCH_OUTPUT_AHEAD_TOKENS", batch_output_ahead_tokens_);
  allocate_decode_scratch();
  attention_init();  // kernel attributes set once, outside any graph capture
  step_omits(StepPart::in);  // TERN_STEP_OMIT parsed (and a bad name refused) here, outside any capture
  // The batched step's scratch (~80 MB at the model's widths) now, not at the first batched step: what a server
  // plans its sessions from (free_memory_bytes) is then what stays free.
  if (batch_max() >= 2) allocate_batch_scratch();
  // A head shape the attention kernels do not take is refused at load, not at the first step.
  if (std::any_of(w_->layers.begin(), w_->layers.end(),
                  [](const DeviceLayer& l) { return l.type == LayerType::full_attention; }))
    attention_check(attn_dims(1, 1));
}

CudaRunner::~CudaRunner() {
  cudaStreamSynchronize(stream_);
  if (part_way_) *part_way_ = PartWayChunk{};  // its memory goes with the scratch: a session that outlives us holds none
  for (auto& [key, g] : decode_graphs_) cudaGraphExecDestroy(g.exec);
  for (auto& [key, exec] : batch_graphs_) cudaGraphExecDestroy(exec);
  for (auto& [key, exec] : verify_graphs_) cudaGraphExecDestroy(exec);
  if (batch_pinned_) cudaFreeHost(batch_pinned_);
  if (mask_pinned_) cudaFreeHost(mask_pinned_);
  if (mask_device_) cudaFree(mask_device_);
  cudaFreeHost(pinned_);
  cudaStreamDestroy(stream_);
}

int64_t CudaRunner::session_bytes(int64_t max_context) const {
  return int64_t(CudaSession::bytes_for(*w_, max_context, kv_));
}

int64_t CudaRunner::free_memory_bytes() const {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return -1;
  return int64_t(free);
}

std::unique_ptr<Session> CudaRunner::create_session(int64_t max_context) {
  TERN_CHECK(max_context > 0, "session capacity must be positive, got ", max_context);
  TERN_CHECK(max_context < (int64_t(1) << 31), "session capacity ", max_context, " is too large");
  if (!snapshot_buffers_) snapshot_buffers_ = std::make_shared<SnapshotBuffers>(gdn_state_bytes_of(*w_));
  return std::make_unique<CudaSession>(*w_, max_context, kv_, this, ++session_ids_, snapshot_buffers_, kept_pool_,
                                       part_way_);
}

void CudaRunner::forward(Session& session, std::span<const int32_t> tokens, bool all_logits,
                         std::vector<float>& logits) {
  CudaSession& s = own(session);
  check_tokens(s, tokens);
  const int64_t V = w_->config.vocab_size, n = int64_t(tokens.size());
  logits.assign(size_t((all_logits ? n : 1) * V), 0.0f);
  if (short_call(n)) {
    run_short_call(s, tokens, all_logits ? logits.data() : nullptr);
    if (!all_logits)
      TERN_CUDA(cudaMemcpyAsync(logits.data(), logits_, size_t(V) * 4, cudaMemcpyDeviceToHost, stream_));
    TERN_CUDA(cudaStreamSynchronize(stream_));
    return;
  }
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

std::optional<int32_t> CudaRunner::forward_sample(Session& session, std::span<const int32_t> tokens,
                                                  const DeviceSampling& sampling) {
  CudaSession& s = own(session);
  check_tokens(s, tokens);
  sample_check(sampling);
  const int64_t n = int64_t(tokens.size());
  const int64_t V = w_->config.vocab_size;
  // The first decode step runs eagerly: kernels set their one-time attributes outside any graph capture. With
  // activation dumps on, every step does (a graph replay would write no rows).
  if (n == 1 && use_graphs_ && decode_warm_ && !dump_.on()) return decode_graph_step(s, tokens[0], sampling);
  if (n == 1) decode_warm_ = true;
  if (short_call(n)) {
    run_short_call(s, tokens, nullptr);
  } else {
    for (int64_t c0 = 0; c0 < n; c0 += max_chunk_) {
      const int64_t T = std::min(max_chunk_, n - c0);
      run_chunk(s, tokens.subspan(size_t(c0), size_t(T)));
      if (c0 + T == n) lm_head_device(T - 1, 1);
    }
  }
  apply_step_mask(sampling);  // token mask: filled on the host while the forward above runs
  sample_token(logits_, V, sampling, sample_scratch_, sample_out_, stream_);
  params_valid_ = false;  // sample_token wrote its own copy of the parameters
  int32_t id = 0;
  TERN_CUDA(cudaMemcpyAsync(&id, sample_out_, sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
  TERN_CUDA(cudaStreamSynchronize(stream_));
  return id;
}

CudaSession& CudaRunner::own(Session& session) {
  auto* s = dynamic_cast<CudaSession*>(&session);
  TERN_CHECK(s && s->owner == this, "this session was created by another runner");
  return *s;
}

// Every forward checks its tokens here first; a forward drops the states a verify kept (Session::rollback).
void CudaRunner::check_tokens(CudaSession& s, std::span<const int32_t> tokens) {
  TERN_CHECK(!s.holds_part_way() || std::ranges::equal(tokens, s.part_way().tokens),
             "the session holds a prompt chunk part way; its next forward must carry that chunk");
  s.drop_kept_states();
  s.keep_in_call = s.take_keep_request();  // Session::keep_state_at's, for this call (run_short_call) only
  TERN_CHECK(!tokens.empty(), "forward needs at least one token");
  TERN_CHECK(s.pos + int64_t(tokens.size()) <= s.capacity(), "context full: ", s.pos, " + ", tokens.size(),
             " tokens exceed the session capacity of ", s.capacity());
  const int64_t V = w_->config.vocab_size;
  for (int32_t t : tokens) TERN_CHECK(t >= 0 && t < V, "token id ", t, " out of range [0, ", V, ")");
}

void CudaRunner::allocate_scratch() {
  const Config& c = w_->config;
  const int64_t T = max_chunk_, D = c.hidden_size, C = c.conv_channels();
  const int64_t Hv = c.linear_num_value_heads, dv = c.linear_value_head_dim;
  const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, dh = c.head_dim;
  const int E = c.num_experts, k = c.num_experts_per_tok;
  const int64_t F = c.moe_intermediate_size, Fs = c.shared_expert_intermediate_size, V = c.vocab_size;
  const int64_t mixer_gdn = T * (2 * C + 3 * Hv * dv + 4 * Hv);  // in_proj out [C | z | b | a], conv, o, gated, g, β
  const int64_t attn_parts = attn_partial_floats(T, int(Hq), int(dh));  // split-KV partials of the decode plan
  const int64_t mixer_attn = T * (Hq * 2 * dh + 2 * Hkv * dh + 2 * Hq * dh) + attn_parts;
  const int64_t floats = 2 * T * D + std::max(mixer_gdn, mixer_attn) + T * E + T * k + T +
                         T * k * (2 * F + D) + T * (2 * Fs + D) + kLmRows * V + sample_scratch_floats(V);
  const int64_t ints = T + T * k + moe_group_ints(T, E, k) + 1;
  // The split activations of every prefill product input: normed x, the GDN and attention outputs, h of the experts.
  // (fp16 hi + lo's rows are at least as long as bf16 hi + lo's: their tails are padded to 128 bytes.)
  prep_bytes_ = size_t(std::max({matmul_f16x2_bytes(T, D), matmul_f16x2_bytes(T, Hv * dv),
                                 matmul_f16x2_bytes(T, Hq * dh), matmul_f16x2_bytes(T * k, F),
                                 matmul_f16x2_bytes(T, Fs)}));
  prep_q16_bytes_ = size_t(matmul_q16_bytes(T, D));
  // A chunk part way (forward_layers): its rows [T, D] and a snapshot's worth of Gated DeltaNet states.
  const size_t part_way_bytes = size_t(T * D) * 4 + gdn_state_bytes_of(*w_);
  scratch_ = DeviceArena(size_t(floats) * 4 + size_t(ints) * 4 + prep_bytes_ + 2 * prep_q16_bytes_ + part_way_bytes +
                             66 * 256,
                         "activation scratch");
  part_way_ = std::make_shared<PartWayChunk>();
  part_way_->hidden = scratch_.take_n<float>(size_t(T * D));
  part_way_->gdn_before = static_cast<uint8_t*>(scratch_.take(gdn_state_bytes_of(*w_)));
  hidden_ = scratch_.take_n<float>(size_t(T * D));
  normed_ = scratch_.take_n<float>(size_t(T * D));
  float* mixer = scratch_.take_n<float>(size_t(std::max(mixer_gdn, mixer_attn)));
  // Gated DeltaNet view of the mixer scratch.
  in_proj_out_ = mixer;  // [T, C + Hv·dv + 2·Hv]: qkv_raw | z | b | a
  conv_out_ = in_proj_out_ + T * (C + Hv * dv + 2 * Hv);
  o_ = conv_out_ + T * C;
  gated_ = o_ + T * Hv * dv;
  g_ = gated_ + T * Hv * dv;
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
  prep_q16_rest_ = scratch_.take(prep_q16_bytes_);
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

GdnDims CudaRunner::gdn_dims(int64_t T) const { return gdn_dims_of(w_->config, T); }

AttnDims CudaRunner::attn_dims(int64_t T, int64_t capacity) const {
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
  d.kv = kv_;
  return d;
}

// Chunks of at most this many tokens run the decode plan (fused decode kernels); longer ones the prefill plan.
bool CudaRunner::decode_plan(int64_t T) const {
  return use_decode_kernels_ && T <= std::min<int64_t>(kQmvMaxTokens, max_chunk_) &&
         w_->config.shared_expert_intermediate_size == w_->config.moe_intermediate_size;
}

// Whether a forward call of n tokens runs as verify steps (run_short_call): 2 to short_call_tokens_ tokens, no image
// rows (chunk_body inserts those), no activation dumps, and the batched kernels present. Measured on the H200 (28
// tokens): the prefill plan's one chunk 24.9 ms, decode-plan chunks of 8 tokens 30.5 ms (docs/benchmarks.md).
bool CudaRunner::short_call(int64_t n) const {
  return n >= 2 && n <= short_call_tokens_ && !image_call_ && !dump_.on() && supports_verify();
}

// A short call's tokens as verify steps of up to max_step_tokens() without kept states: the batched step's kernels
// in a CUDA graph, each row bit for bit its token's one-token step. all_rows: every row's logits [n, V] to the host
// (else none). Leaves the last token's logits in row 0 of logits_ (device), as lm_head_device(T - 1, 1) does.
void CudaRunner::run_short_call(CudaSession& s, std::span<const int32_t> tokens, float* all_rows) {
  const int64_t V = w_->config.vocab_size, n = int64_t(tokens.size()), p0 = s.pos;
  // Session::keep_state_at inside the call: the step that holds it writes the states there into a snapshot.
  const int64_t keep_at = std::exchange(s.keep_in_call, -1);
  const bool keep = keep_at > p0 && keep_at < p0 + n && gdn_decode_keeps_one(gdn_tickets_ != nullptr);
  if (keep) s.begin_kept_snapshot(keep_at);
  int64_t T = 0;
  for (int64_t c0 = 0; c0 < n; c0 += T) {
    T = std::min<int64_t>(max_step_tokens(), n - c0);
    const int64_t t_keep = keep_at - (p0 + c0);  // the kept state's token in this step, when in [0, T)
    verify_step(s, tokens.subspan(size_t(c0), size_t(T)), /*keep=*/false,
                keep && t_keep >= 0 && t_keep < T ? int(t_keep) : -1);
    if (all_rows)
      TERN_CUDA(cudaMemcpyAsync(all_rows + c0 * V, logits_, size_t(T * V) * 4, cudaMemcpyDeviceToHost, stream_));
    TERN_CUDA(cudaStreamSynchronize(stream_));  // the next verify_step writes its pinned tables again
  }
  if (T > 1)
    TERN_CUDA(cudaMemcpyAsync(logits_, logits_ + (T - 1) * V, size_t(V) * 4, cudaMemcpyDeviceToDevice, stream_));
  device_token_valid_ = false;
  if (keep) s.kept_snapshot_done();  // its step has run (each step above ends with a synchronisation)
}

// A chunk the session holds part way (forward_layers) goes on from the layer its last piece reached.
void CudaRunner::run_chunk(CudaSession& s, std::span<const int32_t> tokens) {
  const int64_t T = int64_t(tokens.size());
  int l0 = 0;
  if (s.holds_part_way()) {
    PartWayChunk& pw = s.part_way();
    TERN_INTERNAL_CHECK(!image_call_ && std::ranges::equal(tokens, pw.tokens),
                        "cuda forward: a chunk part way resumed with other tokens or images");
    TERN_CUDA(cudaMemcpyAsync(hidden_, pw.hidden, size_t(T * w_->config.hidden_size) * 4, cudaMemcpyDeviceToDevice,
                              stream_));
    l0 = pw.done;
    s.release_part_way();
  } else {
    TERN_CUDA(cudaMemcpyAsync(tokens_, tokens.data(), size_t(T) * 4, cudaMemcpyHostToDevice, stream_));
  }
  device_token_valid_ = false;
  chunk_f16_sites_ = T >= f16_min_tokens_ ? f16_sites_ : 0;
  chunk_body(s, T, l0);
  s.pos += T;
}

// A chunk of `tokens` in pieces of layers: where the chunk runs the prefill plan (longer than a short call and
// kQmvMaxTokens, at most max_chunk_) and the runner's PartWayChunk is free or this session's.
bool CudaRunner::runs_layers_apart(const Session& session, int64_t tokens) const {
  const auto* s = dynamic_cast<const CudaSession*>(&session);
  return layer_pieces_ && s && s->owner == this && part_way_ && part_way_->hidden && !s->keep_requested() &&
         (part_way_->holder == 0 || part_way_->holder == s->id) &&
         tokens >= 2 && tokens <= max_chunk_ && !short_call(tokens) && !decode_plan(tokens) && !dump_.on() &&
         w_->layers.size() >= 2;
}

// The first piece keeps the session's Gated DeltaNet states (drop_pending_layers) and embeds the tokens; each piece
// runs its layers from the rows the last one parked and parks them again, then waits for the device, so that a fault
// is this call's and not the next step's (another request's). A first piece that fails leaves the session as before.
void CudaRunner::forward_layers(Session& session, std::span<const int32_t> tokens, int layers) {
  CudaSession& s = own(session);
  const bool first = !s.holds_part_way();
  try {
    run_layers_piece(s, tokens, layers);
  } catch (...) {
    if (first && s.holds_part_way()) {
      try {
        s.drop_pending_layers();
      } catch (...) {
        s.release_part_way();
      }
    }
    throw;
  }
}

void CudaRunner::run_layers_piece(CudaSession& s, std::span<const int32_t> tokens, int layers) {
  const int64_t T = int64_t(tokens.size()), D = w_->config.hidden_size;
  const int L = int(w_->layers.size());
  PartWayChunk& pw = *part_way_;
  const bool first = !s.holds_part_way();
  TERN_CHECK(!first || runs_layers_apart(s, T), "cuda forward_layers: a chunk of ", T,
             " tokens does not run in pieces here");
  const int done = first ? 0 : pw.done;
  TERN_CHECK(layers >= 1 && done + layers < L, "cuda forward_layers: ", layers, " more layers of a chunk at layer ",
             done, " of ", L, " (the last layers run in a forward call)");
  check_tokens(s, tokens);  // a later piece: the chunk's own tokens
  if (first) {
    s.copy_states_out(pw.gdn_before, stream_);
    TERN_CUDA(cudaMemcpyAsync(tokens_, tokens.data(), size_t(T) * 4, cudaMemcpyHostToDevice, stream_));
    embed_lookup(w_->embed, tokens_, T, hidden_, stream_);
    pw.tokens.assign(tokens.begin(), tokens.end());
    pw.done = 0;
    pw.holder = s.id;
  } else {
    TERN_CUDA(cudaMemcpyAsync(hidden_, pw.hidden, size_t(T * D) * 4, cudaMemcpyDeviceToDevice, stream_));
  }
  device_token_valid_ = false;
  chunk_f16_sites_ = T >= f16_min_tokens_ ? f16_sites_ : 0;
  prefill_layers(s, T, done, done + layers);
  TERN_CUDA(cudaMemcpyAsync(pw.hidden, hidden_, size_t(T * D) * 4, cudaMemcpyDeviceToDevice, stream_));
  TERN_CUDA(cudaStreamSynchronize(stream_));
  pw.done = done + layers;
}

// Every kernel of one chunk of T tokens (already in tokens_) from layer l0 (> 0: a chunk part way, its rows in
// hidden_); no host value depends on the step, so a T = 1 body can be captured once in a CUDA graph and replayed.
void CudaRunner::chunk_body(CudaSession& s, int64_t T, int l0) {
  if (l0 == 0) {
    embed_lookup(w_->embed, tokens_, T, hidden_, stream_);
    insert_image_rows(s, T);
  }
  if (decode_plan(T)) {
    TERN_INTERNAL_CHECK(l0 == 0, "cuda forward: a chunk of the decode plan part way");
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
  prefill_layers(s, T, l0, int(w_->layers.size()));
  advance_position_kernel<<<1, 1, 0, stream_>>>(s.d_pos, int(T));
  TERN_CUDA_LAUNCHED("advance_position");
}

// The prefill plan's layers [l0, l1) over hidden_ [T, D]; the session's position is that of the chunk's first token.
void CudaRunner::prefill_layers(CudaSession& s, int64_t T, int l0, int l1) {
  for (size_t i = size_t(l0); i < size_t(l1); ++i) {
    const DeviceLayer& l = w_->layers[i];
    CudaSession::LayerCache& lc = s.layers[i];
    if (l.type == LayerType::linear_attention) {  // each block normalises its input (norm_prepare)
      gdn_mixer(l, lc, T);
    } else {
      attention_mixer(l, lc, s, T, s.capacity());
    }
    dump_layer("mixer_res", i, T);
    moe(l, T);
    dump_layer("layer_out", i, T, route_ids_);
  }
}

// Activation dumps (activation_dump.cuh): the residual hidden_ [T, D] of layer i under `base`, and with ids the
// layer's routing [T, k]. Never while a graph is being captured.
void CudaRunner::dump_layer(const char* base, size_t i, int64_t T, const int* ids) {
  if (!dump_.on() || capturing_) return;
  std::string suffix(".");
  suffix += std::to_string(i);
  dump_.add(std::string(base).append(suffix), hidden_, T, w_->config.hidden_size, stream_);
  if (ids) dump_.add_ids(std::string("route_ids").append(suffix), ids, T, w_->config.num_experts_per_tok, stream_);
}

// Logits of chunk rows [r0, r0 + n) into logits_ (device), n <= kLmRows.
void CudaRunner::lm_head_device(int64_t r0, int64_t n) {
  const Config& c = w_->config;
  const int64_t D = c.hidden_size;
  if (step_omits(StepPart::head)) {
    // left out (TERN_STEP_OMIT)
  } else if (n <= kQmvMaxTokens && use_decode_kernels_) {
    qmv_into(w_->lm_head, hidden_ + r0 * D, D, n, w_->final_norm, logits_, c.vocab_size);
  } else {
    rmsnorm(hidden_ + r0 * D, w_->final_norm, float(c.rms_norm_eps), n, D, normed_, stream_);
    proj(w_->lm_head, normed_, n, logits_);
  }
  mask_padding(logits_, n, c.vocab_size, w_->vocab_real, stream_);
}

void CudaRunner::lm_head_rows(int64_t r0, int64_t n, float* host) {
  const int64_t V = w_->config.vocab_size;
  for (int64_t i = 0; i < n; i += kLmRows) {
    const int64_t m = std::min(kLmRows, n - i);
    lm_head_device(r0 + i, m);
    TERN_CUDA(cudaMemcpyAsync(host + i * V, logits_, size_t(m * V) * 4, cudaMemcpyDeviceToHost, stream_));
    TERN_CUDA(cudaStreamSynchronize(stream_));
  }
}

}  // namespace cuda

namespace {

using namespace tern::cuda;

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
  auto runner = std::make_unique<CudaRunner>(std::move(dw), nullptr, options);
  if (options.synthetic_vision) runner->attach_synthetic_vision(*options.synthetic_vision, seed);
  return runner;
}

int64_t cuda_runner_batched_steps(const ModelRunner& runner) {
  const auto* r = dynamic_cast<const CudaRunner*>(&runner);
  return r ? r->batched_steps() : 0;
}

int cuda_device_count() { return device_count(); }
std::string cuda_device_name() { return device_count() > 0 ? device_description() : std::string("no CUDA device"); }

CudaKeptStatePool cuda_runner_kept_state_pool(const ModelRunner& runner) {
  const auto* r = dynamic_cast<const CudaRunner*>(&runner);
  if (!r) return {};
  return {.held_bytes = int64_t(r->kept_pool().held_bytes()), .in_use_bytes = int64_t(r->kept_pool().in_use_bytes())};
}

int64_t cuda_runner_weight_bytes(const ModelRunner& runner) {
  const auto* r = dynamic_cast<const CudaRunner*>(&runner);
  return r ? r->weight_bytes() : 0;
}

}  // namespace tern
