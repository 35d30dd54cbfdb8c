// The model's output as Anthropic Messages content blocks and stream events (see anthropic_output.h).
#include "server/anthropic/anthropic_output.h"

#include <cstdint>
#include <cstdio>

#include "server/http/respond.h"
#include "server/serving/output_common.h"

namespace tern::server {

namespace {

const char* error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

}  // namespace

std::string anthropic_tool_id(const std::string& call_id) {
  const std::string prefix = "call_";
  return "toolu_" + (call_id.rfind(prefix, 0) == 0 ? call_id.substr(prefix.size()) : call_id);
}

Json anthropic_error_json(const ApiError& error) {
  return Json{{"type", "error"}, {"error", Json{{"type", error_type(error.status)}, {"message", error.message}}}};
}

void respond_anthropic_error(httplib::Response& res, const ApiError& error) {
  respond_error_with_body(res, error, anthropic_error_json(error));
}

AnthropicOutput::AnthropicOutput(AnthropicOutputOptions options) : options_(std::move(options)) {
  parser_ = std::make_unique<OutputParser>(options_.starts_in_reasoning,
                                           options_.tools.empty() ? Json(nullptr) : options_.tools);
}

AnthropicOutput::~AnthropicOutput() = default;

std::vector<Json> AnthropicOutput::first_events() const {
  Json message = {{"id", options_.id},
                  {"type", "message"},
                  {"role", "assistant"},
                  {"model", options_.model},
                  {"content", Json::array()},
                  {"stop_reason", nullptr},
                  {"stop_sequence", nullptr},
                  {"usage", Json{{"input_tokens", options_.prompt_tokens},
                                 {"output_tokens", 0},
                                 {"cache_creation_input_tokens", 0},
                                 {"cache_read_input_tokens", 0}}}};
  return {Json{{"type", "message_start"}, {"message", std::move(message)}}, Json{{"type", "ping"}}};
}

namespace {

// Anthropic signs each thinking block (an opaque string; clients keep it and send it back with the block). tern has
// no keys to sign with: the signature is a digest of the text that says it is tern's, so that clients that expect
// a non-empty one (and its signature_delta before the block's end) get one; tern ignores signatures it is sent.
std::string thinking_signature(const std::string& text) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a, 64-bit
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  char buf[32];
  std::snprintf(buf, sizeof buf, "tern-%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace

void AnthropicOutput::close_block(std::vector<Json>& events) {
  if (open_ == Block::none) return;
  if (open_ == Block::thinking) {
    Json& block = content_.back();
    block["signature"] = thinking_signature(block["thinking"].get<std::string>());
    events.push_back(Json{{"type", "content_block_delta"},
                          {"index", content_.size() - 1},
                          {"delta", Json{{"type", "signature_delta"}, {"signature", block["signature"]}}}});
  }
  events.push_back(Json{{"type", "content_block_stop"}, {"index", content_.size() - 1}});
  open_ = Block::none;
}

void AnthropicOutput::append_text(Block kind, const std::string& text, std::vector<Json>& events) {
  if (text.empty()) return;
  const bool thinking = kind == Block::thinking;
  const char* field = thinking ? "thinking" : "text";
  if (open_ != kind) {
    close_block(events);
    Json block = thinking ? Json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                          : Json{{"type", "text"}, {"text", ""}};
    events.push_back(Json{{"type", "content_block_start"}, {"index", content_.size()}, {"content_block", block}});
    content_.push_back(std::move(block));
    open_ = kind;
  }
  content_.back()[field] = content_.back()[field].get<std::string>() + text;
  events.push_back(Json{{"type", "content_block_delta"},
                        {"index", content_.size() - 1},
                        {"delta", Json{{"type", thinking ? "thinking_delta" : "text_delta"}, {field, text}}}});
}

void AnthropicOutput::absorb(const ParsedDelta& d, std::vector<Json>& events) {
  append_text(Block::thinking, d.reasoning, events);
  std::string text = d.content;
  if (options_.tools.empty())
    for (const ToolCall& call : d.tool_calls_completed) text += tool_call_as_text(call);
  append_text(Block::text, text, events);
  if (options_.tools.empty()) return;
  for (const ToolCall& call : d.tool_calls_completed) {
    if (!options_.parallel_tool_calls && tool_uses_ > 0) continue;
    ++tool_uses_;
    Json input = Json::parse(call.arguments_json, nullptr, false);
    if (!input.is_object()) input = Json::object();
    close_block(events);
    const size_t index = content_.size();
    const std::string id = anthropic_tool_id(call.id);
    events.push_back(Json{{"type", "content_block_start"},
                          {"index", index},
                          {"content_block", Json{{"type", "tool_use"}, {"id", id}, {"name", call.name},
                                                 {"input", Json::object()}}}});
    events.push_back(Json{{"type", "content_block_delta"},
                          {"index", index},
                          {"delta", Json{{"type", "input_json_delta"}, {"partial_json", json_dump(input)}}}});
    events.push_back(Json{{"type", "content_block_stop"}, {"index", index}});
    content_.push_back(Json{{"type", "tool_use"}, {"id", id}, {"name", call.name}, {"input", std::move(input)}});
  }
}

std::vector<Json> AnthropicOutput::on_token(const TokenEvent& event) {
  std::vector<Json> events;
  absorb(parser_->push(event.text), events);
  return events;
}

Json AnthropicOutput::stop_reason(const GenerationResult& r) const {
  switch (r.finish) {
    case FinishReason::length: return "max_tokens";
    case FinishReason::context: return "model_context_window_exceeded";
    default:
      if (tool_uses_ > 0) return "tool_use";
      if (!r.stop_string.empty()) return "stop_sequence";
      return "end_turn";
  }
}

Json AnthropicOutput::usage(const GenerationResult& r) const {
  return Json{{"input_tokens", r.prompt_tokens - r.cached_tokens},
              {"output_tokens", r.completion_tokens},
              {"cache_creation_input_tokens", 0},
              {"cache_read_input_tokens", r.cached_tokens}};
}

std::vector<Json> AnthropicOutput::finish_chunks(const GenerationResult& result) {
  std::vector<Json> events;
  if (!finished_) {
    finished_ = true;
    absorb(parser_->finish(), events);
  }
  close_block(events);
  events.push_back(Json{{"type", "message_delta"},
                        {"delta", Json{{"stop_reason", stop_reason(result)},
                                       {"stop_sequence", result.stop_string.empty() ? Json(nullptr)
                                                                                   : Json(result.stop_string)}}},
                        {"usage", usage(result)}});
  events.push_back(Json{{"type", "message_stop"}});
  return events;
}

Json AnthropicOutput::response(const GenerationResult& result) {
  if (!finished_) {
    finished_ = true;
    std::vector<Json> ignored;
    absorb(parser_->finish(), ignored);
  }
  std::vector<Json> ignored;
  close_block(ignored);  // the last block's signature
  return Json{{"id", options_.id},
              {"type", "message"},
              {"role", "assistant"},
              {"model", options_.model},
              {"content", content_},
              {"stop_reason", stop_reason(result)},
              {"stop_sequence", result.stop_string.empty() ? Json(nullptr) : Json(result.stop_string)},
              {"usage", usage(result)}};
}

}  // namespace tern::server
