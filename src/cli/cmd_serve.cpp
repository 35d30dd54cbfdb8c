// tern serve: the OpenAI-compatible HTTP server (docs/server.md).
//
//   tern serve [-m DIR | --demo] [--host 127.0.0.1] [--port 8080] [--api-key KEY] [--cors-origin ORIGIN]
//              [--max-queue 64] [-c/--ctx-size N] [--max-body-bytes N] [sampling flags: server-wide defaults]
//
// The socket is bound first, so /health answers 503 {"status":"loading"} while the model loads. SIGINT/SIGTERM
// stop the server; running generations are cancelled.
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <thread>

#include "cli/backend_select.h"
#include "cli/commands.h"
#include "cli/model_flags.h"
#include "core/check.h"
#include "engine/generator.h"
#include "server/http_server.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace tern::cli {
namespace {

struct ServeArgs {
  ModelFlags model;
  SamplingFlags sampling;
  server::ServerOptions server;
  bool quiet = false;
};

void serve(const ServeArgs& a) {
  // Signals are taken by this thread (sigwait) only: block them before any other thread starts.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that went away must not end the process

  server::ServerOptions options = a.server;
  options.log_requests = !a.quiet;
  // Declared before the model so that it is torn down (handlers joined, engine thread stopped) before the
  // generator, runner and weights it uses are destroyed.
  auto http_owner = std::make_unique<server::HttpServer>(options);
  server::HttpServer& http = *http_owner;
  const int port = http.bind();
  std::fprintf(stderr, "tern serve: listening on http://%s:%d (loading the model)\n", options.host.c_str(), port);
  std::thread listener([&http] { http.listen(); });
  auto stop_listener = [&] {
    http.stop();
    if (listener.joinable()) listener.join();
  };

  ModelSource src;
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<Generator> generator;
  struct TearDown {  // runs first on every way out: the server goes before the model
    std::unique_ptr<server::HttpServer>& http;
    ~TearDown() { http.reset(); }
  } tear_down{http_owner};
  try {
    src = model_flags_open(a.model);
    TERN_CHECK(src.chat_template, "the model folder has no chat template (chat_template.jinja or "
                                  "tokenizer_config.json); /v1/chat/completions needs one");
    runner = runner_create(src.weights, a.model.device);
    const int64_t max_ctx = runner->config().max_position_embeddings;
    const int64_t ctx = a.model.ctx_size > 0 ? a.model.ctx_size : std::min<int64_t>(max_ctx, 32768);
    TERN_CHECK(ctx >= 16 && ctx <= max_ctx, "--ctx-size must be in [16, ", max_ctx, "] (the model's positions), got ",
               ctx);
    generator = std::make_unique<Generator>(*runner, *src.tokenizer);
    server::ServerModel model;
    model.model_id = src.name;
    model.tokenizer = src.tokenizer.get();
    model.chat_template = src.chat_template.get();
    model.generator = generator.get();
    model.defaults = sampling_flags_apply(a.sampling, src.defaults);
    model.context = ctx;
    model.vocab_size = runner->vocab_real();
    http.set_model(model);
    std::fprintf(stderr, "tern serve: ready: model '%s' on %s, context %lld tokens, queue depth %zu\n",
                 model.model_id.c_str(), runner->backend_name().c_str(), static_cast<long long>(ctx),
                 options.max_queue);
  } catch (...) {
    stop_listener();
    throw;
  }

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  std::fprintf(stderr, "tern serve: stopping (signal %d)\n", signal_number);
  stop_listener();
}

}  // namespace

void command_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  auto* sub = app.add_subcommand("serve", "Serve the OpenAI-compatible HTTP API");
  model_flags_add(sub, a->model);
  sampling_flags_add(sub, a->sampling);
  server::ServerOptions& s = a->server;
  sub->add_option("--host", s.host, "Address to listen on (0.0.0.0 for every interface)")->capture_default_str();
  sub->add_option("--port", s.port, "TCP port (0: any free port, printed at start)")->capture_default_str();
  sub->add_option("--api-key", s.api_key, "Require 'Authorization: Bearer KEY' (except /health and /)");
  sub->add_option("--cors-origin", s.cors_origin, "Send CORS headers allowing this origin (e.g. * or http://host)");
  sub->add_option("--max-queue", s.max_queue, "Requests that may wait behind the running one; more get 503")
      ->capture_default_str();
  sub->add_option("--max-body-bytes", s.max_body_bytes, "Largest request body; larger ones get 413")
      ->capture_default_str();
  sub->add_option("--http-threads", s.http_threads, "HTTP worker threads (default: max-queue + 8)");
  sub->add_flag("--debug-allow-forced-output", s.allow_forced_output,
                "TESTS ONLY: accept the request field tern_debug_forced_output (text forced as the generated "
                "tokens; see docs/server.md)");
  sub->add_flag("-q,--quiet", a->quiet, "No request log lines on stderr");
  sub->callback([a] { serve(*a); });
}

}  // namespace tern::cli
