// vision_config: transformers' defaults, Qwen3.6's values, the M-RoPE fields, errors naming the field.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "core/check.h"
#include "model/config.h"

namespace tern {
namespace {

using json = nlohmann::json;

// Qwen/Qwen3.6-35B-A3B's vision_config (docs: /spec model.md §1).
json qwen36_vision() {
  return json{{"depth", 27}, {"hidden_size", 1152}, {"intermediate_size", 4304}, {"num_heads", 16},
              {"patch_size", 16}, {"temporal_patch_size", 2}, {"spatial_merge_size", 2}, {"out_hidden_size", 2048},
              {"num_position_embeddings", 2304}, {"hidden_act", "gelu_pytorch_tanh"},
              {"deepstack_visual_indexes", json::array()}, {"in_channels", 3},
              {"model_type", "qwen3_5_moe_vision"}};
}

json with_vision(const json& vision) {
  return json{{"model_type", "qwen3_5_moe"}, {"text_config", json::object()}, {"vision_config", vision}};
}

void expect_error(const json& cfg, const char* fragment) {
  try {
    config_parse(cfg.dump());
    FAIL() << "no error, expected '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(VisionConfig, Qwen36Values) {
  const Config c = config_parse(with_vision(qwen36_vision()).dump());
  ASSERT_TRUE(c.vision.has_value());
  const VisionConfig& v = *c.vision;
  EXPECT_EQ(v.depth, 27);
  EXPECT_EQ(v.head_dim(), 72);
  EXPECT_EQ(v.patch_dim(), 1536);
  EXPECT_EQ(v.grid_per_side(), 48);
  EXPECT_EQ(v.merged_dim(), 4608);
  EXPECT_EQ(v.out_hidden_size, 2048);
  EXPECT_DOUBLE_EQ(v.rope_theta, 10000.0);
  EXPECT_EQ(c.image_token_id, 248056);
  EXPECT_EQ(c.vision_start_token_id, 248053);
}

TEST(VisionConfig, AbsentForTextOnlyConfigs) {
  EXPECT_FALSE(config_parse(R"({"model_type":"qwen3_5_moe","text_config":{}})").vision.has_value());
  EXPECT_FALSE(config_parse(R"({"model_type":"qwen3_5_moe_text"})").vision.has_value());
}

TEST(VisionConfig, MissingFieldsTakeTransformersDefaults) {
  json v = {{"out_hidden_size", 2048}};
  const Config c = config_parse(with_vision(v).dump());
  EXPECT_EQ(c.vision->depth, 27);
  EXPECT_EQ(c.vision->hidden_size, 1152);
  EXPECT_EQ(c.vision->hidden_act, "gelu_pytorch_tanh");
  // transformers' default out_hidden_size (3584) is not this model's width: refused, naming both.
  expect_error(with_vision(json::object()), "out_hidden_size (3584) must equal the language model's hidden_size");
}

TEST(VisionConfig, ErrorsNameTheField) {
  json v = qwen36_vision();
  v["num_heads"] = 7;
  expect_error(with_vision(v), "vision_config.hidden_size (1152) must be a multiple of num_heads (7)");
  v = qwen36_vision();
  v["hidden_act"] = "relu";
  expect_error(with_vision(v), "vision_config.hidden_act 'relu' is not supported");
  v = qwen36_vision();
  v["depth"] = 0;
  expect_error(with_vision(v), "vision_config.depth must be positive");
  v = qwen36_vision();
  v["patch_size"] = "16";
  expect_error(with_vision(v), "field 'patch_size' must be an integer");
  v = qwen36_vision();
  v["rope_parameters"] = {{"rope_type", "yarn"}};
  expect_error(with_vision(v), "rope_type 'yarn' is not supported");
  expect_error(with_vision(json::array()), "vision_config must be an object");
}

TEST(VisionConfig, MropeSection) {
  json top = with_vision(qwen36_vision());
  top["text_config"]["rope_parameters"] = {{"rope_type", "default"}, {"mrope_section", {11, 11, 10}},
                                           {"mrope_interleaved", true}, {"partial_rotary_factor", 0.25}};
  Config c = config_parse(top.dump());
  EXPECT_EQ(c.mrope_section, (std::vector<int>{11, 11, 10}));
  EXPECT_TRUE(c.mrope_interleaved);
  top["text_config"]["rope_parameters"]["mrope_section"] = {4, 2};
  expect_error(top, "mrope_section must be a list of 3 integers");
}

}  // namespace
}  // namespace tern
