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
