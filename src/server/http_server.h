// The HTTP front: cpp-httplib routes, API key, CORS, body limit, request logs, and the handlers of the
// OpenAI-compatible API. Handlers parse and validate, tokenize, then hand a GenerationTask to the engine loop
// and stream its events back; they never throw and never touch the model.
//
// The server listens before the model is loaded: /health answers 503 {"status":"loading"} and generation routes
// 503 until set_model() is called; /v1/models already lists the names in ServerOptions.
//
// Under cpp-httplib sits our connection layer (connections.h): caps on connections, read deadlines, pipelining,
// and the checks made as soon as a request's headers are in (Host, API key, Content-Type, body size).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/generator.h"
#include "engine/prefix_cache.h"
#include "engine/sampler.h"
#include "server/serving/metrics.h"

namespace tern {
class ChatTemplate;
class Tokenizer;
}  // namespace tern

namespace tern::server {

class EngineLoop;
class HttpConnections;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                       // 0: any free port (see HttpServer::port())
  std::string api_key;                   // "": no authentication
  std::string cors_origin;               // "": no CORS headers
  std::vector<std::string> allowed_hosts;  // Host names accepted besides the bound address and localhost ("*": any)
  bool allow_special_in_content = false; // special tokens typed in chat content stay control tokens
  size_t max_queue = 64;                 // requests waiting beyond the running one; more get 503
  size_t max_body_bytes = 8u << 20;      // larger bodies get 413
  int http_threads = 0;                  // 0: max_queue + 8 (a streaming request holds a thread)
  bool allow_forced_output = false;      // --debug-allow-forced-output: accept tern_debug_forced_output
  bool log_requests = true;              // one JSON line per request on stderr
  size_t max_connections = 1024;         // open connections in all; beyond: 503 and close
  size_t max_connections_per_address = 256;  // open connections from one client address
  double header_timeout_s = 10;          // a request's headers must arrive within this (408 otherwise)
  double body_timeout_s = 30;            // and its body within this after the headers
  double keep_alive_timeout_s = 5;       // an idle connection is closed after this
  PrefixCacheOptions prefix_cache;       // multi-turn prefix reuse (--no-prefix-cache, --cache-*)
  int64_t thinking_budget = -1;          // --thinking-budget: for requests that set none (-1: no limit)
  double stream_keep_alive_s = 2;        // --stream-keep-alive: a stream quiet this long gets a keep-alive comment
                                         // (waiting in the queue, or while its tokens show nothing, as in a tool call)
  int64_t debug_stream_fault_after = 0;  // TESTS ONLY (--debug-stream-fault-after): > 0: a stream's provider fails
                                         // on its token event N + 1, as an internal fault would
  // The names the model will be served under, known before it loads ("": unknown): /v1/models lists them while it
  // loads. set_model() checks that the model has these names.
  std::string model_id;
  std::vector<std::string> model_aliases;
};

// The loaded model, as the handlers use it. Everything must outlive the server.
struct ServerModel {
  std::string model_id;                  // GET /v1/models id; requests naming another model get 404
  std::vector<std::string> aliases;      // tern serve --alias: also accepted as the model's name, listed too
  std::string model_path;                // the folder it was loaded from ("" for the demo)
  bool random_weights = false;           // the demo model or synthetic weights: its output is meaningless
  std::string build_info;                // GET /props: tern's version and the backend it runs on
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;
  Generator* generator = nullptr;        // used only by the engine loop's thread
  SamplingParams defaults;               // generation_config.json
  int64_t context = 0;                   // the session's capacity (--ctx-size)
  int64_t vocab_size = 0;                // ids below it are valid in logit_bias and prompts
};

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

  struct State;  // the handlers' shared state (defined in http_server.cpp)

 private:
  void install_routes();

  ServerOptions options_;
  std::unique_ptr<HttpConnections> http_;
  std::shared_ptr<State> state_;
  Metrics metrics_;
  int port_ = 0;
};

}  // namespace tern::server
