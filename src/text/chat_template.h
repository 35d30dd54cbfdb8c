// The model's chat template, rendered byte-exactly as transformers' apply_chat_template does (see jinja.h for the
// Jinja2 subset the interpreter covers).
//
//   auto tmpl = ChatTemplate::from_model_dir(dir);     // chat_template.jinja, else tokenizer_config.json
//   std::string prompt = tmpl.render({.messages = body["messages"], .tools = body["tools"],
//                                     .extra_kwargs = body["chat_template_kwargs"]});
//
// Inputs are nlohmann::ordered_json: parse request bodies with nlohmann::ordered_json::parse so that objects keep
// their key order (tools are printed with tojson, whose bytes follow the order the client sent).
//
// What render() does before the template sees the messages (as transformers, plus one vLLM convention):
//   - keys whose value is null are dropped from each message (transformers' _normalize_chat_messages);
//   - reasoning given as reasoning_content, thinking or reasoning is copied to both reasoning_content and
//     thinking (transformers' _alias_reasoning_fields);
//   - an assistant tool call whose function.arguments is a string holding a JSON object gets that object instead
//     (vLLM does the same; OpenAI clients send arguments as a string, the Qwen templates iterate them as a mapping).
// The template's variables: messages, tools (null when absent), documents (null), add_generation_prompt, the
// special tokens (bos_token, eos_token, pad_token, unk_token when known), then every key of extra_kwargs
// (enable_thinking, preserve_thinking, ...), which overrides the others except messages, tools and
// add_generation_prompt.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "text/jinja.h"

namespace tern {

struct ChatTemplateInputs {
  nlohmann::ordered_json messages;    // OpenAI-style messages (already validated by the server)
  nlohmann::ordered_json tools;       // array or null
  bool add_generation_prompt = true;
  nlohmann::ordered_json extra_kwargs;  // chat_template_kwargs: enable_thinking, preserve_thinking, ... (object or null)
};

class ChatTemplate {
 public:
  // Reads chat_template.jinja, else chat_template.json, else tokenizer_config.json["chat_template"] (a string, or
  // the "default" entry of a list of named templates); special tokens from tokenizer_config.json.
  static ChatTemplate from_model_dir(const std::filesystem::path& dir);
  // Empty bos/eos tokens are left undefined.
  static ChatTemplate from_source(std::string source, std::string bos_token = "", std::string eos_token = "");

  // Throws tern::Error on a template error; jinja::TemplateException (a tern::Error whose what() is the
  // template's message) when the template calls raise_exception, e.g. "No user query found in messages.".
  std::string render(const ChatTemplateInputs& in) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  jinja::Template template_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
};

// The messages as the template sees them (null keys dropped, reasoning aliased, string arguments parsed).
nlohmann::ordered_json chat_template_normalize_messages(const nlohmann::ordered_json& messages);

}  // namespace tern
