// Internal to src/server: the state the HTTP handlers share, the per-thread request log, and the generation
// handlers (generation_handlers.cpp).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <httplib.h>

#include "server/engine_loop.h"
#include "server/errors.h"
#include "server/http_server.h"
#include "server/openai_schema.h"

namespace tern::server {

struct HttpServer::State {
  ServerOptions options;
  Metrics* metrics = nullptr;
  std::atomic<bool> ready{false};       // set_model() done: `model` and `engine` are valid
  std::atomic<bool> stopping{false};    // stop() called: streams cancel their generation and end
  bool loopback = false;                // bound to a loopback address: the Host header is checked
  ServerModel model;
  size_t max_token_bytes = 1;           // the longest token (bytes): prompts over context x this cannot fit
  std::vector<std::string> special_tokens;  // texts of the special tokens (escaped in chat content)
  std::unique_ptr<EngineLoop> engine;
};
using ServerState = HttpServer::State;

// What the structured request log line says about the request being served on this thread. The handler fills
// `fields`; the logger (which runs on the same thread after the response is written) prints and clears it.
struct RequestLog {
  std::chrono::steady_clock::time_point start{};
  const char* route = "other";   // the route label used in metrics (a literal)
  Json fields = Json::object();
};
RequestLog& request_log();

// Writes the error as the response (status, JSON body, Retry-After).
void respond_error(httplib::Response& res, const ApiError& error);
void respond_json(httplib::Response& res, const Json& body, int status = 200);

void handle_chat_completions(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_completions(ServerState& state, const httplib::Request& req, httplib::Response& res);

}  // namespace tern::server
