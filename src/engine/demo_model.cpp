#include "engine/demo_model.h"

#include <cmath>
#include <deque>
#include <vector>

#include "core/check.h"
#include "core/thread_pool.h"
#include "engine/demo_random.h"
#include "engine/demo_vision.h"
#include "model/quantize.h"

namespace tern {

namespace {

// Sizes of the demo, and of the real model (full_size: the synthetic full-size checkpoint).
struct Dims {
  int64_t D;     // hidden
  int Hq, Hkv;   // attention heads
  int Dh;        // attention head dim
  int Hk, Hv;    // GDN key / value heads
  int Dk, Dv;    // GDN head dims
  int E, TopK;   // experts
  int64_t F;     // expert and shared-expert widths
};
constexpr Dims kDemoDims{256, 4, 2, 64, 2, 4, 64, 64, 16, 4, 128};
constexpr Dims kFullDims{2048, 16, 2, 256, 16, 32, 128, 128, 256, 8, 512};
const Dims& dims_of(const DemoModelOptions& o) { return o.full_size ? kFullDims : kDemoDims; }
constexpr int kGroup = 64;

using demo::Uniform;

struct DemoStorage : WeightStorage {
  std::deque<std::vector<uint32_t>> words;  // deque: references stay valid as buffers are added
  std::deque<std::vector<uint16_t>> halves;
};

class Builder {
 public:
  Builder(uint64_t seed, DemoStorage& storage) : seed_(seed), storage_(storage) {}

  // A stacked [experts][rows, cols] matrix, uniform with standard deviation `stddev`, quantised to `bits`.
  Matrix matrix(int64_t experts, int64_t rows, int64_t cols, float stddev, int bits = 4) {
    const uint64_t tensor = next_tensor_++;
    const int64_t words_per_row = cols * bits / 32, groups = cols / kGroup;
    auto& packed = storage_.words.emplace_back(size_t(experts * rows * words_per_row));
    auto& scales = storage_.halves.emplace_back(size_t(experts * rows * groups));
    auto& biases = storage_.halves.emplace_back(size_t(experts * rows * groups));
    const float amplitude = stddev * std::sqrt(3.0f);  // uniform on [-a, a] has standard deviation a / sqrt(3)
    thread_pool_global().parallel_for(experts * rows, 256, [&](int64_t begin, int64_t end) {
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t r = begin; r < end; ++r) {
        Uniform u(seed_, tensor, uint64_t(r));
        for (float& x : row) x = amplitude * u.next();
        quantize_affine(row.data(), 1, cols, bits, kGroup, packed.data() + r * words_per_row,
                        scales.data() + r * groups, biases.data() + r * groups);
      }
    });
    Matrix m;
    m.format = bits == 4 ? WeightFormat::affine4 : WeightFormat::affine8;
    m.experts = experts;
    m.rows = rows;
    m.cols = cols;
    m.group_size = kGroup;
    m.data = packed.data();
    m.scales = scales.data();
    m.biases = biases.data();
    return m;
  }

  // A vector: center + spread * uniform[-1, 1).
  std::vector<float> vector(int64_t n, float center, float spread) {
    Uniform u(seed_, next_tensor_++, 0);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = center + spread * u.next();
    return v;
  }

 private:
  uint64_t seed_;
  DemoStorage& storage_;
  uint64_t next_tensor_ = 1;
};

}  // namespace

bool demo_has_vision(const DemoModelOptions& o) {
  return o.vision && !o.full_size && o.vocab_real > kDemoVideoTokenId;
}

std::string demo_config_json(const DemoModelOptions& o) {
  TERN_CHECK(o.vocab_real > 0, "demo model: vocabulary size must be positive, got ", o.vocab_real);
  TERN_CHECK(o.layers > 0, "demo model: layer count must be positive, got ", o.layers);
  const int64_t vocab = (o.vocab_real + 63) / 64 * 64;
  const Dims& d = dims_of(o);
  const bool vision = demo_has_vision(o);
  // M-RoPE sections for the demo's 8 rotary frequencies, in the real [11, 11, 10]'s proportions (images only).
  const char* rope = vision ? ", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000000, "
                              "\"partial_rotary_factor\": 0.25, \"mrope_interleaved\": true, \"mrope_section\": [3, 3, 2]}"
                            : "";
  const std::string text = detail::concat(
      "{\"model_type\": \"qwen3_5_moe_text\", \"hidden_size\": ", d.D, ", \"num_hidden_layers\": ", o.layers,
      ", \"full_attention_interval\": 4, \"vocab_size\": ", vocab, ", \"num_attention_heads\": ", d.Hq,
      ", \"num_key_value_heads\": ", d.Hkv, ", \"head_dim\": ", d.Dh,
      ", \"partial_rotary_factor\": 0.25, \"rope_theta\": 10000000, \"attn_output_gate\": true",
      ", \"linear_num_key_heads\": ", d.Hk, ", \"linear_num_value_heads\": ", d.Hv, ", \"linear_key_head_dim\": ", d.Dk,
      ", \"linear_value_head_dim\": ", d.Dv, ", \"linear_conv_kernel_dim\": 4, \"num_experts\": ", d.E,
      ", \"num_experts_per_tok\": ", d.TopK, ", \"moe_intermediate_size\": ", d.F,
      ", \"shared_expert_intermediate_size\": ", d.F,
      ", \"norm_topk_prob\": true, \"rms_norm_eps\": 1e-06, \"tie_word_embeddings\": false"
      ", \"max_position_embeddings\": ", (o.full_size ? 262144 : 32768), ", \"hidden_act\": \"silu\", \"eos_token_id\": ",
      o.eos_json, rope, "}");
  if (!vision) return text;
  return detail::concat("{\"model_type\": \"qwen3_5_moe\", \"architectures\": [\"Qwen3_5MoeForConditionalGeneration\"], ",
                        "\"text_config\": ", text, ", \"vision_config\": ", demo_vision_config_json(d.D),
                        ", \"image_token_id\": ", kDemoImageTokenId, ", \"video_token_id\": ", kDemoVideoTokenId,
                        ", \"vision_start_token_id\": ", kDemoVisionStartId, ", \"vision_end_token_id\": ",
                        kDemoVisionEndId, ", \"tie_word_embeddings\": false}");
}

std::string demo_generation_config_json(const DemoModelOptions& o) {
  return detail::concat("{\"do_sample\": true, \"eos_token_id\": ", o.eos_json,
                        ", \"temperature\": 1.0, \"top_k\": 20, \"top_p\": 0.95}");
}

std::shared_ptr<const ModelWeights> demo_model_build(const DemoModelOptions& o) {
  auto w = std::make_shared<ModelWeights>();
  w->config = config_parse(demo_config_json(o), demo_generation_config_json(o));
  const Config& c = w->config;
  const Dims& d = dims_of(o);
  const int64_t kD = d.D, kF = d.F;
  const int kHq = d.Hq, kHkv = d.Hkv, kDh = d.Dh, kHv = d.Hv, kDv = d.Dv, kE = d.E;
  auto storage = std::make_shared<DemoStorage>();
  Builder b(o.seed, *storage);
  const float s_in = 1.0f / std::sqrt(float(kD));  // matrices reading the hidden state
  const int64_t V = c.vocab_size, C = c.conv_channels();

  w->embed = b.matrix(1, V, kD, 1.0f);
  // Logits with a standard deviation of about 3: peaked enough to read as a language model's.
  w->lm_head = b.matrix(1, V, kD, 3.0f * s_in);
  w->final_norm = b.vector(kD, 1.0f, 0.1f);
  // One decoder layer's tensors, drawn in this order (the demo's weights depend on it).
  auto layer = [&](LayerType type) {
    LayerWeights l;
    l.type = type;
    l.input_norm = b.vector(kD, 1.0f, 0.1f);
    l.post_attn_norm = b.vector(kD, 1.0f, 0.1f);
    if (l.type == LayerType::linear_attention) {
      l.in_proj_qkv = b.matrix(1, C, kD, s_in);
      l.in_proj_z = b.matrix(1, int64_t(kHv) * kDv, kD, s_in);
      l.in_proj_b = b.matrix(1, kHv, kD, s_in);
      l.in_proj_a = b.matrix(1, kHv, kD, s_in);
      l.conv1d = b.vector(C * c.linear_conv_kernel_dim, 0.0f, 0.8f);
      l.A_log = b.vector(kHv, 1.4f, 1.3f);  // exp(A_log) in about [1, 15], as HF initialises A
      l.dt_bias = b.vector(kHv, 1.0f, 0.1f);
      l.gdn_norm = b.vector(kDv, 1.0f, 0.1f);
      l.out_proj = b.matrix(1, kD, int64_t(kHv) * kDv, 1.0f / std::sqrt(float(kHv * kDv)));
    } else {
      l.q_proj = b.matrix(1, int64_t(kHq) * 2 * kDh, kD, s_in);
      l.k_proj = b.matrix(1, int64_t(kHkv) * kDh, kD, s_in);
      l.v_proj = b.matrix(1, int64_t(kHkv) * kDh, kD, s_in);
      l.o_proj = b.matrix(1, kD, int64_t(kHq) * kDh, 1.0f / std::sqrt(float(kHq * kDh)));
      l.q_norm = b.vector(kDh, 1.0f, 0.1f);
      l.k_norm = b.vector(kDh, 1.0f, 0.1f);
    }
    // A router with logits of standard deviation about 2, so the top-k choice is never a near-tie by construction.
    l.router = b.matrix(1, kE, kD, 2.0f * s_in, 8);
    l.expert_gate = b.matrix(kE, kF, kD, s_in);
    l.expert_up = b.matrix(kE, kF, kD, s_in);
    l.expert_down = b.matrix(kE, kD, kF, 1.0f / std::sqrt(float(kF)));
    l.shared_gate = b.matrix(1, kF, kD, s_in);
    l.shared_up = b.matrix(1, kF, kD, s_in);
    l.shared_down = b.matrix(1, kD, kF, 1.0f / std::sqrt(float(kF)));
    l.shared_expert_gate = b.matrix(1, 1, kD, s_in, 8);
    return l;
  };
  for (int i = 0; i < c.num_hidden_layers; ++i) w->layers.push_back(layer(c.layer_types[size_t(i)]));
  // The MTP draft head, drawn after everything else: the model's other weights are the same with or without it.
  if (o.mtp) {
    MtpWeights& m = w->mtp.emplace();
    m.pre_fc_norm_embedding = b.vector(kD, 1.0f, 0.1f);
    m.pre_fc_norm_hidden = b.vector(kD, 1.0f, 0.1f);
    m.fc = b.matrix(1, kD, 2 * kD, 1.0f / std::sqrt(float(2 * kD)));
    m.layer = layer(LayerType::full_attention);
    m.norm = b.vector(kD, 1.0f, 0.1f);
    w->mtp_source = "demo";
  } else {
    w->mtp_absent = "the demo model was built without it";
  }
  w->storage.push_back(storage);
  if (c.vision) w->vision = demo_vision_build(*c.vision, o.seed);
  w->source_layout = "demo";
  w->vocab_real = o.vocab_real;
  return w;
}

}  // namespace tern
