// The server as `tern serve` runs it: the rooms of src/server put together. HttpServer owns the connection layer
// (http/), the engine loop and the state the handlers share (serving/), and registers every route: the OpenAI,
// OpenAI Responses, Anthropic and Ollama APIs (openai/, responses/, anthropic/, ollama/), the utility routes, the
// chat page, /health and /metrics. It also applies the checks every request passes before a handler (Host, API
// key, Content-Type, body size: http/admission.h), and writes errors no handler wrote in the shape of the route's
// API. Handlers parse and validate, tokenize, then hand a GenerationTask to the engine loop and stream its events
// back; they never throw and never touch the model.
//
// The server listens before the model is loaded: /health answers 503 {"status":"loading"} and generation routes
// 503 until set_model() is called; /v1/models already lists the names in ServerOptions.
#pragma once

#include <memory>

#include "server/serving/metrics.h"
#include "server/serving/server_options.h"

namespace tern::server {

class HttpConnections;
struct ServerState;

class HttpServer {
 public:
  explicit HttpServer(ServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the socket (throws tern::Error naming host:port and the reason when it cannot). Returns the bound port.
  int bind();
  // Serves until stop(). Call bind() first.
  void listen();
  // Stops accepting and closes idle connections; running generations are cancelled, and their streams end with a
  // 503 shutting_down error event and [DONE]. Returns at once (safe from any thread, also before listen() started).
  void stop();
  // After stop(): waits up to `timeout_s` for the requests being served to end.
  void wait_stopped(double timeout_s);

  // Makes the generation routes live (creates the engine loop). Call once.
  void set_model(const ServerModel& model);

  int port() const { return port_; }
  Metrics& metrics() { return metrics_; }
  // Requests generated at once (--parallel, or what fits when it was left to the server); 0 before set_model().
  int parallel() const;

 private:
  void install_routes();

  ServerOptions options_;
  std::unique_ptr<HttpConnections> http_;
  std::shared_ptr<ServerState> state_;
  Metrics metrics_;
  int port_ = 0;
};

}  // namespace tern::server
