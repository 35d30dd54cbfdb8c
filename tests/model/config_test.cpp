// Config parsing and validation: both config forms, defaults, generation_config, errors naming the field.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "core/check.h"
#include "model/config.h"

namespace tern {
namespace {

using json = nlohmann::json;

json tiny_text() {
  return json{{"model_type", "qwen3_5_moe_text"}, {"hidden_size", 128}, {"num_hidden_layers", 4},
              {"layer_types", {"linear_attention", "linear_attention", "linear_attention", "full_attention"}},
              {"vocab_size", 512}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 64},
              {"linear_num_key_heads", 2}, {"linear_num_value_heads", 4}, {"linear_key_head_dim", 32},
              {"linear_value_head_dim", 32}, {"num_experts", 8}, {"num_experts_per_tok", 2},
              {"moe_intermediate_size", 64}, {"shared_expert_intermediate_size", 64}, {"eos_token_id", 7},
              {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1e7}, {"partial_rotary_factor", 0.25}}}};
}

void expect_error(const json& cfg, const char* fragment, const std::string& gen = "") {
  try {
    config_parse(cfg.dump(), gen);
    FAIL() << "no error, expected '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(Config, FlatTextConfig) {
  const Config c = config_parse(tiny_text().dump());
  EXPECT_EQ(c.hidden_size, 128);
  EXPECT_EQ(c.num_full_attention_layers(), 1);
  EXPECT_EQ(c.num_linear_attention_layers(), 3);
  EXPECT_EQ(c.rotary_dims(), 16);
  EXPECT_EQ(c.conv_channels(), 2 * 2 * 32 + 4 * 32);
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{7});
  EXPECT_EQ(c.quant_default.bits, 0);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e7);
}

TEST(Config, NestedTextConfigWithQuantization) {
  json top = {{"model_type", "qwen3_5_moe"}, {"text_config", tiny_text()}, {"eos_token_id", {9, 7}}};
  top["quantization"] = {{"group_size", 64}, {"bits", 4}, {"mode", "affine"},
                         {"language_model.model.layers.0.mlp.gate", {{"group_size", 64}, {"bits", 8}}}};
  const Config c = config_parse(top.dump());
  EXPECT_EQ(c.quant_default.bits, 4);
  EXPECT_EQ(c.quant_for("language_model.model.layers.0.mlp.gate").bits, 8);
  EXPECT_EQ(c.quant_for("language_model.model.layers.1.mlp.gate").bits, 4);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{9, 7}));
}

TEST(Config, DefaultsAreTheRealModel) {
  const Config c = config_parse(R"({"model_type":"qwen3_5_moe","text_config":{}})");
  EXPECT_EQ(c.num_hidden_layers, 40);
  EXPECT_EQ(c.num_full_attention_layers(), 10);
  EXPECT_EQ(c.layer_types[3], LayerType::full_attention);
  EXPECT_EQ(c.rotary_dims(), 64);
  EXPECT_EQ(c.conv_channels(), 8192);
  EXPECT_EQ(c.num_experts, 256);
}

TEST(Config, MtpFields) {
  EXPECT_EQ(config_parse(tiny_text().dump()).mtp_num_hidden_layers, 1);  // Qwen3.6's value when absent
  json t = tiny_text();
  t["mtp_num_hidden_layers"] = 0;
  t["mtp_use_dedicated_embeddings"] = true;
  const Config c = config_parse(t.dump());
  EXPECT_EQ(c.mtp_num_hidden_layers, 0);
  EXPECT_TRUE(c.mtp_use_dedicated_embeddings);
  t["mtp_num_hidden_layers"] = -1;
  expect_error(t, "mtp_num_hidden_layers");
  t["mtp_num_hidden_layers"] = "one";
  expect_error(t, "mtp_num_hidden_layers");
}

TEST(Config, QuantizationSection) {
  Config c = config_parse(tiny_text().dump());
  config_set_quantization(c, R"({"bits": 4, "group_size": 64, "mtp.layers.0.mlp.gate": {"bits": 8, "group_size": 64}})");
  EXPECT_EQ(c.quant_for("mtp.fc").bits, 4);
  EXPECT_EQ(c.quant_for("mtp.layers.0.mlp.gate").bits, 8);
  EXPECT_THROW(config_set_quantization(c, "[1]"), Error);
  EXPECT_THROW(config_set_quantization(c, R"({"bits": 3})"), Error);
}

TEST(Config, GenerationConfig) {
  const Config c = config_parse(tiny_text().dump(),
                                R"({"eos_token_id":[3,7],"bos_token_id":7,"temperature":0.6,"top_k":20,"top_p":0.95})");
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{7, 3}));
  EXPECT_EQ(c.bos_token_id, 7);
  EXPECT_DOUBLE_EQ(*c.gen_temperature, 0.6);
  EXPECT_EQ(*c.gen_top_k, 20);
  EXPECT_FALSE(c.gen_min_p.has_value());
}

TEST(Config, FullAttentionInterval) {
  json t = tiny_text();
  t.erase("layer_types");
  t["num_hidden_layers"] = 8;
  t["full_attention_interval"] = 4;
  const Config c = config_parse(t.dump());
  EXPECT_EQ(c.num_full_attention_layers(), 2);
  EXPECT_EQ(c.layer_types[7], LayerType::full_attention);
}

TEST(Config, ErrorsNameTheField) {
  json t = tiny_text();
  t["num_hidden_layers"] = 5;
  expect_error(t, "layer_types");
  t = tiny_text();
  t["num_key_value_heads"] = 3;
  expect_error(t, "num_key_value_heads");
  t = tiny_text();
  t["num_experts_per_tok"] = 9;
  expect_error(t, "num_experts");
  t = tiny_text();
  t["rope_parameters"]["partial_rotary_factor"] = 0.3;
  expect_error(t, "rotary");
  t = tiny_text();
  t["hidden_size"] = "128";
  expect_error(t, "hidden_size");
  t = tiny_text();
  t["head_dim"] = 0;
  expect_error(t, "head_dim");
  t = tiny_text();
  t["linear_num_value_heads"] = 3;
  expect_error(t, "linear_num_value_heads");
  t = tiny_text();
  t["layer_types"][0] = "sliding_attention";
  expect_error(t, "sliding_attention");
  t = tiny_text();
  t["model_type"] = "llama";
  expect_error(t, "llama");
  t = tiny_text();
  t["rope_parameters"]["rope_type"] = "yarn";
  expect_error(t, "yarn");
  t = tiny_text();
  t["quantization"] = {{"bits", 3}, {"group_size", 64}};
  expect_error(t, "bits");
  t = tiny_text();
  t["quantization"] = {{"bits", 4}, {"group_size", 64}, {"mode", "mxfp4"}};
  expect_error(t, "mxfp4");
  expect_error(json{{"model_type", "qwen3_5_moe"}}, "text_config");
  expect_error(tiny_text(), "generation_config.json", "[1]");
  try {
    config_parse("{not json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos);
  }
}

}  // namespace
}  // namespace tern
