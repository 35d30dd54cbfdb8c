// The model's output as OpenAI Responses output items and stream events (see responses_output.h).
#include "server/responses/responses_output.h"

#include <string_view>

#include "server/serving/output_common.h"

namespace tern::server {

namespace {

// The sentence of the note a spent thinking budget forces (kReasoningBudgetClose without "</think>" and whitespace).
std::string_view budget_note() {
  static const std::string note = [] {
    std::string s(kReasoningBudgetClose.substr(0, kReasoningBudgetClose.find("</think>")));
    const size_t begin = s.find_first_not_of(" \n"), end = s.find_last_not_of(" \n");
    return s.substr(begin, end - begin + 1);
  }();
  return note;
}

}  // namespace

Json ResponseProtocol<ResponsesOutput>::error_body(const ApiError& error) {
  return Json{{"type", "error"},
              {"code", error.code.empty() ? Json(error.type) : Json(error.code)},
              {"message", error.message},
              {"param", error.param.empty() ? Json(nullptr) : Json(error.param)}};
}

ResponsesOutput::ResponsesOutput(ResponsesOutputOptions options) : options_(std::move(options)) {
  parser_ = std::make_unique<OutputParser>(options_.starts_in_reasoning,
                                           options_.tools.empty() ? Json(nullptr) : options_.tools);
}

ResponsesOutput::~ResponsesOutput() = default;

Json ResponsesOutput::event(const char* type, Json fields) {
  Json e = {{"type", type}, {"sequence_number", sequence_++}};
  for (auto& [k, v] : fields.items()) e[k] = std::move(v);
  return e;
}

// The response object with the given status and the output so far.
Json ResponsesOutput::snapshot(const char* status) const {
  Json r = options_.response;
  r["status"] = status;
  r["output"] = output_;
  return r;
}

std::vector<Json> ResponsesOutput::first_events() {
  Json r = snapshot("in_progress");
  return {event("response.created", Json{{"response", r}}), event("response.in_progress", Json{{"response", r}})};
}

void ResponsesOutput::close_item(std::vector<Json>& events, const char* status) {
  if (open_ == Item::none) return;
  Json& item = output_.back();
  const size_t index = output_.size() - 1;
  const std::string id = item["id"];
  const bool reasoning = open_ == Item::reasoning;
  const Json& part = item["content"][0];
  const std::string text = part["text"];
  events.push_back(event(reasoning ? "response.reasoning_text.done" : "response.output_text.done",
                         reasoning ? Json{{"item_id", id}, {"output_index", index}, {"content_index", 0}, {"text", text}}
                                   : Json{{"item_id", id}, {"output_index", index}, {"content_index", 0},
                                          {"text", text}, {"logprobs", Json::array()}}));
  events.push_back(event("response.content_part.done",
                         Json{{"item_id", id}, {"output_index", index}, {"content_index", 0}, {"part", part}}));
  // A thought the budget cut is incomplete, whatever follows it.
  item["status"] = reasoning && cut_by_budget(text) ? "incomplete" : status;
  events.push_back(event("response.output_item.done", Json{{"output_index", index}, {"item", item}}));
  open_ = Item::none;
}

// The thought ends with the note the server forces when the budget is spent (the output sees text, not which tokens
// were forced; GenerationResult::reasoning_cut says the same once the generation is over).
bool ResponsesOutput::cut_by_budget(const std::string& reasoning) const {
  if (!options_.thinking_budget) return false;
  const size_t end = reasoning.find_last_not_of(" \n");
  return end != std::string::npos && std::string_view(reasoning).substr(0, end + 1).ends_with(budget_note());
}

void ResponsesOutput::append_text(Item kind, const std::string& text, std::vector<Json>& events) {
  if (text.empty()) return;
  const bool reasoning = kind == Item::reasoning;
  if (open_ != kind) {
    close_item(events, "completed");
    Json item = reasoning ? Json{{"id", response_id("rs_")}, {"type", "reasoning"}, {"summary", Json::array()},
                                 {"content", Json::array()}, {"status", "in_progress"}}
                          : Json{{"id", response_id("msg_")}, {"type", "message"}, {"status", "in_progress"},
                                 {"role", "assistant"}, {"content", Json::array()}};
    const size_t index = output_.size();
    events.push_back(event("response.output_item.added", Json{{"output_index", index}, {"item", item}}));
    Json part = reasoning ? Json{{"type", "reasoning_text"}, {"text", ""}}
                          : Json{{"type", "output_text"}, {"text", ""}, {"annotations", Json::array()},
                                 {"logprobs", Json::array()}};
    events.push_back(event("response.content_part.added", Json{{"item_id", item["id"]}, {"output_index", index},
                                                               {"content_index", 0}, {"part", part}}));
    item["content"].push_back(std::move(part));
    output_.push_back(std::move(item));
    open_ = kind;
  }
  Json& item = output_.back();
  Json& part = item["content"][0];
  part["text"] = part["text"].get<std::string>() + text;
  Json fields = {{"item_id", item["id"]}, {"output_index", output_.size() - 1}, {"content_index", 0}, {"delta", text}};
  if (!reasoning) fields["logprobs"] = Json::array();
  events.push_back(event(reasoning ? "response.reasoning_text.delta" : "response.output_text.delta", std::move(fields)));
}

void ResponsesOutput::absorb(const ParsedDelta& d, std::vector<Json>& events) {
  append_text(Item::reasoning, d.reasoning, events);
  std::string text = d.content;
  if (options_.tools.empty())
    for (const ToolCall& call : d.tool_calls_completed) text += tool_call_as_text(call);
  append_text(Item::message, text, events);
  if (options_.tools.empty()) return;
  for (const ToolCall& call : d.tool_calls_completed) {
    if (!options_.parallel_tool_calls && function_calls_ > 0) continue;
    ++function_calls_;
    close_item(events, "completed");
    const size_t index = output_.size();
    Json item = {{"id", response_id("fc_")}, {"type", "function_call"}, {"status", "in_progress"},
                 {"call_id", call.id},       {"name", call.name},       {"arguments", ""}};
    const std::string id = item["id"];
    events.push_back(event("response.output_item.added", Json{{"output_index", index}, {"item", item}}));
    events.push_back(event("response.function_call_arguments.delta",
                           Json{{"item_id", id}, {"output_index", index}, {"delta", call.arguments_json}}));
    events.push_back(event("response.function_call_arguments.done", Json{{"item_id", id}, {"output_index", index},
                                                                        {"name", call.name},
                                                                        {"arguments", call.arguments_json}}));
    item["arguments"] = call.arguments_json;
    item["status"] = "completed";
    events.push_back(event("response.output_item.done", Json{{"output_index", index}, {"item", item}}));
    output_.push_back(std::move(item));
  }
}

std::vector<Json> ResponsesOutput::on_token(const TokenEvent& e) {
  std::vector<Json> events;
  absorb(parser_->push(e.text), events);
  return events;
}

const char* ResponsesOutput::status_of(const GenerationResult& r) const {
  switch (r.finish) {
    case FinishReason::length:
    case FinishReason::context: return "incomplete";
    default: return "completed";
  }
}

Json ResponsesOutput::usage(const GenerationResult& r) const {
  return Json{{"input_tokens", r.prompt_tokens},
              {"input_tokens_details", Json{{"cached_tokens", r.cached_tokens}}},
              {"output_tokens", r.completion_tokens},
              {"output_tokens_details", Json{{"reasoning_tokens", r.reasoning_tokens}}},
              {"total_tokens", r.prompt_tokens + r.completion_tokens}};
}

void ResponsesOutput::finish_parser(std::vector<Json>& events) {
  if (finished_) return;
  finished_ = true;
  absorb(parser_->finish(), events);
}

std::vector<Json> ResponsesOutput::finish_chunks(const GenerationResult& result) {
  std::vector<Json> events;
  finish_parser(events);
  const std::string status = status_of(result);
  close_item(events, status == "completed" ? "completed" : "incomplete");
  const Json r = response(result);
  const char* type = status == "completed" ? "response.completed" : "response.incomplete";
  events.push_back(event(type, Json{{"response", r}}));
  return events;
}

std::vector<Json> ResponsesOutput::error_events(const ApiError& error) {
  Json e = ResponseProtocol<ResponsesOutput>::error_body(error);
  e["sequence_number"] = sequence_++;
  Json failed = snapshot("failed");
  failed["error"] = Json{{"code", e["code"]}, {"message", error.message}};
  return {std::move(e), event("response.failed", Json{{"response", std::move(failed)}})};
}

Json ResponsesOutput::response(const GenerationResult& result) {
  std::vector<Json> ignored;
  finish_parser(ignored);
  const std::string status = status_of(result);
  if (open_ != Item::none) close_item(ignored, status == "completed" ? "completed" : "incomplete");
  if (result.reasoning_cut)  // the first reasoning item is the thought the prompt opened
    for (Json& item : output_)
      if (item["type"] == "reasoning") {
        item["status"] = "incomplete";
        break;
      }
  Json r = snapshot(status.c_str());
  if (status == "incomplete") r["incomplete_details"] = Json{{"reason", "max_output_tokens"}};
  r["usage"] = usage(result);
  return r;
}

}  // namespace tern::server
