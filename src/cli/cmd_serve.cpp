// tern serve: the OpenAI-compatible HTTP server (docs/server.md).
//
//   tern serve [-m DIR | --demo] [--host 127.0.0.1] [--port 8080] [--api-key KEY] [--cors-origin ORIGIN]
//              [--parallel 4] [--step-tokens 1024] [--max-queue 64] [-c/--ctx-size N] [--gpu-memory GB]
//              [--max-body-bytes N]
//              [sampling flags: server-wide defaults]
//              [--no-prefix-cache] [--cache-snapshot-every 4096] [--cache-gpu-mb 4096] [--cache-host-mb 16384]
//              [--cache-slots 4] [--alias NAME ...] [--strict-model-name]
//
// The socket is bound first, so /health answers 503 {"status":"loading"} while the model loads. A failed load
// prints its error and exits 1 at once. SIGINT/SIGTERM end the process at any time: while loading, at once; once
// serving, gracefully (stop accepting, cancel running generations, whose streams still end, with a shutting_down
// error and [DONE], then exit 0), within a bound; a second signal exits at once.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>

#include "cli/backend_select.h"
#include "cli/commands.h"
#include "cli/memory_flags.h"
#include "cli/model_flags.h"
#include "cli/speculative_flags.h"
#include "core/check.h"
#include "engine/generator.h"
#include "server/http/listener.h"
#include "server/http_server.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace tern::cli {
namespace {

struct ServeArgs {
  ModelFlags model;
  SamplingFlags sampling;
  SpeculativeFlags speculative;
  server::ServerOptions server;
  bool quiet = false;
  bool no_prefix_cache = false;
  int64_t cache_gpu_mb = 4096, cache_host_mb = 16384;
  bool cache_gpu_mb_given = false, cache_slots_given = false;  // else the memory plan may lower them
  std::vector<std::string> aliases;  // more names requests may give for the model
};

// The address a client on this machine uses: a wildcard bind is reached through loopback; IPv6 in brackets.
std::string client_url(const std::string& host, int port) {
  std::string h = host == "0.0.0.0" ? "127.0.0.1" : host == "::" || host == "[::]" ? "[::1]" : host;
  if (h.find(':') != std::string::npos && h.front() != '[') h = "[" + h + "]";
  return "http://" + h + ":" + std::to_string(port);
}

constexpr double kGracefulStopS = 10;  // after a signal, running requests get this long to end

// Where the signal thread tells the main thread to stop (once the model is loaded).
struct StopRequest {
  std::mutex mutex;
  std::condition_variable cv;
  int signal_number = 0;
  bool serving = false;  // the model is loaded: a signal means a graceful stop (else: exit at once)
};

void exit_now(const char* why, int signal_number, int status) {
  std::fprintf(stderr, "tern serve: %s (signal %d)\n", why, signal_number);
  std::fflush(stderr);
  _exit(status);
}

void serve(const ServeArgs& a) {
  const auto started = std::chrono::steady_clock::now();  // the ready line says how long the start took
  // Signals are taken by one thread (sigwait) only: block them before any other thread starts.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that went away must not end the process

  server::ServerOptions options = a.server;
  options.log_requests = !a.quiet;
  // The model's names are known before it loads: /v1/models lists them from the start.
  options.model_id = model_flags_name(a.model);
  for (const std::string& alias : a.aliases)
    if (alias != options.model_id &&
        std::find(options.model_aliases.begin(), options.model_aliases.end(), alias) == options.model_aliases.end())
      options.model_aliases.push_back(alias);
  if (!server::is_loopback_host(options.host) && options.api_key.empty())
    std::fprintf(stderr,
                 "tern serve: warning: listening on %s without --api-key: anyone who can reach this address can use "
                 "the model\n",
                 options.host.c_str());

  // The signal thread: from now on SIGINT/SIGTERM always end the process. Model loading cannot be interrupted,
  // so a signal during it exits at once; once serving, the main thread stops gracefully; a second signal (or a
  // graceful stop that overruns its bound) exits at once.
  static StopRequest stop;  // static: the detached thread may outlive this frame
  std::thread([stop_signals] {
    for (int count = 0;; ++count) {
      int signal_number = 0;
      if (sigwait(&stop_signals, &signal_number) != 0) continue;
      std::unique_lock lock(stop.mutex);
      if (!stop.serving) exit_now("stopping while the model loads", signal_number, 128 + signal_number);
      if (count > 0) exit_now("second signal: exiting now", signal_number, 128 + signal_number);
      stop.signal_number = signal_number;
      stop.cv.notify_all();
      lock.unlock();
      std::thread([signal_number] {  // the bound on a graceful stop
        std::this_thread::sleep_for(std::chrono::duration<double>(kGracefulStopS + 5));
        exit_now("the graceful stop took too long: exiting now", signal_number, 1);
      }).detach();
    }
  }).detach();

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
    const std::jthread gpu_starting = device_start_early(a.model.device);  // while the tokenizer loads
    src = model_flags_open(a.model);
    TERN_CHECK(src.chat_template, "the model folder has no chat template (chat_template.jinja or "
                                  "tokenizer_config.json); /v1/chat/completions needs one");
    const int64_t max_ctx = model_flags_config(src).max_position_embeddings;
    TERN_USAGE_CHECK(a.model.ctx_size == 0 || (a.model.ctx_size >= 16 && a.model.ctx_size <= max_ctx),
                     "--ctx-size must be in [16, ", max_ctx, "] (the model's positions), got ", a.model.ctx_size);
    // On a GPU the context, the requests at once and the prefix cache's sessions and snapshots are planned in its
    // memory (engine/memory_plan.h), each as given or chosen.
    MemoryPlanInput ask;
    ask.context = a.model.ctx_size;
    ask.parallel = options.scheduler.parallel;
    ask.default_parallel = server::SchedulerOptions::kDefaultParallel;
    if (options.prefix_cache.enabled) {
      ask.cache_slots = options.prefix_cache.slots;
      ask.cache_slots_given = a.cache_slots_given;
      ask.snapshot_budget = options.prefix_cache.gpu_bytes;
      ask.snapshot_budget_given = a.cache_gpu_mb_given;
    }
    PlannedRunner planned = model_flags_runner_planned(a.model, src, ask, "tern serve", false, &a.speculative);
    runner = std::move(planned.runner);
    const int64_t image_max_pixels = planned.image_max_pixels;
    server::ServerModel model;
    int64_t ctx = 0;
    if (planned.plan) {
      ctx = planned.plan->context;
      model.parallel = planned.plan->parallel;
      model.cache_slots = planned.plan->sessions;
      model.cache_gpu_bytes = planned.plan->snapshot_budget;
    } else {  // the CPU: --parallel is what its RAM holds (the engine loop's own plan)
      ctx = cpu_context("tern serve", a.model.ctx_size, max_ctx);
    }
    GeneratorOptions gen_options;
    gen_options.speculative = speculative_flags_options(a.speculative, *runner, a.quiet);
    generator = std::make_unique<Generator>(*runner, *src.tokenizer, gen_options);
    model.model_id = src.name;
    model.aliases = options.model_aliases;
    model.model_path = a.model.model_dir.empty() ? "" : std::filesystem::absolute(a.model.model_dir).string();
    model.random_weights = src.random_weights();
    model.build_info = std::string("tern ") + TERN_VERSION + " (" + runner->backend_name() + " backend)";
    model.tokenizer = src.tokenizer.get();
    model.chat_template = src.chat_template.get();
    model.generator = generator.get();
    model.defaults = sampling_flags_apply(a.sampling, src.defaults);
    model.context = ctx;
    model.vocab_size = runner->vocab_real();
    model.images = model_flags_image_settings(a.model, src, *runner, image_max_pixels);
    http.set_model(model);
    std::fprintf(stderr,
                 "tern serve: ready in %.2f s: model '%s' on %s, context %lld tokens, %d requests at once, queue "
                 "depth %zu, prefix cache %s, images %s\n",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(),
                 model.model_id.c_str(), runner->backend_name().c_str(), static_cast<long long>(ctx),
                 http.parallel(), options.max_queue, options.prefix_cache.enabled ? "on" : "off",
                 model.images.unavailable.empty() ? "on" : ("off (" + model.images.unavailable + ")").c_str());
    std::string names = "\"" + model.model_id + "\"";
    for (const std::string& alias : model.aliases) names += " or \"" + alias + "\"";
    if (!options.strict_model_name) names += " (any other name is answered by it too)";
    const std::string url = client_url(options.host, port);
    std::fprintf(stderr,
                 "tern serve: OpenAI API at %s/v1, Anthropic API at %s (POST /v1/messages), Ollama API at %s "
                 "(/api/chat), chat page at %s/\n"
                 "tern serve: use model %s\n",
                 url.c_str(), url.c_str(), url.c_str(), url.c_str(), names.c_str());
  } catch (...) {
    stop_listener();  // closes the listening socket even when the listener has not started yet
    throw;
  }

  int signal_number = 0;
  {
    std::unique_lock lock(stop.mutex);
    stop.serving = true;
    stop.cv.wait(lock, [] { return stop.signal_number != 0; });
    signal_number = stop.signal_number;
  }
  std::fprintf(stderr, "tern serve: stopping (signal %d): no new connections; running generations are cancelled\n",
               signal_number);
  stop_listener();
  http.wait_stopped(kGracefulStopS);
  std::fprintf(stderr, "tern serve: stopped\n");
}

}  // namespace

void command_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  auto* sub = app.add_subcommand("serve", "Serve the OpenAI-compatible HTTP API");
  model_flags_add(sub, a->model);
  model_flags_add_images(sub, a->model);
  sampling_flags_add(sub, a->sampling);
  speculative_flags_add(sub, a->speculative);
  server::ServerOptions& s = a->server;
  sub->add_option("--host", s.host, "Address to listen on (0.0.0.0 for every interface)")->capture_default_str();
  sub->add_option("--port", s.port, "TCP port, 1-65535 (0: any free port, printed at start)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  sub->add_option("--api-key", s.api_key, "Require 'Authorization: Bearer KEY' (except /health and /)");
  sub->add_option("--cors-origin", s.cors_origin,
                  "Send CORS headers allowing this origin (e.g. * or http://host); pages on this machine "
                  "(http(s)://localhost, 127.0.0.1 or [::1], any port) are allowed without it");
  sub->add_option("--allowed-hosts", s.allowed_hosts,
                  "On a loopback address, Host names accepted besides the address and localhost (comma-separated; "
                  "* for any). Others get 403 (DNS rebinding)")
      ->delimiter(',');
  sub->add_flag("--allow-special-in-content", s.allow_special_in_content,
                "Special tokens typed in chat message content (<|im_start|>, ...) stay control tokens (default: "
                "they are text)");
  sub->add_flag("--allow-image-urls", s.allow_image_urls,
                "Fetch http(s) image URLs that requests name (public addresses only, unless --image-url-allow). "
                "Without it such a request gets a 400; inline images (data: URLs, base64) always work");
  sub->add_option("--image-url-timeout", s.image_url_timeout_s,
                  "Seconds to fetch all of a request's image URLs, host lookups and redirects included (400 after); with "
                  "--allow-image-urls")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  sub->add_option("--image-url-allow",
                  "Addresses image URLs may reach though they are not public (loopback, private, link-local, ...: "
                  "refused by default, on every redirect), as CIDR ranges or addresses, comma-separated: "
                  "10.1.2.0/24,127.0.0.1; with --allow-image-urls")
      ->type_name("CIDR,...")
      ->delimiter(',')
      ->expected(1, CLI::detail::expected_max_vector_size)  // each range of each occurrence (the flag may repeat)
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            std::string why;
            return server::ip_range_parse(text, &why) ? std::string() : why;
          },
          ""))
      ->each([&s](const std::string& text) { s.image_url_allow.push_back(*server::ip_range_parse(text, nullptr)); });
  sub->add_option("--max-connections", s.max_connections, "Open connections in all; more get 503")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--max-connections-per-address", s.max_connections_per_address,
                  "Open connections from one client address; more get 503")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--header-timeout", s.header_timeout_s, "Seconds for a request's headers to arrive (408 after)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--body-timeout", s.body_timeout_s, "Seconds for a request's body to arrive after its headers")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--keep-alive-timeout", s.keep_alive_timeout_s, "Seconds an idle connection stays open")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--parallel", s.scheduler.parallel,
                  "Requests generated at once (continuous batching; each holds a session of --ctx-size tokens, "
                  "allocated at start; more wait in the queue). Default: 4, fewer when memory is short (on a GPU: "
                  "while 4 would hold fewer than 32768 tokens each)")
      ->check(CLI::Range(1, 256));
  sub->add_option("--step-tokens", s.scheduler.step_tokens,
                  "Prompt tokens prefilled per step while other requests decode, counted through every layer: a "
                  "long prompt is read between their tokens in the backend's own chunks (4096 tokens on CUDA), each "
                  "chunk through this share of its layers per step")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30))
      ->capture_default_str();
  sub->add_option("--max-queue", s.max_queue, "Requests that may wait behind the running ones; more get 503")
      ->check(CLI::Range(size_t(1), size_t(1) << 20))
      ->capture_default_str();
  sub->add_option("--max-body-bytes", s.max_body_bytes, "Largest request body; larger ones get 413")
      ->check(CLI::Range(size_t(1024), size_t(1) << 40))
      ->capture_default_str();
  sub->add_option("--http-threads", s.http_threads, "HTTP worker threads (default: max-queue + parallel + 8)")
      ->check(CLI::Range(0, 4096));
  sub->add_option("--thinking-budget,--reasoning-budget", s.thinking_budget,
                  "Reasoning tokens per answer at most, for requests that set none (thinking_budget, Anthropic's "
                  "budget_tokens; the Responses and Ollama APIs always); then the model is told to answer. "
                  "-1: no limit")
      ->check(CLI::Range(int64_t(-1), int64_t(std::numeric_limits<int32_t>::max())))
      ->capture_default_str();
  sub->add_option("--stream-keep-alive", s.stream_keep_alive_s,
                  "Seconds a stream may stay quiet (queued, or generating a tool call) before a keep-alive comment")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_flag("--debug-allow-forced-output", s.allow_forced_output,
                "TESTS ONLY: accept the request field tern_debug_forced_output (text forced as the generated "
                "tokens; see docs/server.md)");
  sub->add_option("--debug-stream-fault-after", s.debug_stream_fault_after,
                  "TESTS ONLY: every stream fails after N token events, as an internal fault would (0: never)")
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("--no-prefix-cache", a->no_prefix_cache,
                "Run every request's whole prompt (no multi-turn prefix reuse; one session)");
  sub->add_option("--cache-snapshot-every", s.prefix_cache.snapshot_every,
                  "Prefix cache: snapshot the Gated DeltaNet state every N prompt tokens during a prefill (0: only "
                  "at the end of the prompt and of the request)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--cache-gpu-mb", a->cache_gpu_mb,
                  "Prefix cache: MiB of snapshots kept in GPU memory (RAM on the CPU backend); beyond, the least "
                  "recently used move to host memory. Left to the memory plan, less when the GPU is short")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--cache-host-mb", a->cache_host_mb,
                  "Prefix cache: MiB of snapshots kept in (pinned) host memory; beyond, the least recently used are "
                  "dropped")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--cache-slots", s.prefix_cache.slots,
                  "Prefix cache: conversations cached at once, each in its own session (KV cache region); at least "
                  "--parallel. Left to the memory plan, fewer when the GPU is short")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  sub->add_option("--alias", a->aliases,
                  "Another name requests may give as 'model' (repeatable); listed in /v1/models after the id")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->check([](const std::string& name) { return name.empty() ? std::string("an alias must not be empty") : std::string(); });
  sub->add_flag("--strict-model-name", s.strict_model_name,
                "Requests naming a model other than the id or an --alias get 404 (default: any name is answered by "
                "the model served, as its id)");
  sub->add_flag("-q,--quiet", a->quiet, "No request log lines on stderr");
  sub->callback([a, sub] {
    a->cache_gpu_mb_given = sub->count("--cache-gpu-mb") > 0;
    a->cache_slots_given = sub->count("--cache-slots") > 0;
    a->server.prefix_cache.enabled = !a->no_prefix_cache;
    a->server.prefix_cache.gpu_bytes = a->cache_gpu_mb << 20;
    a->server.prefix_cache.host_bytes = a->cache_host_mb << 20;
    serve(*a);
  });
}

}  // namespace tern::cli
