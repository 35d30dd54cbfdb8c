// CudaRunner, the ModelRunner behind cuda_runner.h, defined once for the runner's files, one role each:
// cuda_runner.cu (construction and options, sessions, the forward loop, activation scratch, the LM head),
// decode_plan.cu (chunks of at most kQmvMaxTokens tokens: the fused decode kernels, one CUDA graph per step, the
// token mask), batch_plan.cu (one token of each of several sessions in one step: forward_batch) and prefill_plan.cu
// (longer chunks: the prepared inputs of the prefill products, the mixers and the MoE block); vision_plan.cu holds
// encode_image (the vision encoder, VisionPlan). Included by those files only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/common/cuda_common.cuh"
#include "cuda/common/l2_ranges.h"
#include "cuda/kernels/attention/attention.cuh"
#include "cuda/kernels/gdn/gdn.cuh"
#include "cuda/kernels/moe/moe.cuh"
#include "cuda/kernels/moe/moe_decode.cuh"
#include "cuda/kernels/qmv/qmv.cuh"
#include "cuda/kernels/qmatmul/qmatmul.cuh"
#include "cuda/runner/activation_dump.cuh"
#include "cuda/runner/cuda_runner.h"
#include "cuda/runner/cuda_session.cuh"
#include "cuda/runner/step_timer.cuh"
#include "cuda/runner/vision_plan.cuh"
#include "cuda/weights/device_weights.cuh"
#include "model/runner.h"

namespace tern::cuda {

// x [T, cols] prepared once for the products that read it. main: the layout of the 4-bit products' kernel (fp16
// with a per-token scale for the Hopper warpgroup kernel, or bf16 hi + lo with TERN_PREFILL_WGMMA=2; 16 bits for the
// integer kernel (TERN_PREFILL_INT8=1); split into bf16 hi + lo elsewhere, or fp16 hi + lo at the pair sites,
// CudaRunner::takes_pair); q16: the integer kernel's layout for 8-bit matrices (the router and shared-expert gate),
// the same buffer as main when the integer kernel runs everything.
struct PreparedX {
  const void* main = nullptr;
  const void* q16 = nullptr;
  const void* q16_rest = nullptr;  // x − x(q16) in the same form: the 8-bit products' second, exact term
  bool split = false;  // main holds bf16 hi + lo (matmul_prepare_x), not fp16, under the fp16 plan
  bool pair = false;   // main holds fp16 hi + lo (matmul_prepare_x_f16x2), not bf16 hi + lo (CudaRunner::takes_pair)
};

// The prefill plan's product inputs, for choosing which take x as fp16 on Hopper (TERN_PREFILL_F16_SITES) or as fp16
// hi + lo (TERN_PREFILL_PAIR_SITES).
enum PrefillSite : int { kGdnIn = 1, kAttnIn = 2, kMixerOut = 4, kMoeIn = 8, kMoeDown = 16, kAllSites = 31 };

class CudaRunner final : public ModelRunner {
 public:
  CudaRunner(std::unique_ptr<DeviceWeights> w, std::shared_ptr<const ModelWeights> host, const CudaRunnerOptions& o);
  ~CudaRunner() override;

  std::string backend_name() const override { return "cuda"; }
  void set_activation_dump_dir(const std::string& dir) override { dump_.set_dir(dir); }
  const Config& config() const override { return w_->config; }
  int64_t vocab_real() const override { return w_->vocab_real; }
  // The forward chunk: a 4K prompt in one call instead of two of 2K (H200: 225 against 257 ms).
  int64_t preferred_prefill_chunk() const override { return max_chunk_; }
  // The language model's weights and the vision tower's (vision_plan.cu), as the memory plan counts them.
  int64_t weight_bytes() const { return w_->bytes + (vision_ ? vision_->weight_bytes() : 0); }
  int64_t batched_steps() const { return batched_steps_; }

  std::unique_ptr<Session> create_session(int64_t max_context) override;
  int64_t session_bytes(int64_t max_context) const override;
  int64_t free_memory_bytes() const override;
  void forward(Session& session, std::span<const int32_t> tokens, bool all_logits, std::vector<float>& logits) override;
  std::optional<int32_t> forward_sample(Session& session, std::span<const int32_t> tokens,
                                        const DeviceSampling& sampling) override;
  void forward_batch(std::span<BatchEntry> batch) override;
  bool supports_verify() const override;
  int64_t max_verify_tokens() const override;
  bool keeps_state_inside(int64_t tokens) const override;
  bool runs_layers_apart(const Session& session, int64_t tokens) const override;
  void forward_layers(Session& session, std::span<const int32_t> tokens, int layers) override;
  int64_t max_step_tokens() const;
  int64_t verify_state_bytes(int tokens) const override;
  const KeptStateBuffers& kept_pool() const { return *kept_pool_; }
  void forward_verify(Session& session, std::span<const int32_t> tokens, std::vector<float>& logits) override;
  bool forward_verify_sample(Session& session, std::span<const int32_t> tokens, const DeviceSampling& sampling,
                             std::vector<int32_t>& ids) override;
  // vision_plan.cu: the vision encoder on the GPU, when the weights hold one (else images_unavailable()'s refusal).
  ImageEmbeddings encode_image(const ImagePixels& pixels) override;
  int64_t reserve_image_memory(int64_t max_patches) override;
  int64_t image_memory_bytes(int64_t max_patches) const override;
  // A random vision tower of `config`'s widths on the device (cuda_runner_create_synthetic with synthetic_vision).
  void attach_synthetic_vision(const VisionConfig& config, uint64_t seed);
  // The model's tower on the device; one the GPU encoder cannot take leaves images off (vision_error_), not a failure.
  void build_vision_plan(const VisionWeights& w);

  // ---- images in the language model (image_tokens.cu) ----
  std::string images_unavailable() const override;
  void forward_images(Session& session, std::span<const int32_t> tokens, std::span<const ImageSpan> images,
                      bool all_logits, std::vector<float>& logits) override;
  // ---- end of images ----

 private:
  static constexpr int64_t kLmRows = 128;  // logits rows computed at a time

  // cuda_runner.cu: sessions, the activation scratch, the chunk loop (both plans), the LM head
  CudaSession& own(Session& session);
  void check_tokens(CudaSession& s, std::span<const int32_t> tokens);
  void allocate_scratch();
  GdnDims gdn_dims(int64_t T) const;
  AttnDims attn_dims(int64_t T, int64_t capacity) const;
  bool decode_plan(int64_t T) const;
  bool short_call(int64_t n) const;
  void run_short_call(CudaSession& s, std::span<const int32_t> tokens, float* all_rows);
  void run_chunk(CudaSession& s, std::span<const int32_t> tokens);
  void chunk_body(CudaSession& s, int64_t T, int l0 = 0);
  void prefill_layers(CudaSession& s, int64_t T, int l0, int l1);
  void run_layers_piece(CudaSession& s, std::span<const int32_t> tokens, int layers);  // forward_layers' body
  void dump_layer(const char* base, size_t i, int64_t T, const int* ids = nullptr);
  void lm_head_device(int64_t r0, int64_t n);
  void lm_head_rows(int64_t r0, int64_t n, float* host);

  // decode_plan.cu: chunks of at most kQmvMaxTokens tokens, the decode step's CUDA graph, the token mask
  void allocate_decode_scratch();
  void plan_l2_prefetch();
  void qmv_into(const DMat& w, const float* x, int64_t ldx, int64_t T, const float* norm_w, float* y, int64_t ldy,
                bool accumulate = false, const L2Ranges& ahead = {});
  int32_t decode_graph_step(CudaSession& s, int32_t token, const DeviceSampling& sampling);
  cudaGraphExec_t capture_decode(CudaSession& s, bool with_sampling = true);
  cudaGraphExec_t capture_graph(const std::function<void()>& body);
  void apply_step_mask(const DeviceSampling& sampling);
  void gdn_decode_mixer(const DeviceLayer& l, CudaSession::LayerCache& lc, int64_t T);
  GdnDecodeArgs gdn_decode_args(const DeviceLayer& l, int64_t T, const float* proj, float* out) const;
  void attention_decode_mixer(const DeviceLayer& l, CudaSession::LayerCache& lc, CudaSession& s, int64_t T);
  size_t layer_index(const DeviceLayer& l) const;
  const L2Ranges& output_ahead(const DeviceLayer& l) const { return l2_output_ahead_[layer_index(l)]; }
  // output_ahead for a batched or verify step of B tokens: none past TERN_BATCH_OUTPUT_AHEAD_TOKENS.
  L2Ranges batch_ahead(const DeviceLayer& l, int B) const {
    return B <= batch_output_ahead_tokens_ ? output_ahead(l) : L2Ranges{};
  }

  // batch_plan.cu: one token of each of up to batch_max() sessions per step, through the one-token kernels with a
  // batch index (each session's token bit for bit as alone), one CUDA graph per (batch size, largest capacity)
  int batch_max() const;
  bool batch_joins(const BatchEntry& e) const;
  void allocate_batch_scratch();
  void batch_step(std::span<BatchEntry* const> entries);
  void batch_body(int B, int64_t max_capacity);
  void copy_sample_params(const uint8_t* params_pinned, int n);
  // the kernels batch_body and verify_body share; keep_one: the verify step keeps one state (BatchHeader::keep_token)
  void slot_layers(int B, int64_t capacity, bool one_session, bool keep_one = false);
  QmvArgs decode_product(const DMat& w, const float* x, int64_t ldx, int64_t T, const float* norm_w, float* y,
                         int64_t ldy, bool accumulate = false, const L2Ranges& ahead = {}) const;

  // verify_plan.cu: a session's last token and its drafts as the slots of one batched step, each slot bit for bit
  // its token's one-token step, the Gated DeltaNet states before each token kept for Session::rollback; one CUDA
  // graph per (tokens, capacity, one state kept or not)
  void verify_step(CudaSession& s, std::span<const int32_t> tokens, bool keep = true, int snapshot_token = -1);
  void verify_body(int T, int64_t capacity, bool keep_one);

  // prefill_plan.cu: longer chunks
  void proj(const DMat& w, const float* x, int64_t T, float* y, bool accumulate = false, const PreparedX& prep = {},
            bool exact = false, int64_t ldy = 0);
  // with_8bit: also the 16-bit integer form for the 8-bit products (PreparedX::q16); with_rest: and its residual.
  PreparedX prepare_x(const float* x, int64_t ldx, int64_t T, int64_t cols, PrefillSite site, bool with_8bit = false,
                      bool with_rest = false);
  MatmulTile with_prepared_x(MatmulArgs& a, const PreparedX& prep, bool exact = false) const;
  // normed_ = rmsnorm(hidden_)·w, prepared for `site` (the blocks below normalise their own input).
  PreparedX norm_prepare(const float* w, int64_t T, PrefillSite site, bool with_8bit = false, bool with_rest = false);
  void gdn_mixer(const DeviceLayer& l, CudaSession::LayerCache& lc, int64_t T);
  void attention_mixer(const DeviceLayer& l, CudaSession::LayerCache& lc, CudaSession& s, int64_t T, int64_t cap);
  void moe(const DeviceLayer& l, int64_t T);
  // The most tokens of the chunk's grouped expert tiles (TERN_MOE_TILE_TOKENS); wgmma: the warpgroup kernel runs
  // both grouped products.
  int moe_tile_tokens(int64_t T, bool wgmma) const;
  void shared_expert(const DeviceLayer& l, int64_t T, const PreparedX& xp);

  std::unique_ptr<DeviceWeights> w_;
  std::shared_ptr<const ModelWeights> host_;  // keeps the source alive (not read after upload)

  // ---- images in the language model (image_tokens.cu) ----
  // The forward_images call running (null otherwise): its spans and its tokens' M-RoPE positions, from which each
  // chunk takes its part (the chunk starts at token s.pos - pos0 of the call).
  struct ImageCall {
    std::span<const ImageSpan> spans;
    int64_t pos0 = 0;          // the session's position when the call began
    const int* axes = nullptr; // [tokens, 3] device: every token's (t, h, w) rotary positions
  };
  const ImageCall* image_call_ = nullptr;
  // The running chunk's image rows over its embeddings in hidden_ (chunk_body; none outside forward_images).
  void insert_image_rows(const CudaSession& s, int64_t T);
  // The rotary positions of the running chunk's attention layers: the session's delta, or the call's 3-axis ones.
  AttnRope attn_rope(const CudaSession& s) const;
  // ---- end of images ----
  int64_t max_chunk_;
  cudaStream_t stream_{};
  DeviceArena scratch_;
  bool use_graphs_ = true;              // TERN_CUDA_GRAPHS=0 turns the decode graph off
  StepTimer step_timer_;                // TERN_STEP_TIMING=1: device span vs host wall time per graph step
  bool fp32_prefill_ = false;           // TERN_CUDA_FP32=1
  // The 4-bit prefill products' kernel: the Hopper warpgroup kernel (x in one fp16 term, or two bf16), the split-x
  // mma.sync kernel (elsewhere), or the integer kernel (TERN_PREFILL_INT8=1). 8-bit matrices take the integer kernel
  // in every mode but split.
  enum class PrefillKernel { wgmma_f16, wgmma_split, int8, split };
  PrefillKernel site_kernel(PrefillSite site) const;  // the kernel of the products at `site` in this chunk
  bool prep_fits(PrefillKernel kernel, int64_t T, int64_t cols) const;  // prepare_x prepares x [T, cols] for it
  bool takes_pair(PrefillSite site, int64_t T, int64_t cols) const;     // x [T, cols] at `site` as fp16 hi + lo
  bool runs_wgmma(PrefillSite site, const DMat& w, int64_t T) const;  // w's product at `site` on the warpgroup kernel
  PrefillKernel prefill_kernel_ = PrefillKernel::int8;
  bool exact_gates_ = false;  // the GDN b and a products on the integer kernel (see gdn_mixer)
  int pair_sites_ = 0;  // the sites on fp16 hi + lo instead of bf16 hi + lo (takes_pair; 15 with the i16 cache)
  // The prefill router (TERN_PREFILL_ROUTER, see the constructor): exact (default), q16 or fp32.
  enum class RouterPrefill { exact, q16, fp32 };
  RouterPrefill router_prefill_ = RouterPrefill::exact;
  GdnChunkedKernel gdn_prefill_kernel_ = GdnChunkedKernel::automatic;  // TERN_GDN_PREFILL (see the constructor)
  int32_t device_token_ = 0;            // the token the last graph step left in tokens_ (when valid)
  bool device_token_valid_ = false;
  DeviceSampling last_params_{};        // the parameters in sample_params_slot (when valid)
  bool params_valid_ = false;
  bool decode_warm_ = false;           // a decode step has run outside capture
  bool use_decode_kernels_ = true;      // TERN_CUDA_DECODE_KERNELS=0: decode through the prefill plan's kernels
  int64_t short_call_tokens_ = 64;      // calls of at most this many tokens: verify steps (TERN_SHORT_CALL_TOKENS)
  int64_t short_step_tokens_ = 32;      // tokens per such step at most (TERN_SHORT_STEP_TOKENS; kGdnDecodeMaxTokens)
  bool layer_pieces_ = true;            // runs_layers_apart may say yes (TERN_LAYER_PIECES)
  KvDtype kv_ = KvDtype::f16;           // the KV cache's type (CudaRunnerOptions::kv; TERN_KV_BF16=1 for bf16)
  bool capturing_ = false;              // a decode graph is being captured (no activation dumps)
  ActivationDump dump_;                 // set_activation_dump_dir
  int f16_sites_ = 0;                    // TERN_PREFILL_F16_SITES (see the constructor)
  int64_t f16_min_tokens_ = 512;         // TERN_PREFILL_F16_MIN_TOKENS (see the constructor)
  int chunk_f16_sites_ = 0;              // f16_sites_, or 0 for a chunk under f16_min_tokens_ (run_chunk)
  int moe_tile_tokens_ = 0;  // TERN_MOE_TILE_TOKENS (see the constructor): 16, 32, 64; 0 auto (the default)
  int l2_prefetch_ = 12;                // TERN_L2_PREFETCH bit mask (see the constructor)
  int batch_down_prefetch_tokens_ = 1;  // TERN_BATCH_DOWN_PREFETCH_TOKENS (see the constructor)
  int batch_output_ahead_tokens_ = 1;  // TERN_BATCH_OUTPUT_AHEAD_TOKENS (see the constructor)
  std::vector<L2Ranges> l2_output_ahead_;  // per layer: what its output projection asks L2 for (plan_l2_prefetch)
  DeviceArena decode_scratch_;
  float* proj_ = nullptr;               // [kQmvMaxTokens, proj_cols_] fused input projection output
  int64_t proj_cols_ = 0;
  MoeDecodeScratch moe_scratch_;
  // [gdn_decode_ticket_count(Hk)] gdn_decode's tickets (GdnDecodeArgs::tickets), zeroed once; every gdn_decode
  // launch of the runner (decode, batched and verify steps, all on stream_) takes them.
  unsigned* gdn_tickets_ = nullptr;
  std::vector<MoeDecodeWeights> moe_w_;  // per layer
  // The decode step's CUDA graphs, one per (session id, token-mask step: the forward without sampling), so that
  // sessions that take turns (the server's parallel sequences) replay their own instead of capturing again; the
  // least recently used beyond kMaxDecodeGraphs are destroyed.
  struct DecodeGraph {
    cudaGraphExec_t exec = nullptr;
    uint64_t last_use = 0;
  };
  static constexpr size_t kMaxDecodeGraphs = 64;
  std::map<std::pair<uint64_t, bool>, DecodeGraph> decode_graphs_;
  // The batched step (batch_plan.cu), allocated with the runner. Its device tables (tokens, positions, caches
  // and states of every layer per batch slot; BatchTables in batch_plan.cu) are filled from pinned memory before
  // each step, so one graph per (batch size, largest capacity) serves any sessions.
  DeviceArena batch_scratch_;
  uint8_t* batch_tables_ = nullptr;      // device
  uint8_t* batch_pinned_ = nullptr;      // host staging: the tables, the sampling parameters, the sampled ids
  size_t batch_tables_bytes_ = 0;
  float *batch_proj_ = nullptr, *batch_gated_ = nullptr, *batch_q_ = nullptr, *batch_attn_out_ = nullptr,
        *batch_attn_part_ = nullptr;
  MoeDecodeScratch batch_moe_;
  std::vector<float*> batch_sample_scratch_;  // [batch_max()] one sampler scratch per slot, batch_sample_stride_ apart
  int64_t batch_sample_stride_ = 0;           // floats
  int* batch_sampled_ = nullptr;         // [batch_max()] device
  int* verify_pos_ = nullptr;            // [batch_max()] device: a verify step's slot positions p0 + slot
  // device: the batched products' quantised activations (QmvArgs::xq): those of hidden (in_proj, q|k|v, LM head) and
  // those of the mixers' outputs (out_proj, o_proj), written by the kernels before them (producer tables) or by the
  // products' pre-quantising kernels; zeroed once
  void* batch_xq_hidden_ = nullptr;
  size_t batch_xq_hidden_bytes_ = 0;
  void* batch_xq_mixer_ = nullptr;
  size_t batch_xq_mixer_bytes_ = 0;
  bool batch_warm_ = false;              // a batched step has run outside capture
  int64_t batched_steps_ = 0;            // steps batch_step has run
  std::map<std::pair<int, int64_t>, cudaGraphExec_t> batch_graphs_;
  bool verify_warm_ = false;  // a verify step has run outside capture
  std::map<std::tuple<int, int64_t, bool>, cudaGraphExec_t> verify_graphs_;  // by (tokens, capacity, keep_one)
  uint64_t graph_clock_ = 0, session_ids_ = 0;
  std::shared_ptr<SnapshotBuffers> snapshot_buffers_;  // made with the first session
  // The verify steps' kept states (cuda_session.cuh), shared with the sessions.
  std::shared_ptr<KeptStateBuffers> kept_pool_ = std::make_shared<KeptStateBuffers>();
  // A prompt chunk in pieces of layers (forward_layers), in the activation scratch; shared with the sessions.
  std::shared_ptr<PartWayChunk> part_way_;
  std::unique_ptr<VisionPlan> vision_;  // the vision encoder (vision_plan.cu), when the model has one
  std::string vision_error_;            // why the model's tower could not be built on the GPU ("" when it was)
  uint32_t *mask_device_ = nullptr, *mask_pinned_ = nullptr;  // [ceil(V / 32)] the step's token mask
  void* pinned_ = nullptr;              // [256 B] token in, sampled id out, sampling parameters
  float *hidden_ = nullptr, *normed_ = nullptr;
  float *in_proj_out_ = nullptr, *conv_out_ = nullptr, *o_ = nullptr, *gated_ = nullptr, *g_ = nullptr,
        *beta_ = nullptr;
  float *qg_ = nullptr, *k_ = nullptr, *v_ = nullptr, *q_ = nullptr, *attn_out_ = nullptr, *attn_part_ = nullptr;
  float *router_logits_ = nullptr, *route_w_ = nullptr, *shared_logit_ = nullptr;
  float *hg_ = nullptr, *hu_ = nullptr, *yd_ = nullptr, *sg_ = nullptr, *su_ = nullptr, *ys_ = nullptr;
  size_t yd_bytes_ = 0;                 // also the chunked Gated DeltaNet's workspace
  void* prep_ = nullptr;                // prepared activations of the prefill products (PreparedX::main)
  size_t prep_bytes_ = 0;
  void* prep_q16_ = nullptr;            // the MoE input quantised for the 8-bit products (PreparedX::q16)
  void* prep_q16_rest_ = nullptr;       // its residual quantised (PreparedX::q16_rest)
  size_t prep_q16_bytes_ = 0;
  float *logits_ = nullptr, *sample_scratch_ = nullptr;
  int *tokens_ = nullptr, *route_ids_ = nullptr, *sample_out_ = nullptr;
  MoeGroups groups_;
};

}  // namespace tern::cuda
