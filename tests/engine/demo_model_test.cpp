// The demo model: deterministic weights in the 4-bit layout, the embedded tokenizer and template, and a forward pass
// and generation through the CPU backend.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "cpu/cpu_runner.h"
#include "engine/demo_model.h"
#include "engine/demo_vision.h"
#include "engine/generator.h"
#include "engine/model_source.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace tern {
namespace {

bool same_bytes(const Matrix& a, const Matrix& b) {
  if (a.format != b.format || a.rows != b.rows || a.cols != b.cols || a.experts != b.experts) return false;
  const size_t words = size_t(a.experts * a.rows * a.row_words()), groups = size_t(a.experts * a.rows * a.groups_per_row());
  return std::memcmp(a.data, b.data, words * 4) == 0 && std::memcmp(a.scales, b.scales, groups * 2) == 0 &&
         std::memcmp(a.biases, b.biases, groups * 2) == 0;
}

TEST(DemoModel, SameSeedSameWeightsOtherSeedOtherWeights) {
  DemoModelOptions o;
  o.vocab_real = 1000;
  const auto a = demo_model_build(o), b = demo_model_build(o);
  o.seed += 1;
  const auto c = demo_model_build(o);
  const auto ma = a->all_matrices(), mb = b->all_matrices(), mc = c->all_matrices();
  ASSERT_EQ(ma.size(), mb.size());
  for (size_t i = 0; i < ma.size(); ++i) {
    EXPECT_TRUE(same_bytes(*ma[i].second, *mb[i].second)) << ma[i].first;
    EXPECT_FALSE(same_bytes(*ma[i].second, *mc[i].second)) << ma[i].first;
    EXPECT_TRUE(ma[i].second->quantized()) << ma[i].first;
  }
  EXPECT_EQ(a->layers[0].A_log, b->layers[0].A_log);
}

TEST(DemoModel, RealArchitectureAtASmallSize) {
  DemoModelOptions o;
  o.vocab_real = 1000;
  const auto w = demo_model_build(o);
  const Config& c = w->config;
  EXPECT_EQ(c.vocab_size, 1024);  // padded to a multiple of 64
  EXPECT_EQ(w->vocab_real, 1000);
  EXPECT_EQ(w->source_layout, "demo");
  ASSERT_EQ(c.num_hidden_layers, 4);
  EXPECT_EQ(c.layer_types[3], LayerType::full_attention);
  EXPECT_EQ(c.layer_types[0], LayerType::linear_attention);
  EXPECT_EQ(w->layers[0].router.format, WeightFormat::affine8);  // as MLX quantises the router
  EXPECT_EQ(w->layers[0].expert_gate.format, WeightFormat::affine4);
  EXPECT_EQ(w->layers[0].expert_gate.experts, c.num_experts);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{151645, 151643}));
  EXPECT_EQ(c.gen_top_k, 20);
}

TEST(DemoModel, TheMtpHeadLeavesTheOtherWeightsAsTheyWere) {
  DemoModelOptions o;
  o.vocab_real = 1000;
  const auto with = demo_model_build(o);
  o.mtp = false;
  const auto without = demo_model_build(o);
  ASSERT_TRUE(with->mtp.has_value());
  EXPECT_FALSE(without->mtp.has_value());
  EXPECT_FALSE(without->mtp_absent.empty());
  EXPECT_EQ(with->mtp->layer.type, LayerType::full_attention);
  EXPECT_EQ(with->mtp->fc.cols, 2 * with->config.hidden_size);
  const auto a = with->all_matrices(), b = without->all_matrices();
  ASSERT_EQ(a.size(), b.size() + 13) << "fc and the layer's 12 matrices";
  for (size_t i = 0; i < b.size(); ++i) {
    ASSERT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(same_bytes(*a[i].second, *b[i].second)) << a[i].first;
  }
  for (size_t i = 0; i < with->layers.size(); ++i) EXPECT_EQ(with->layers[i].A_log, without->layers[i].A_log);
  EXPECT_EQ(with->final_norm, without->final_norm);
  // The same logits through the CPU backend.
  std::vector<float> la, lb;
  const std::vector<int32_t> tokens = {3, 141, 59, 26, 535};
  auto ra = cpu_runner_create(with), rb = cpu_runner_create(without);
  auto sa = ra->create_session(16), sb = rb->create_session(16);
  ra->forward(*sa, tokens, true, la);
  rb->forward(*sb, tokens, true, lb);
  EXPECT_EQ(la, lb);
}

// The vision encoder comes from a seed stream of its own: the language model's weights, and so every text output,
// are those of the demo without it.
TEST(DemoModel, VisionEncoderLeavesTheLanguageModelAlone) {
  DemoModelOptions o;
  const auto with = demo_model_build(o);
  o.vision = false;
  const auto without = demo_model_build(o);
  ASSERT_TRUE(with->vision);
  EXPECT_FALSE(without->vision);
  const Config& c = with->config;
  ASSERT_TRUE(c.vision.has_value());
  EXPECT_EQ(c.vision->out_hidden_size, c.hidden_size);
  EXPECT_EQ(c.image_token_id, kDemoImageTokenId);
  EXPECT_EQ(demo_tokenizer()->token_id("<|image_pad|>"), kDemoImageTokenId);
  EXPECT_EQ(demo_tokenizer()->token_id("<|vision_start|>"), kDemoVisionStartId);
  EXPECT_EQ(demo_tokenizer()->token_id("<|vision_end|>"), kDemoVisionEndId);
  const auto a = with->all_matrices(), b = without->all_matrices();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bytes(*a[i].second, *b[i].second)) << a[i].first;
  EXPECT_EQ(with->final_norm, without->final_norm);
  EXPECT_EQ(with->layers[0].A_log, without->layers[0].A_log);
  EXPECT_EQ(c.layer_types, without->config.layer_types);
  EXPECT_EQ(c.rotary_dims(), without->config.rotary_dims());
  DemoModelOptions small;
  small.vocab_real = 1000;  // a vocabulary without the image tokens: no encoder
  EXPECT_FALSE(demo_model_build(small)->vision);
}

TEST(DemoModel, EmbeddedTokenizerAndTemplate) {
  const auto tok = demo_tokenizer();
  EXPECT_EQ(tok->vocab_size(), 151669);
  EXPECT_EQ(tok->token_id("<|im_end|>"), 151645);
  EXPECT_EQ(tok->decode(tok->encode("Hello, world!")), "Hello, world!");
  const ChatTemplate t = ChatTemplate::from_source(demo_chat_template_source());
  ChatTemplateInputs in;
  in.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "Hi"}}});
  const std::string text = t.render(in);
  EXPECT_NE(text.find("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"), std::string::npos) << text;
}

TEST(DemoModel, ModelSourceGeneratesThroughTheCpuBackend) {
  const ModelSource src = model_source_open({});
  EXPECT_TRUE(src.demo);
  EXPECT_EQ(src.name, kDemoModelName);
  EXPECT_NE(src.banner.find("RANDOM"), std::string::npos);
  EXPECT_EQ(src.weights->vocab_real, 151669);
  ASSERT_TRUE(src.chat_template);
  auto runner = cpu_runner_create(src.weights);
  auto session = runner->create_session(64);
  std::vector<float> logits;
  const std::vector<int32_t> prompt = src.tokenizer->encode("The quick brown fox");
  runner->forward(*session, prompt, false, logits);
  ASSERT_EQ(int64_t(logits.size()), src.weights->config.vocab_size);
  for (int64_t i = 0; i < src.weights->config.vocab_size; ++i) {
    if (i < 151669) ASSERT_TRUE(std::isfinite(logits[size_t(i)])) << i;
    else ASSERT_TRUE(std::isinf(logits[size_t(i)]) && logits[size_t(i)] < 0) << i;
  }
  session->reset();
  Generator gen(*runner, *src.tokenizer);
  GenerationRequest req;
  req.prompt = prompt;
  req.max_tokens = 8;
  req.sampling = src.defaults;
  req.sampling.seed = std::random_device{}();
  std::printf("seed=%llu\n", static_cast<unsigned long long>(*req.sampling.seed));
  std::string streamed;
  const GenerationResult r = gen.generate(*session, req, [&](const TokenEvent& e) {
    streamed += e.text;
    return true;
  });
  EXPECT_LE(r.completion_tokens, 8);
  EXPECT_EQ(streamed, r.text);
  // The streamed text is the detokenized output (minus a final end id).
  std::vector<int32_t> shown = r.tokens;
  if (r.stop_id >= 0) shown.pop_back();
  EXPECT_EQ(r.text, src.tokenizer->decode(shown, true));
}

}  // namespace
}  // namespace tern
