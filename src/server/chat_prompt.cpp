// The chat prompt: the request's messages and tools rendered through the model's chat template.
#include "core/check.h"
#include "server/chat_output.h"
#include "text/chat_template.h"
#include "text/jinja.h"

namespace tern::server {

bool prompt_ends_in_reasoning(const std::string& prompt) {
  const size_t open = prompt.rfind("<think>");
  if (open == std::string::npos) return false;
  const size_t close = prompt.rfind("</think>");
  return close == std::string::npos || close < open;
}

std::variant<ChatPrompt, ApiError> chat_render_prompt(const ChatRequest& request, const ChatTemplate& chat_template) {
  ChatTemplateInputs in;
  in.messages = request.messages;
  in.tools = request.tools.empty() ? Json(nullptr) : request.tools;
  in.add_generation_prompt = true;
  in.extra_kwargs = request.chat_template_kwargs;
  try {
    ChatPrompt p;
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
    p.starts_in_reasoning = prompt_ends_in_reasoning(p.text);
    return p;
  } catch (const Error& e) {
    return api_error_invalid("messages", "The chat template rejected the messages: " + strip_error_location(e.what()));
  } catch (const std::exception& e) {
    return api_error_invalid("messages", std::string("The chat template failed on the messages: ") + e.what());
  }
}

}  // namespace tern::server
