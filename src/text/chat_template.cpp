#include "text/chat_template.h"

#include <fstream>
#include <sstream>

#include "core/check.h"

namespace tern {
namespace {

using ojson = nlohmann::ordered_json;

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  TERN_CHECK(f.good(), "cannot read ", p.string());
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

ojson read_json(const std::filesystem::path& p) {
  try {
    return ojson::parse(read_file(p));
  } catch (const ojson::exception& e) {
    throw Error(p.string() + ": invalid JSON: " + e.what());
  }
}

// A special token in tokenizer_config.json: a string, or {"content": "..."}; empty when absent.
std::string token_text(const ojson& cfg, const char* key) {
  if (!cfg.is_object() || !cfg.contains(key)) return "";
  const ojson& t = cfg[key];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_object() && t.contains("content") && t["content"].is_string()) return t["content"].get<std::string>();
  return "";
}

std::string template_from_config(const ojson& value, const std::string& where) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_array()) {
    for (const auto& entry : value)
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string())
        return entry["template"].get<std::string>();
  }
  throw Error(where + ": chat_template is neither a string nor a list with a \"default\" template");
}

}  // namespace

ojson chat_template_normalize_messages(const ojson& messages) {
  TERN_CHECK(messages.is_array(), "chat template: messages must be an array");
  ojson out = ojson::array();
  for (const auto& m : messages) {
    if (!m.is_object()) {
      out.push_back(m);
      continue;
    }
    ojson msg = ojson::object();
    for (auto it = m.begin(); it != m.end(); ++it)
      if (!it.value().is_null()) msg[it.key()] = it.value();
    // Reasoning under any of its names becomes reasoning_content and thinking (transformers' order of keys).
    const ojson* reasoning = nullptr;
    for (const char* k : {"reasoning_content", "thinking", "reasoning"})
      if (!reasoning && msg.contains(k)) reasoning = &msg[k];
    if (reasoning) {
      ojson r = *reasoning;
      ojson aliased = ojson::object();
      aliased["thinking"] = msg.contains("thinking") ? msg["thinking"] : r;
      for (auto it = msg.begin(); it != msg.end(); ++it)
        if (it.key() != "thinking") aliased[it.key()] = it.value();
      aliased["reasoning_content"] = r;
      msg = std::move(aliased);
    }
    if (msg.contains("tool_calls") && msg["tool_calls"].is_array()) {
      for (auto& call : msg["tool_calls"]) {
        ojson* fn = call.is_object() && call.contains("function") && call["function"].is_object() ? &call["function"]
                                                                                                   : nullptr;
        if (!fn || !fn->contains("arguments") || !(*fn)["arguments"].is_string()) continue;
        ojson parsed = ojson::parse((*fn)["arguments"].get<std::string>(), nullptr, false);
        if (!parsed.is_discarded() && parsed.is_object()) (*fn)["arguments"] = std::move(parsed);
      }
    }
    out.push_back(std::move(msg));
  }
  return out;
}

ChatTemplate ChatTemplate::from_source(std::string source, std::string bos_token, std::string eos_token) {
  ChatTemplate t;
  t.template_ = jinja::Template::parse(source);
  t.source_ = std::move(source);
  if (!bos_token.empty()) t.special_tokens_["bos_token"] = bos_token;
  if (!eos_token.empty()) t.special_tokens_["eos_token"] = eos_token;
  return t;
}

ChatTemplate ChatTemplate::from_model_dir(const std::filesystem::path& dir) {
  ojson cfg = ojson::object();
  const auto cfg_path = dir / "tokenizer_config.json";
  if (std::filesystem::exists(cfg_path)) cfg = read_json(cfg_path);
  std::string source;
  if (std::filesystem::exists(dir / "chat_template.jinja")) {
    source = read_file(dir / "chat_template.jinja");
  } else if (std::filesystem::exists(dir / "chat_template.json")) {
    ojson j = read_json(dir / "chat_template.json");
    TERN_CHECK(j.is_object() && j.contains("chat_template"), (dir / "chat_template.json").string(),
               ": no \"chat_template\" key");
    source = template_from_config(j["chat_template"], (dir / "chat_template.json").string());
  } else {
    TERN_CHECK(cfg.is_object() && cfg.contains("chat_template"), dir.string(),
               ": no chat template (no chat_template.jinja, chat_template.json, or chat_template in "
               "tokenizer_config.json)");
    source = template_from_config(cfg["chat_template"], cfg_path.string());
  }
  ChatTemplate t;
  try {
    t.template_ = jinja::Template::parse(source);
  } catch (const Error& e) {
    throw Error(dir.string() + ": " + e.what());
  }
  t.source_ = std::move(source);
  for (const char* k : {"bos_token", "eos_token", "pad_token", "unk_token"}) {
    std::string v = token_text(cfg, k);
    if (!v.empty()) t.special_tokens_[k] = v;
  }
  return t;
}

std::string ChatTemplate::render(const ChatTemplateInputs& in) const {
  TERN_CHECK(in.tools.is_null() || in.tools.is_array(), "chat template: tools must be an array or null");
  TERN_CHECK(in.extra_kwargs.is_null() || in.extra_kwargs.is_object(),
             "chat template: chat_template_kwargs must be an object");
  ojson ctx = special_tokens_;
  ctx["messages"] = chat_template_normalize_messages(in.messages);
  ctx["tools"] = in.tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = in.add_generation_prompt;
  if (in.extra_kwargs.is_object())
    for (auto it = in.extra_kwargs.begin(); it != in.extra_kwargs.end(); ++it)
      if (it.key() != "messages" && it.key() != "tools" && it.key() != "add_generation_prompt")
        ctx[it.key()] = it.value();
  return template_.render(jinja::from_json(ctx));
}

}  // namespace tern
