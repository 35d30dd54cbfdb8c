// config.json / generation_config.json reader and validation (docs: /spec model.md §1).
#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/check.h"
#include "core/text_file.h"

namespace tern {

using json = nlohmann::json;

namespace {

json parse_json(const std::string& text, const char* what) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  TERN_CHECK(!j.is_discarded(), what, " is not valid JSON");
  TERN_CHECK(j.is_object(), what, " must be a JSON object");
  return j;
}

// Typed field readers: absent or null keeps the default; a wrong type is an error naming the field.
struct Fields {
  const json& j;
  std::string where;  // "config.json text_config"

  const json* find(const char* key) const {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  template <typename T>
  void integer(const char* key, T& out) const {
    if (const json* v = find(key)) {
      TERN_CHECK(v->is_number_integer(), where, ": field '", key, "' must be an integer, got ", v->dump());
      const int64_t x = v->get<int64_t>();
      TERN_CHECK(x >= int64_t(std::numeric_limits<T>::min()) && x <= int64_t(std::numeric_limits<T>::max()), where,
                 ": field '", key, "' = ", x, " is out of range");
      out = T(x);
    }
  }
  void number(const char* key, double& out) const {
    if (const json* v = find(key)) {
      TERN_CHECK(v->is_number(), where, ": field '", key, "' must be a number, got ", v->dump());
      out = v->get<double>();
    }
  }
  void boolean(const char* key, bool& out) const {
    if (const json* v = find(key)) {
      TERN_CHECK(v->is_boolean(), where, ": field '", key, "' must be true or false, got ", v->dump());
      out = v->get<bool>();
    }
  }
  std::string string(const char* key, const std::string& fallback = "") const {
    if (const json* v = find(key)) {
      TERN_CHECK(v->is_string(), where, ": field '", key, "' must be a string, got ", v->dump());
      return v->get<std::string>();
    }
    return fallback;
  }
  // One token id (image_token_id ...).
  void token_id(const char* key, int32_t& out) const {
    if (const json* v = find(key)) {
      TERN_CHECK(v->is_number_integer() && v->get<int64_t>() >= 0 && v->get<int64_t>() < (int64_t(1) << 31), where,
                 ": field '", key, "' must be a non-negative token id, got ", v->dump());
      out = int32_t(v->get<int64_t>());
    }
  }
  // An int or a list of ints (eos_token_id).
  void token_ids(const char* key, std::vector<int32_t>& out) const {
    const json* v = find(key);
    if (!v) return;
    auto add = [&](const json& x) {
      TERN_CHECK(x.is_number_integer() && x.get<int64_t>() >= 0 && x.get<int64_t>() < (int64_t(1) << 31), where,
                 ": field '", key, "' must hold non-negative token ids, got ", v->dump());
      const int32_t id = int32_t(x.get<int64_t>());
      if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
    };
    if (v->is_array()) {
      for (const json& x : *v) add(x);
    } else {
      add(*v);
    }
  }
};

QuantSpec parse_quant_spec(const json& j, const std::string& where, const QuantSpec& fallback) {
  QuantSpec q = fallback;
  Fields f{j, where};
  f.integer("bits", q.bits);
  f.integer("group_size", q.group_size);
  const std::string mode = f.string("mode", "affine");
  TERN_CHECK(mode == "affine", where, ": quantization mode '", mode, "' is not supported (only 'affine')");
  return q;
}

void parse_quantization(const json& top, Config& c) {
  const json* q = nullptr;
  if (auto it = top.find("quantization"); it != top.end() && !it->is_null()) q = &*it;
  else if (auto it2 = top.find("quantization_config"); it2 != top.end() && !it2->is_null()) q = &*it2;
  if (!q) return;
  TERN_CHECK(q->is_object(), "config.json: field 'quantization' must be an object");
  c.quant_default = parse_quant_spec(*q, "config.json quantization", QuantSpec{0, 64});
  TERN_CHECK(q->contains("bits"), "config.json: field 'quantization.bits' is missing");
  for (auto it = q->begin(); it != q->end(); ++it) {
    const std::string& key = it.key();
    if (key == "bits" || key == "group_size" || key == "mode" || key == "quant_method") continue;
    if (it->is_object()) {
      c.quant_overrides.emplace_back(key, parse_quant_spec(*it, "config.json quantization." + key, c.quant_default));
    } else if (it->is_boolean() && !it->get<bool>()) {
      c.quant_overrides.emplace_back(key, QuantSpec{0, c.quant_default.group_size});
    }
  }
}

// vision_config (transformers' Qwen3_5MoeVisionConfig): absent fields keep its defaults; unknown ones (e.g.
// deepstack_visual_indexes, which Qwen3_5MoeVisionModel does not use) are ignored as transformers ignores them.
VisionConfig parse_vision_config(const json& j) {
  const std::string where = "config.json vision_config";
  TERN_CHECK(j.is_object(), where, " must be an object");
  VisionConfig v;
  const Fields f{j, where};
  f.integer("depth", v.depth);
  f.integer("num_hidden_layers", v.depth);  // transformers' attribute_map alias
  f.integer("hidden_size", v.hidden_size);
  f.integer("intermediate_size", v.intermediate_size);
  f.integer("num_heads", v.num_heads);
  f.integer("num_attention_heads", v.num_heads);
  f.integer("in_channels", v.in_channels);
  f.integer("patch_size", v.patch_size);
  f.integer("temporal_patch_size", v.temporal_patch_size);
  f.integer("spatial_merge_size", v.spatial_merge_size);
  f.integer("out_hidden_size", v.out_hidden_size);
  f.integer("num_position_embeddings", v.num_position_embeddings);
  v.hidden_act = f.string("hidden_act", v.hidden_act);
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    const json* rp = f.find(key);
    if (!rp) continue;
    TERN_CHECK(rp->is_object(), where, ": field '", key, "' must be an object");
    const Fields fr{*rp, where + " " + key};
    fr.number("rope_theta", v.rope_theta);
    const std::string type = fr.string("rope_type", fr.string("type", "axial"));
    TERN_CHECK(type == "axial" || type == "default", where, " ", key, ": rope_type '", type,
               "' is not supported (axial)");
  }
  return v;
}

// A size field of config.json: positive and at most `cap`, so that no product of sizes can overflow.
void check_size_field(int64_t v, const char* prefix, const char* name, int64_t cap) {
  TERN_CHECK(v > 0, "config: ", prefix, name, " must be positive, got ", v);
  TERN_CHECK(v <= cap, "config: ", prefix, name, " = ", v, " is implausibly large");
}

}  // namespace

int VisionConfig::grid_per_side() const { return int(std::sqrt(double(num_position_embeddings))); }

void VisionConfig::validate() const {
  auto positive = [](int64_t v, const char* name) { check_size_field(v, "vision_config.", name, int64_t(1) << 20); };
  positive(depth, "depth");
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_heads, "num_heads");
  positive(in_channels, "in_channels");
  positive(patch_size, "patch_size");
  positive(temporal_patch_size, "temporal_patch_size");
  positive(spatial_merge_size, "spatial_merge_size");
  positive(out_hidden_size, "out_hidden_size");
  positive(num_position_embeddings, "num_position_embeddings");
  TERN_CHECK(hidden_size % num_heads == 0, "config: vision_config.hidden_size (", hidden_size,
             ") must be a multiple of num_heads (", num_heads, ")");
  TERN_CHECK(head_dim() % 4 == 0, "config: vision_config head_dim = hidden_size / num_heads = ", head_dim(),
             " must be a multiple of 4 (two rotary axes of head_dim / 4 frequencies each)");
  TERN_CHECK(hidden_act == "gelu_pytorch_tanh" || hidden_act == "gelu", "config: vision_config.hidden_act '",
             hidden_act, "' is not supported (gelu_pytorch_tanh or gelu)");
  TERN_CHECK(rope_theta > 0 && std::isfinite(rope_theta), "config: vision_config rope_theta must be positive, got ",
             rope_theta);
}

QuantSpec Config::quant_for(const std::string& module_path) const {
  for (const auto& [path, spec] : quant_overrides)
    if (path == module_path) return spec;
  return quant_default;
}

int Config::num_full_attention_layers() const {
  return int(std::count(layer_types.begin(), layer_types.end(), LayerType::full_attention));
}

int Config::num_linear_attention_layers() const {
  return int(std::count(layer_types.begin(), layer_types.end(), LayerType::linear_attention));
}

void Config::validate() const {
  auto positive = [](int64_t v, const char* name) { check_size_field(v, "", name, int64_t(1) << 24); };
  positive(hidden_size, "hidden_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(vocab_size, "vocab_size");
  positive(num_attention_heads, "num_attention_heads");
  positive(num_key_value_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  positive(linear_num_key_heads, "linear_num_key_heads");
  positive(linear_num_value_heads, "linear_num_value_heads");
  positive(linear_key_head_dim, "linear_key_head_dim");
  positive(linear_value_head_dim, "linear_value_head_dim");
  positive(num_experts, "num_experts");
  positive(num_experts_per_tok, "num_experts_per_tok");
  positive(moe_intermediate_size, "moe_intermediate_size");
  positive(shared_expert_intermediate_size, "shared_expert_intermediate_size");
  TERN_CHECK(max_position_embeddings > 0, "config: max_position_embeddings must be positive");
  TERN_CHECK(mtp_num_hidden_layers >= 0 && mtp_num_hidden_layers <= 64,
             "config: mtp_num_hidden_layers must be in [0, 64], got ", mtp_num_hidden_layers);
  TERN_CHECK(int64_t(layer_types.size()) == num_hidden_layers, "config: layer_types has ", layer_types.size(),
             " entries but num_hidden_layers is ", num_hidden_layers);
  TERN_CHECK(num_attention_heads % num_key_value_heads == 0, "config: num_attention_heads (", num_attention_heads,
             ") must be a multiple of num_key_value_heads (", num_key_value_heads, ")");
  TERN_CHECK(linear_num_value_heads % linear_num_key_heads == 0, "config: linear_num_value_heads (",
             linear_num_value_heads, ") must be a multiple of linear_num_key_heads (", linear_num_key_heads, ")");
  TERN_CHECK(num_experts >= num_experts_per_tok, "config: num_experts (", num_experts,
             ") must be >= num_experts_per_tok (", num_experts_per_tok, ")");
  TERN_CHECK(linear_conv_kernel_dim >= 2 && linear_conv_kernel_dim <= 16,
             "config: linear_conv_kernel_dim must be in [2, 16], got ", linear_conv_kernel_dim);
  TERN_CHECK(head_dim % 2 == 0, "config: head_dim must be even, got ", head_dim);
  TERN_CHECK(partial_rotary_factor > 0 && partial_rotary_factor <= 1,
             "config: partial_rotary_factor must be in (0, 1], got ", partial_rotary_factor);
  const double r = head_dim * partial_rotary_factor;
  TERN_CHECK(r == std::floor(r) && int(r) % 2 == 0 && r >= 2, "config: rotary dims head_dim * partial_rotary_factor = ",
             r, " must be an even integer >= 2");
  TERN_CHECK(rope_theta > 0 && std::isfinite(rope_theta), "config: rope_theta must be positive, got ", rope_theta);
  TERN_CHECK(rms_norm_eps > 0 && rms_norm_eps < 1, "config: rms_norm_eps must be in (0, 1), got ", rms_norm_eps);
  TERN_CHECK(attn_output_gate, "config: attn_output_gate = false is not supported (Qwen3.6 gates attention output)");
  auto check_quant = [](const QuantSpec& q, const std::string& where) {
    TERN_CHECK(q.bits == 0 || q.bits == 4 || q.bits == 8, "config: ", where, " bits = ", q.bits,
               " is not supported (4 or 8)");
    TERN_CHECK(q.group_size == 32 || q.group_size == 64 || q.group_size == 128, "config: ", where,
               " group_size = ", q.group_size, " is not supported (32, 64 or 128)");
  };
  if (vision) {
    vision->validate();
    TERN_CHECK(vision->out_hidden_size == hidden_size, "config: vision_config.out_hidden_size (",
               vision->out_hidden_size, ") must equal the language model's hidden_size (", hidden_size, ")");
  }
  check_quant(quant_default, "quantization");
  for (const auto& [path, q] : quant_overrides) check_quant(q, "quantization." + path);
}

Config config_parse(const std::string& config_json, const std::string& generation_config_json) {
  const json top = parse_json(config_json, "config.json");
  Config c;
  c.model_type = Fields{top, "config.json"}.string("model_type");
  const json* text = &top;
  std::string where = "config.json";
  if (c.model_type == "qwen3_5_moe") {
    auto it = top.find("text_config");
    TERN_CHECK(it != top.end() && it->is_object(), "config.json: model_type qwen3_5_moe needs a 'text_config' object");
    text = &*it;
    where = "config.json text_config";
    const std::string inner = Fields{*text, where}.string("model_type", "qwen3_5_moe_text");
    TERN_CHECK(inner == "qwen3_5_moe_text", where, ": model_type must be qwen3_5_moe_text, got '", inner, "'");
  } else {
    TERN_CHECK(c.model_type == "qwen3_5_moe_text", "config.json: model_type '", c.model_type,
               "' is not supported (tern runs qwen3_5_moe / qwen3_5_moe_text, Qwen3.6-35B-A3B)");
  }
  const Fields f{*text, where};
  const Fields ft{top, "config.json"};
  f.integer("hidden_size", c.hidden_size);
  f.integer("num_hidden_layers", c.num_hidden_layers);
  f.integer("vocab_size", c.vocab_size);
  f.integer("num_attention_heads", c.num_attention_heads);
  f.integer("num_key_value_heads", c.num_key_value_heads);
  f.integer("head_dim", c.head_dim);
  f.boolean("attn_output_gate", c.attn_output_gate);
  f.integer("linear_num_key_heads", c.linear_num_key_heads);
  f.integer("linear_num_value_heads", c.linear_num_value_heads);
  f.integer("linear_key_head_dim", c.linear_key_head_dim);
  f.integer("linear_value_head_dim", c.linear_value_head_dim);
  f.integer("linear_conv_kernel_dim", c.linear_conv_kernel_dim);
  f.integer("num_experts", c.num_experts);
  f.integer("num_experts_per_tok", c.num_experts_per_tok);
  f.integer("moe_intermediate_size", c.moe_intermediate_size);
  f.integer("shared_expert_intermediate_size", c.shared_expert_intermediate_size);
  f.boolean("norm_topk_prob", c.norm_topk_prob);
  f.number("rms_norm_eps", c.rms_norm_eps);
  f.integer("max_position_embeddings", c.max_position_embeddings);
  f.integer("mtp_num_hidden_layers", c.mtp_num_hidden_layers);
  f.boolean("mtp_use_dedicated_embeddings", c.mtp_use_dedicated_embeddings);
  ft.boolean("tie_word_embeddings", c.tie_word_embeddings);
  f.boolean("tie_word_embeddings", c.tie_word_embeddings);
  const std::string act = f.string("hidden_act", "silu");
  TERN_CHECK(act == "silu" || act == "swish", where, ": hidden_act '", act, "' is not supported (silu)");
  if (const json* v = f.find("mlp_only_layers"))
    TERN_CHECK(v->is_array() && v->empty(), where, ": mlp_only_layers must be empty (every layer is MoE)");
  if (const json* v = f.find("decoder_sparse_step"))
    TERN_CHECK(v->is_number_integer() && v->get<int64_t>() == 1, where, ": decoder_sparse_step must be 1");

  // Rotary: top-level keys of the text config, then rope_parameters (transformers 5) / rope_scaling.
  f.number("rope_theta", c.rope_theta);
  f.number("partial_rotary_factor", c.partial_rotary_factor);
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    const json* rp = f.find(key);
    if (!rp) continue;
    TERN_CHECK(rp->is_object(), where, ": field '", key, "' must be an object");
    const Fields fr{*rp, where + " " + key};
    fr.number("rope_theta", c.rope_theta);
    fr.number("partial_rotary_factor", c.partial_rotary_factor);
    if (const json* ms = fr.find("mrope_section")) {
      TERN_CHECK(ms->is_array() && ms->size() == 3, where, " ", key, ": mrope_section must be a list of 3 integers");
      for (size_t i = 0; i < 3; ++i) {
        TERN_CHECK((*ms)[i].is_number_integer() && (*ms)[i].get<int64_t>() >= 0 && (*ms)[i].get<int64_t>() < 4096,
                   where, " ", key, ": mrope_section must hold 3 non-negative integers, got ", ms->dump());
        c.mrope_section[i] = int((*ms)[i].get<int64_t>());
      }
    }
    fr.boolean("mrope_interleaved", c.mrope_interleaved);
    std::string type = fr.string("rope_type", fr.string("type", "default"));
    TERN_CHECK(type == "default" || type == "mrope", where, " ", key, ": rope_type '", type,
               "' is not supported (default)");
  }

  // Layer types: explicit list, else the full_attention_interval pattern.
  if (const json* lt = f.find("layer_types")) {
    TERN_CHECK(lt->is_array(), where, ": field 'layer_types' must be a list");
    for (const json& t : *lt) {
      TERN_CHECK(t.is_string(), where, ": layer_types entries must be strings");
      const std::string s = t.get<std::string>();
      if (s == "linear_attention") c.layer_types.push_back(LayerType::linear_attention);
      else if (s == "full_attention") c.layer_types.push_back(LayerType::full_attention);
      else TERN_FAIL(where, ": layer_types entry '", s, "' is not linear_attention or full_attention");
    }
  } else {
    int interval = 4;
    f.integer("full_attention_interval", interval);
    TERN_CHECK(interval > 0, where, ": full_attention_interval must be positive");
    for (int i = 0; i < c.num_hidden_layers; ++i)
      c.layer_types.push_back((i + 1) % interval == 0 ? LayerType::full_attention : LayerType::linear_attention);
  }

  ft.token_ids("eos_token_id", c.eos_token_ids);
  f.token_ids("eos_token_id", c.eos_token_ids);
  std::vector<int32_t> bos;
  ft.token_ids("bos_token_id", bos);
  f.token_ids("bos_token_id", bos);
  if (!bos.empty()) c.bos_token_id = bos.back();

  parse_quantization(top, c);

  if (c.model_type == "qwen3_5_moe") {
    ft.token_id("image_token_id", c.image_token_id);
    ft.token_id("video_token_id", c.video_token_id);
    ft.token_id("vision_start_token_id", c.vision_start_token_id);
    ft.token_id("vision_end_token_id", c.vision_end_token_id);
    if (const json* vc = ft.find("vision_config")) c.vision = parse_vision_config(*vc);
  }

  if (!generation_config_json.empty()) {
    const json g = parse_json(generation_config_json, "generation_config.json");
    const Fields fg{g, "generation_config.json"};
    fg.token_ids("eos_token_id", c.eos_token_ids);
    std::vector<int32_t> gbos;
    fg.token_ids("bos_token_id", gbos);
    if (!gbos.empty()) c.bos_token_id = gbos.back();
    auto opt_number = [&](const char* key, std::optional<double>& out) {
      if (fg.find(key)) {
        double v = 0;
        fg.number(key, v);
        out = v;
      }
    };
    opt_number("temperature", c.gen_temperature);
    opt_number("top_p", c.gen_top_p);
    opt_number("min_p", c.gen_min_p);
    opt_number("presence_penalty", c.gen_presence_penalty);
    opt_number("repetition_penalty", c.gen_repetition_penalty);
    if (fg.find("top_k")) {
      int k = 0;
      fg.integer("top_k", k);
      c.gen_top_k = k;
    }
  }
  c.validate();
  return c;
}

void config_set_quantization(Config& c, const std::string& quantization_json) {
  const json q = json::parse(quantization_json, nullptr, /*allow_exceptions=*/false);
  TERN_CHECK(!q.is_discarded() && q.is_object(), "quantization section is not a JSON object: ", quantization_json);
  c.quant_default = QuantSpec{};
  c.quant_overrides.clear();
  parse_quantization(json{{"quantization", q}}, c);
  c.validate();
}

Config config_load(const std::filesystem::path& model_dir) {
  const auto cfg = model_dir / "config.json";
  TERN_CHECK(std::filesystem::exists(cfg), "no config.json in ", model_dir.string());
  const auto gen = model_dir / "generation_config.json";
  const std::string gen_text = std::filesystem::exists(gen) ? read_text_file(gen) : std::string();
  try {
    return config_parse(read_text_file(cfg), gen_text);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (in " + model_dir.string() + ")");
  }
}

}  // namespace tern
