// The chat prompt: the request's messages and tools rendered through the model's chat template.
#include "core/check.h"
#include "server/chat_output.h"
#include "text/chat_template.h"

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
    p.text = chat_template.render(in);
    p.starts_in_reasoning = prompt_ends_in_reasoning(p.text);
    return p;
  } catch (const Error& e) {
    return api_error_invalid("messages", "The chat template rejected the messages: " + strip_error_location(e.what()));
  } catch (const std::exception& e) {
    return api_error_invalid("messages", std::string("The chat template failed on the messages: ") + e.what());
  }
}

}  // namespace tern::server
