// The chat prompt: the request's messages and tools rendered through the model's chat template (see chat_prompt.h).
#include "server/serving/chat_prompt.h"

#include <algorithm>

#include "core/check.h"
#include "server/serving/server_state.h"
#include "text/chat_template.h"
#include "text/jinja.h"
#include "text/tokenizer.h"

namespace tern::server {

namespace {

std::string utf8_of(uint32_t cp) {  // cp in the supplementary planes (4 bytes)
  return {char(0xF0 | (cp >> 18)), char(0x80 | ((cp >> 12) & 0x3F)), char(0x80 | ((cp >> 6) & 0x3F)),
          char(0x80 | (cp & 0x3F))};
}

// The code point of the 4-byte UTF-8 sequence at text[i], or 0.
uint32_t four_byte_at(const std::string& text, size_t i) {
  if (i + 4 > text.size() || (static_cast<unsigned char>(text[i]) & 0xF8) != 0xF0) return 0;
  uint32_t cp = static_cast<unsigned char>(text[i]) & 0x07;
  for (size_t k = 1; k < 4; ++k) {
    const auto b = static_cast<unsigned char>(text[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  return cp;
}

struct Escaper {
  const std::vector<std::string>& specials;
  std::vector<std::string> placeholders;   // placeholders[i] stands for specials[i]
  bool used = false;                        // a special token was found and replaced

  std::string escape(const std::string& s) {
    if (s.find('<') == std::string::npos) return s;  // every special token of the Qwen family starts with '<'
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      bool hit = false;
      for (size_t k = 0; k < specials.size(); ++k) {
        if (!specials[k].empty() && s.compare(i, specials[k].size(), specials[k]) == 0) {
          out += placeholders[k];
          used = true;
          i += specials[k].size();
          hit = true;
          break;
        }
      }
      if (!hit) out += s[i++];
    }
    return out;
  }

  void walk(Json& j) {
    if (j.is_string()) {
      j = escape(j.get_ref<const std::string&>());
    } else if (j.is_array()) {
      for (Json& x : j) walk(x);
    } else if (j.is_object()) {
      Json out = Json::object();
      for (auto& [k, v] : j.items()) {
        Json value = v;
        walk(value);
        out[escape(k)] = std::move(value);
      }
      j = std::move(out);
    }
  }
};

// A private-use code point of plane 15 (the escaper's placeholders are in plane 16) that `text` does not contain.
std::string unused_marker(const std::string& text) {
  for (uint32_t cp = 0xFFFFD; cp >= 0xF0000; --cp)
    if (text.find(utf8_of(cp)) == std::string::npos) return utf8_of(cp);
  return "";
}

std::string string_field(const Json& message, const char* key) {
  auto it = message.find(key);
  return it != message.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// ChatRequest::continue_final_message: readies `in` so that its last message, an assistant message, renders as the
// start of the reply. The text to continue is the message's content, or, when that is empty, its reasoning_content
// (the model continues its thought). A marker is appended to that text and the template renders the message as
// history without a generation prompt; the prompt is then cut at the marker (chat_render_prompt). Returns the
// marker; "" when the message holds no text (it is dropped, and the reply starts as usual).
std::variant<std::string, ApiError> mark_continuation(ChatTemplateInputs& in, bool constrained) {
  Json& last = in.messages.back();
  if (last.contains("tool_calls"))
    return api_error_invalid("messages", "The last message is an assistant message with tool calls: send the "
                                         "tools' results after it (role tool), or end with the text to continue.");
  const std::string content = string_field(last, "content"), reasoning = string_field(last, "reasoning_content");
  if (content.empty() && reasoning.empty()) {
    in.messages.erase(in.messages.end() - 1);
    return std::string();
  }
  if (!content.empty() && constrained)
    return api_error_invalid("messages", "The last message is an assistant message to continue, but the reply is "
                                         "constrained from its start (response_format or a forced tool call): "
                                         "use one or the other.");
  const std::string marker =
      unused_marker(json_dump(in.messages) + json_dump(in.tools) + json_dump(in.extra_kwargs));
  if (marker.empty())
    return api_error_invalid("messages", "The messages use every private-use code point that tern needs to "
                                         "continue the last assistant message.");
  if (content.empty()) last["reasoning_content"] = reasoning + marker;
  else last["content"] = content + marker;
  in.add_generation_prompt = false;
  return marker;
}

}  // namespace

std::vector<int32_t> chat_prompt_tokens(const ChatPrompt& prompt, const Tokenizer& tokenizer) {
  std::vector<int32_t> out;
  if (prompt.escaped.empty()) {
    tokenizer.encode_append(prompt.text, out);
    return out;
  }
  const std::string& t = prompt.text;
  size_t start = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    const uint32_t cp = four_byte_at(t, i);
    if (cp < prompt.placeholder_base || cp >= prompt.placeholder_base + prompt.escaped.size()) continue;
    tokenizer.encode_append(std::string_view(t).substr(start, i - start), out);
    tokenizer.encode_append(prompt.escaped[cp - prompt.placeholder_base], out, /*special_as_text=*/true);
    i += 3;
    start = i + 1;
  }
  tokenizer.encode_append(std::string_view(t).substr(start), out);
  return out;
}

std::vector<int64_t> chat_prompt_checkpoints(const std::vector<int32_t>& prompt, const Tokenizer& tokenizer) {
  if (const std::optional<int32_t> im_start = tokenizer.token_id("<|im_start|>"))
    for (size_t i = prompt.size(); i-- > 0;)
      if (prompt[i] == *im_start) return {int64_t(i)};
  return {};
}

void set_reasoning_controls(const ServerState& state, GenerationRequest& request, std::optional<int64_t> budget,
                         bool starts_in_reasoning) {
  request.starts_in_reasoning = starts_in_reasoning;
  if (!request.grammar_start_after.empty())
    request.grammar_start_tokens = state.model.tokenizer->encode(request.grammar_start_after);
  const int64_t b = budget.value_or(state.options.thinking_budget);
  if (b < 0) return;
  request.thinking_budget = b;
  request.reasoning_close_tokens = state.model.tokenizer->encode(kReasoningBudgetClose);
}

bool prompt_ends_in_reasoning(const std::string& prompt) {
  const size_t open = prompt.rfind("<think>");
  if (open == std::string::npos) return false;
  const size_t close = prompt.rfind("</think>");
  return close == std::string::npos || close < open;
}

std::variant<ChatPrompt, ApiError> chat_render_prompt(const ChatRequest& request, const ChatTemplate& chat_template,
                                                      const std::vector<std::string>& escape_special) {
  ChatTemplateInputs in;
  in.messages = request.messages;
  in.tools = request.tools.empty() ? Json(nullptr) : request.tools;
  in.add_generation_prompt = true;
  in.extra_kwargs = request.chat_template_kwargs;
  ChatPrompt p;
  if (!escape_special.empty()) {
    // Placeholders: code points that the request does not contain (plane 16, private use).
    const std::string all = json_dump(in.messages) + json_dump(in.tools) + json_dump(in.extra_kwargs);
    for (uint32_t base = 0x10F000; base >= 0x100000 && p.placeholder_base == 0; base -= 0x1000) {
      bool clash = false;
      for (size_t i = 0; i < escape_special.size() && !clash; ++i)
        clash = all.find(utf8_of(base + uint32_t(i))) != std::string::npos;
      if (!clash) p.placeholder_base = base;
    }
    if (p.placeholder_base == 0)
      return api_error_invalid("messages", "The messages use every private-use code point that tern needs to keep "
                                           "special tokens in content as text.");
    Escaper esc{escape_special, {}};
    for (size_t i = 0; i < escape_special.size(); ++i) esc.placeholders.push_back(utf8_of(p.placeholder_base + uint32_t(i)));
    esc.walk(in.messages);
    esc.walk(in.tools);
    esc.walk(in.extra_kwargs);
    if (esc.used) p.escaped = escape_special;
  }
  std::string marker;  // where the continued assistant message's text ends in the rendered prompt
  if (request.continue_final_message && !in.messages.empty() && in.messages.back().is_object() &&
      string_field(in.messages.back(), "role") == "assistant") {
    auto marked = mark_continuation(in, request.grammar != nullptr);
    if (auto* e = std::get_if<ApiError>(&marked)) return *e;
    marker = std::get<std::string>(marked);
  }
  try {
    try {
      p.text = chat_template.render(in);
    } catch (const jinja::TemplateException& e) {
      // Qwen's template refuses a conversation with no user query (one that starts with tool results, as agents
      // resume). Render it behind an empty user turn instead of failing the request.
      if (std::string(e.what()).find("No user query found") == std::string::npos) throw;
      size_t at = 0;
      while (at < in.messages.size() && in.messages[at]["role"] == "system") ++at;
      in.messages.insert(in.messages.begin() + ptrdiff_t(at), Json{{"role", "user"}, {"content", ""}});
      p.text = chat_template.render(in);
    }
    if (!marker.empty()) {
      const size_t end = p.text.rfind(marker);
      if (end == std::string::npos)
        return api_error_invalid("messages", "The chat template does not show the last assistant message's text, "
                                             "so it cannot be continued; end with a user message.");
      p.text.resize(end);
    }
    p.starts_in_reasoning = prompt_ends_in_reasoning(p.text);
    return p;
  } catch (const Error& e) {
    return api_error_invalid("messages", "The chat template rejected the messages: " + strip_error_location(e.what()));
  } catch (const std::exception& e) {
    return api_error_invalid("messages", std::string("The chat template failed on the messages: ") + e.what());
  }
}

}  // namespace tern::server
