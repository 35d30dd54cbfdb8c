// ChatTemplate: loading from a model folder, message normalisation, and the Qwen3.6 template on fixed cases (the
// byte-exact comparison with transformers over a random corpus is tests/py/test_chat_template.py).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "text/chat_template.h"

namespace tern {
namespace {

using ojson = nlohmann::ordered_json;

// tests/data/templates, found from this file's path (CMake compiles with absolute source paths).
const std::filesystem::path kTemplates = std::filesystem::path(__FILE__).parent_path().parent_path() / "data" / "templates";

std::string read(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() / ("tern_tmpl_" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  void write(const std::string& name, const std::string& text) const { std::ofstream(path / name) << text; }
};

ChatTemplate qwen36() { return ChatTemplate::from_source(read(kTemplates / "qwen3_6.jinja")); }

TEST(ChatTemplate, Qwen36UserTurnAndGenerationPrompt) {
  ChatTemplateInputs in;
  in.messages = ojson::parse(R"([{"role":"system","content":" Be brief. "},{"role":"user","content":"Hi ✓"}])");
  EXPECT_EQ(qwen36().render(in),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi ✓<|im_end|>\n<|im_start|>assistant\n<think>\n");
  in.extra_kwargs = {{"enable_thinking", false}};
  EXPECT_EQ(qwen36().render(in),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi ✓<|im_end|>\n<|im_start|>assistant\n"
            "<think>\n\n</think>\n\n");
}

TEST(ChatTemplate, Qwen36ToolCallsWithStringArgumentsAndToolRuns) {
  ChatTemplateInputs in;
  in.messages = ojson::parse(R"([
    {"role":"user","content":"weather?"},
    {"role":"assistant","content":null,"reasoning":"need data","tool_calls":[
      {"id":"1","type":"function","function":{"name":"get","arguments":"{\"city\": \"Paris\", \"n\": 2, \"f\": true}"}},
      {"id":"2","type":"function","function":{"name":"get","arguments":{"city":"Lyon"}}}]},
    {"role":"tool","tool_call_id":"1","content":"sunny"},
    {"role":"tool","tool_call_id":"2","content":"rain"}])");
  in.add_generation_prompt = false;
  EXPECT_EQ(qwen36().render(in),
            "<|im_start|>user\nweather?<|im_end|>\n<|im_start|>assistant\n<think>\nneed data\n</think>\n\n"
            "<tool_call>\n<function=get>\n<parameter=city>\nParis\n</parameter>\n<parameter=n>\n2\n</parameter>\n"
            "<parameter=f>\ntrue\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get>\n"
            "<parameter=city>\nLyon\n</parameter>\n</function>\n</tool_call><|im_end|>\n<|im_start|>user\n"
            "<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrain\n</tool_response><|im_end|>\n");
}

TEST(ChatTemplate, RaiseExceptionKeepsTheTemplatesMessage) {
  ChatTemplateInputs in;
  in.messages = ojson::parse(R"([{"role":"tool","content":"r"}])");
  try {
    qwen36().render(in);
    FAIL() << "no exception";
  } catch (const jinja::TemplateException& e) {
    EXPECT_STREQ(e.what(), "No user query found in messages.");
  }
}

TEST(ChatTemplate, NormalizeMessages) {
  ojson m = chat_template_normalize_messages(ojson::parse(R"([
    {"role":"assistant","content":"x","name":null,"reasoning":"r",
     "tool_calls":[{"function":{"name":"f","arguments":"not json"}},{"function":{"name":"g","arguments":"[1]"}}]}])"));
  EXPECT_EQ(m.dump(), R"([{"thinking":"r","role":"assistant","content":"x","reasoning":"r","tool_calls":[)"
                      R"({"function":{"name":"f","arguments":"not json"}},{"function":{"name":"g","arguments":"[1]"}}],)"
                      R"("reasoning_content":"r"}])");
}

TEST(ChatTemplate, FromModelDirReadsJinjaThenTokenizerConfig) {
  TempDir d;
  d.write("tokenizer_config.json",
          R"({"eos_token":{"content":"<E>"},"bos_token":null,"chat_template":"cfg {{ eos_token }}{{ bos_token is defined }}"})");
  ChatTemplateInputs in;
  in.messages = ojson::array();
  EXPECT_EQ(ChatTemplate::from_model_dir(d.path).render(in), "cfg <E>False");
  d.write("chat_template.jinja", "jinja {{ messages|length }} {{ add_generation_prompt }} {{ tools }}\n");
  EXPECT_EQ(ChatTemplate::from_model_dir(d.path).render(in), "jinja 0 True None");
  d.write("chat_template.jinja", "{% for %}");
  try {
    ChatTemplate::from_model_dir(d.path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 1"), std::string::npos) << e.what();
  }
  TempDir empty;
  EXPECT_THROW(ChatTemplate::from_model_dir(empty.path), Error);
}

TEST(ChatTemplate, AllShippedTemplatesParse) {
  for (const char* name : {"qwen3.jinja", "qwen3_5.jinja", "qwen3_6.jinja"})
    EXPECT_NO_THROW(ChatTemplate::from_source(read(kTemplates / name))) << name;
}

}  // namespace
}  // namespace tern
