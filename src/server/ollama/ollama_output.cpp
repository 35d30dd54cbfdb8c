// The model's output as Ollama's NDJSON objects (see ollama_output.h).
#include "server/ollama/ollama_output.h"

#include <cstdio>
#include <ctime>

#include "server/http/respond.h"
#include "server/serving/output_common.h"

namespace tern::server {

std::string rfc3339_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1000000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S", &tm);
  char buf[48];
  std::snprintf(buf, sizeof buf, "%s.%06lldZ", date, static_cast<long long>(micros));
  return buf;
}

Json ollama_error_json(const ApiError& error) { return Json{{"error", error.message}}; }

void respond_ollama_error(httplib::Response& res, const ApiError& error) {
  respond_error_with_body(res, error, ollama_error_json(error));
}

std::string ResponseProtocol<OllamaOutput>::stream_event(const Json& payload) { return json_dump(payload) + "\n"; }

OllamaOutput::OllamaOutput(OllamaOutputOptions options) : options_(std::move(options)) {
  if (options_.parse)
    parser_ = std::make_unique<OutputParser>(options_.starts_in_reasoning,
                                             options_.tools.empty() ? Json(nullptr) : options_.tools);
}

OllamaOutput::~OllamaOutput() = default;

OllamaOutput::Piece OllamaOutput::absorb(const ParsedDelta& d) {
  Piece p;
  p.thinking = d.reasoning;
  p.content = d.content;
  for (const ToolCall& call : d.tool_calls_completed) {
    if (options_.tools.empty()) {  // no tools offered: the call stays text, as on the other APIs
      p.content += tool_call_as_text(call);
      continue;
    }
    Json arguments = Json::parse(call.arguments_json, nullptr, false);
    if (!arguments.is_object()) arguments = Json::object();
    p.tool_calls.push_back(Json{{"id", call.id},
                                {"function", Json{{"index", call.index}, {"name", call.name},
                                                  {"arguments", std::move(arguments)}}}});
  }
  whole_.thinking += p.thinking;
  whole_.content += p.content;
  for (const Json& c : p.tool_calls) whole_.tool_calls.push_back(c);
  return p;
}

// A response object: the piece as the message (chat) or as response/thinking (generate).
Json OllamaOutput::object(const Piece& piece, bool done) const {
  Json out = {{"model", options_.model}, {"created_at", rfc3339_now()}};
  if (options_.chat) {
    Json message = {{"role", "assistant"}, {"content", piece.content}};
    if (!piece.thinking.empty()) message["thinking"] = piece.thinking;
    if (!piece.tool_calls.empty()) message["tool_calls"] = piece.tool_calls;
    out["message"] = std::move(message);
  } else {
    out["response"] = piece.content;
    if (!piece.thinking.empty()) out["thinking"] = piece.thinking;
  }
  out["done"] = done;
  return out;
}

std::vector<Json> OllamaOutput::on_token(const TokenEvent& event) {
  if (event.text.empty()) return {};
  Piece p;
  if (parser_) {
    p = absorb(parser_->push(event.text));
  } else {
    p.content = event.text;
    whole_.content += event.text;
  }
  if (p.thinking.empty() && p.content.empty() && p.tool_calls.empty()) return {};
  return {object(p, false)};
}

void OllamaOutput::finish_parser(std::vector<Json>* chunks) {
  if (finished_) return;
  finished_ = true;
  if (!parser_) return;
  Piece p = absorb(parser_->finish());
  if (chunks && !(p.thinking.empty() && p.content.empty() && p.tool_calls.empty())) chunks->push_back(object(p, false));
}

void OllamaOutput::add_timings(Json& out, const GenerationResult& r) const {
  const auto ns = [](double s) { return int64_t(s * 1e9); };
  const char* reason = "stop";
  if (r.finish == FinishReason::length || r.finish == FinishReason::context) reason = "length";
  out["done_reason"] = reason;
  out["total_duration"] = std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::steady_clock::now() - options_.start).count();
  out["load_duration"] = 0;
  out["prompt_eval_count"] = r.prompt_tokens;
  out["prompt_eval_duration"] = ns(r.prefill_s);
  out["eval_count"] = r.completion_tokens;
  out["eval_duration"] = ns(r.decode_s);
}

std::vector<Json> OllamaOutput::finish_chunks(const GenerationResult& result) {
  std::vector<Json> chunks;
  finish_parser(&chunks);
  Json last = object(Piece{}, true);
  add_timings(last, result);
  chunks.push_back(std::move(last));
  return chunks;
}

Json OllamaOutput::response(const GenerationResult& result) {
  finish_parser(nullptr);
  Json out = object(whole_, true);
  add_timings(out, result);
  return out;
}

}  // namespace tern::server
