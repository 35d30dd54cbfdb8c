// What every API's output (openai/chat_output.h, anthropic/anthropic_output.h, ...) shares besides the output
// parser (text/output_parser.h): response and item ids, the time, and a tool call written back as the model's text.
#pragma once

#include <cstdint>
#include <string>

#include "text/output_parser.h"

namespace tern::server {

// A fresh response id: prefix + 24 random hex digits.
std::string response_id(const std::string& prefix);
// Seconds since the Unix epoch.
int64_t unix_now();

// A call written back as the model's XML (<tool_call><function=...><parameter=...>): used when the request offered
// no tools, so that the text stays text (OpenAI content, an Anthropic text block).
std::string tool_call_as_text(const ToolCall& call);

}  // namespace tern::server
