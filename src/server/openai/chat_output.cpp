// The model's chat output as OpenAI messages and stream deltas (see chat_output.h).
#include "server/openai/chat_output.h"

#include "text/tokenizer.h"

namespace tern::server {

ChatOutput::ChatOutput(const ChatRequest& request, const Tokenizer& tokenizer, ResponseMeta meta,
                       bool starts_in_reasoning)
    : request_(request), tokenizer_(tokenizer), meta_(std::move(meta)) {
  parse_tools_ = !request.tools.empty();
  parser_ = std::make_unique<OutputParser>(starts_in_reasoning, parse_tools_ ? request.tools : Json(nullptr));
}

ChatOutput::~ChatOutput() = default;

Json ChatOutput::chunk(Json delta, const Json& finish_reason) {
  Json choice = {{"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr}, {"finish_reason", finish_reason}};
  if (!pending_logprobs_.empty()) {
    choice["logprobs"] = Json{{"content", pending_logprobs_}};
    pending_logprobs_ = Json::array();
  }
  Json c = {{"id", meta_.id},
            {"object", "chat.completion.chunk"},
            {"created", meta_.created},
            {"model", meta_.model},
            {"choices", Json::array({std::move(choice)})}};
  if (request_.include_usage) c["usage"] = nullptr;
  return c;
}

Json ChatOutput::first_chunk() const {
  Json choice = {{"index", 0},
                 {"delta", Json{{"role", "assistant"}, {"content", ""}}},
                 {"logprobs", nullptr},
                 {"finish_reason", nullptr}};
  Json c = {{"id", meta_.id},
            {"object", "chat.completion.chunk"},
            {"created", meta_.created},
            {"model", meta_.model},
            {"choices", Json::array({std::move(choice)})}};
  if (request_.include_usage) c["usage"] = nullptr;
  return c;
}

std::vector<Json> ChatOutput::progress_chunks(const TaskProgress& progress) const {
  if (!request_.return_progress) return {};
  Json choice = {{"index", 0}, {"delta", Json::object()}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  Json c = {{"id", meta_.id},
            {"object", "chat.completion.chunk"},
            {"created", meta_.created},
            {"model", meta_.model},
            {"choices", Json::array({std::move(choice)})},
            {"prompt_progress", prompt_progress_json(progress)}};
  if (request_.include_usage) c["usage"] = nullptr;
  return {c};
}

Json ChatOutput::absorb(const ParsedDelta& d) {
  Json delta = Json::object();
  std::string content = d.content;
  Json calls = Json::array();
  for (const ToolCall& call : d.tool_calls_completed) {
    if (!parse_tools_) {
      content += tool_call_as_text(call);
      continue;
    }
    if (!request_.parallel_tool_calls && !tool_calls_.empty()) {
      ++dropped_calls_;
      continue;
    }
    const int index = int(tool_calls_.size());
    Json function = {{"name", call.name}, {"arguments", call.arguments_json}};
    tool_calls_.push_back(Json{{"id", call.id}, {"type", "function"}, {"function", function}});
    calls.push_back(Json{{"index", index}, {"id", call.id}, {"type", "function"}, {"function", function}});
  }
  if (!d.reasoning.empty()) {
    reasoning_ += d.reasoning;
    delta["reasoning_content"] = d.reasoning;
  }
  if (!content.empty()) {
    content_ += content;
    delta["content"] = content;
  }
  if (!calls.empty()) delta["tool_calls"] = std::move(calls);
  return delta;
}

std::vector<Json> ChatOutput::on_token(const TokenEvent& event) {
  std::vector<Json> out;
  if (request_.logprobs && event.has_logprobs && event.id >= 0) {
    Json entry = chat_logprob_entry(tokenizer_, event);
    logprobs_.push_back(entry);
    pending_logprobs_.push_back(std::move(entry));
  }
  Json delta = absorb(parser_->push(event.text));
  if (!delta.empty() || !pending_logprobs_.empty()) out.push_back(chunk(std::move(delta), nullptr));
  return out;
}

const char* ChatOutput::finish_reason(const GenerationResult& result) const {
  if (result.finish == FinishReason::stop && !tool_calls_.empty()) return "tool_calls";
  return finish_reason_text(result.finish);
}

std::vector<Json> ChatOutput::finish_chunks(const GenerationResult& result) {
  std::vector<Json> out;
  Json delta = Json::object();
  if (!finished_) {
    finished_ = true;
    delta = absorb(parser_->finish());
  }
  out.push_back(chunk(std::move(delta), finish_reason(result)));
  if (request_.include_usage) {
    Json u = {{"id", meta_.id},
              {"object", "chat.completion.chunk"},
              {"created", meta_.created},
              {"model", meta_.model},
              {"choices", Json::array()}};
    u["usage"] = usage_json(result);
    out.push_back(std::move(u));
  }
  return out;
}

Json ChatOutput::response(const GenerationResult& result) {
  if (!finished_) {
    finished_ = true;
    absorb(parser_->finish());
  }
  Json message = {{"role", "assistant"},
                  {"content", content_.empty() && !tool_calls_.empty() ? Json(nullptr) : Json(content_)},
                  {"reasoning_content", reasoning_.empty() ? Json(nullptr) : Json(reasoning_)}};
  if (!tool_calls_.empty()) message["tool_calls"] = tool_calls_;
  Json choice = {{"index", 0},
                 {"message", std::move(message)},
                 {"logprobs", request_.logprobs ? Json{{"content", logprobs_}} : Json(nullptr)},
                 {"finish_reason", finish_reason(result)}};
  return Json{{"id", meta_.id},
              {"object", "chat.completion"},
              {"created", meta_.created},
              {"model", meta_.model},
              {"choices", Json::array({std::move(choice)})},
              {"usage", usage_json(result)}};
}

}  // namespace tern::server
