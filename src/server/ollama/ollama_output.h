// The model's output as Ollama's /api/chat and /api/generate responses. Streamed (Ollama's default), one JSON
// object per line (application/x-ndjson, no SSE framing, no terminator):
//
//   {"model", "created_at", "message": {"role": "assistant", "content", "thinking"?, "tool_calls"?}, "done": false}
//   ... (one per piece of text the output parser released)
//   {"model", "created_at", "message": {"role": "assistant", "content": ""}, "done": true, "done_reason",
//    "total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration"}
//
// /api/generate writes "response" (and "thinking") at the top level instead of "message". Not streamed: one object
// with done true and the whole message. The text goes through the same output parser as /v1/chat/completions
// (reasoning -> thinking, <tool_call> XML -> tool_calls with arguments as an object); a raw /api/generate passes the
// text through untouched. Durations are nanoseconds: total from the request's arrival, prompt_eval the prefill
// (until the first token), eval the remaining decode steps; load_duration 0 (the model stays loaded).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/generator.h"
#include "server/http/errors.h"
#include "server/http/json.h"
#include "server/serving/response_protocol.h"
#include "text/output_parser.h"

namespace tern::server {

struct OllamaOutputOptions {
  std::string model;                 // the name the request used
  bool chat = true;                  // /api/chat ("message") or /api/generate ("response")
  bool parse = true;                 // false (raw generate): the text as generated, no reasoning or tool calls
  Json tools = Json::array();        // the tools offered (for typing arguments); empty: calls stay text
  bool starts_in_reasoning = false;  // the prompt ends inside <think>
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();  // the request's arrival
};

class OllamaOutput {
 public:
  explicit OllamaOutput(OllamaOutputOptions options);
  ~OllamaOutput();

  // Stream objects for one token (often none: text held back by the parser).
  std::vector<Json> on_token(const TokenEvent& event);
  // The last stream objects: what the parser still held, then the done object.
  std::vector<Json> finish_chunks(const GenerationResult& result);
  // The non-streamed response (after every on_token).
  Json response(const GenerationResult& result);

 private:
  struct Piece {
    std::string thinking, content;
    Json tool_calls = Json::array();
  };
  Piece absorb(const ParsedDelta& delta);
  void finish_parser(std::vector<Json>* chunks);
  Json object(const Piece& piece, bool done) const;
  void add_timings(Json& out, const GenerationResult& result) const;

  OllamaOutputOptions options_;
  std::unique_ptr<OutputParser> parser_;
  bool finished_ = false;
  Piece whole_;                      // the whole message so far (the non-streamed response)
};

// Ollama's errors: {"error": "message"} with the HTTP status (and Retry-After when set).
Json ollama_error_json(const ApiError& error);
void respond_ollama_error(httplib::Response& res, const ApiError& error);

// RFC 3339 UTC with microseconds, as Ollama writes created_at: "2026-01-02T03:04:05.123456Z".
std::string rfc3339_now();

template <>
struct ResponseProtocol<OllamaOutput> {
  static std::string stream_event(const Json& payload);   // the object on one line
  static std::string stream_end() { return ""; }
  static const char* content_type() { return "application/x-ndjson"; }
  static std::string keep_alive() { return ""; }          // NDJSON has no comments: nothing while queued
  static Json error_body(const ApiError& error) { return ollama_error_json(error); }
  static void respond_error(httplib::Response& res, const ApiError& error) { respond_ollama_error(res, error); }
};

}  // namespace tern::server
