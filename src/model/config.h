// The model's hyper-parameters, read from config.json (model_type qwen3_5_moe with text_config, or
// qwen3_5_moe_text) and generation_config.json. Defaults are the Qwen3.6-35B-A3B values (docs/model.md).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace tern {

enum class LayerType { linear_attention, full_attention };

struct QuantSpec {  // MLX affine quantisation of one module
  int bits = 0;        // 0: not quantised
  int group_size = 64;
};

// The vision encoder's hyper-parameters: config.json's vision_config (transformers' Qwen3_5MoeVisionConfig; a field
// the file leaves out takes transformers' default, as the reference would). Qwen3.6-35B-A3B: depth 27, width 1152,
// 16 heads of 72, MLP 4304, patches 2 x 16 x 16 of 3 channels, merge 2 x 2, output 2048, 48 x 48 learned positions.
struct VisionConfig {
  int depth = 27;                           // vision blocks
  int64_t hidden_size = 1152;               // Dv
  int64_t intermediate_size = 4304;         // Iv
  int num_heads = 16;                       // Hv (head_dim = Dv / Hv)
  int in_channels = 3;                      // C
  int patch_size = 16;                      // P
  int temporal_patch_size = 2;              // Tp
  int spatial_merge_size = 2;               // M (M x M patches become one LM token)
  int64_t out_hidden_size = 3584;           // the LM width the merger projects into (2048 in Qwen3.6's file)
  int64_t num_position_embeddings = 2304;   // learned position table rows (a side x side grid)
  std::string hidden_act = "gelu_pytorch_tanh";  // the blocks' MLP activation (the merger's is always exact GELU)
  double rope_theta = 10000.0;              // rope_parameters.rope_theta (axial 2D rotary)

  int head_dim() const { return int(hidden_size / num_heads); }
  int64_t patch_dim() const { return int64_t(in_channels) * temporal_patch_size * patch_size * patch_size; }
  int grid_per_side() const;                // int(sqrt(num_position_embeddings)), as Python's int(n ** 0.5)
  int64_t merged_dim() const { return hidden_size * spatial_merge_size * spatial_merge_size; }
  void validate() const;                    // throws tern::Error naming the field
};

struct Config {
  // ---- text model (docs/model.md §1.1) ----
  int64_t hidden_size = 2048;               // D
  int num_hidden_layers = 40;               // L
  std::vector<LayerType> layer_types;       // [L]
  int64_t vocab_size = 248320;              // V (embedding rows, padded)
  int num_attention_heads = 16;             // Hq
  int num_key_value_heads = 2;              // Hkv
  int head_dim = 256;                       // dh
  double partial_rotary_factor = 0.25;      // rotary dims r = dh * factor
  double rope_theta = 10000000.0;
  bool attn_output_gate = true;
  int linear_num_key_heads = 16;            // Hk
  int linear_num_value_heads = 32;          // Hv
  int linear_key_head_dim = 128;            // dk
  int linear_value_head_dim = 128;          // dv
  int linear_conv_kernel_dim = 4;           // Ck
  int num_experts = 256;                    // E
  int num_experts_per_tok = 8;              // k
  int64_t moe_intermediate_size = 512;      // F
  int64_t shared_expert_intermediate_size = 512;  // Fs
  bool norm_topk_prob = true;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 262144;
  std::vector<int32_t> eos_token_ids;       // from config, then generation_config (stop ids)
  std::optional<int32_t> bos_token_id;
  // Multi-token prediction (the mtp.* draft head, docs/model.md §2.8): its decoder layers (1 in Qwen3.6; tern runs
  // exactly one) and whether it has an embedding of its own (false in Qwen3.6; tern needs the shared one).
  int mtp_num_hidden_layers = 1;
  bool mtp_use_dedicated_embeddings = false;

  // ---- MLX quantisation (empty when the checkpoint is not quantised) ----
  QuantSpec quant_default;                           // bits 0 when absent
  std::vector<std::pair<std::string, QuantSpec>> quant_overrides;  // module path -> spec
  QuantSpec quant_for(const std::string& module_path) const;       // override, else default

  // ---- generation_config.json (sampling defaults) ----
  std::optional<double> gen_temperature, gen_top_p, gen_min_p, gen_presence_penalty, gen_repetition_penalty;
  std::optional<int> gen_top_k;

  std::string model_type;  // as written in the file

  // ---- vision (model_type qwen3_5_moe with a vision_config; absent for text-only configs) ----
  std::optional<VisionConfig> vision;
  int32_t image_token_id = 248056;          // <|image_pad|>
  int32_t video_token_id = 248057;          // <|video_pad|>
  int32_t vision_start_token_id = 248053;   // <|vision_start|>
  int32_t vision_end_token_id = 248054;     // <|vision_end|>
  // Interleaved M-RoPE of the text model (rope_parameters.mrope_section): rotary pairs per axis (t, h, w).
  std::vector<int> mrope_section = {11, 11, 10};
  bool mrope_interleaved = true;

  // Derived sizes.
  int rotary_dims() const { return int(head_dim * partial_rotary_factor); }          // r
  int64_t conv_channels() const {                                                      // C
    return 2LL * linear_num_key_heads * linear_key_head_dim + int64_t(linear_num_value_heads) * linear_value_head_dim;
  }
  int num_full_attention_layers() const;
  int num_linear_attention_layers() const;

  // Throws tern::Error naming the field when the values are inconsistent.
  void validate() const;
};

// Reads DIR/config.json (and DIR/generation_config.json when present). Throws tern::Error.
Config config_load(const std::filesystem::path& model_dir);
// Parses a config.json text (tests, demo model). generation_config is optional.
Config config_parse(const std::string& config_json, const std::string& generation_config_json = "");

// Replaces c's quantisation with a `quantization` section given as JSON text (config.json's form: bits,
// group_size, per-module overrides), e.g. the one an extracted MTP file records. Throws tern::Error.
void config_set_quantization(Config& c, const std::string& quantization_json);

}  // namespace tern
