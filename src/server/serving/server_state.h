// Internal to src/server: the state every handler shares. HttpServer (http_server.h) owns it; set_model() fills
// `model` and starts `engine`.
#pragma once

#include <atomic>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "server/serving/engine_loop.h"
#include "server/serving/metrics.h"
#include "server/serving/server_options.h"

namespace tern::server {

struct ServerState {
  ServerOptions options;
  Metrics* metrics = nullptr;
  std::atomic<bool> ready{false};       // set_model() done: `model` and `engine` are valid
  std::atomic<bool> stopping{false};    // stop() called: streams cancel their generation and end
  bool loopback = false;                // bound to a loopback address: the Host header is checked
  ServerModel model;
  size_t max_token_bytes = 1;           // the longest token (bytes): prompts over context x this cannot fit
  std::vector<std::string> special_tokens;  // texts of the special tokens (escaped in chat content)
  std::unique_ptr<EngineLoop> engine;
  struct Route {
    std::regex pattern;
    std::string method;
  };
  std::vector<Route> routes;            // every registered route (a known path asked with another method: 405)
};

}  // namespace tern::server
