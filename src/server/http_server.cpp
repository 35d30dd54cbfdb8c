#include "server/http_server.h"

#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <list>
#include <optional>

#include "core/check.h"
#include "server/anthropic/anthropic_handlers.h"
#include "server/anthropic/anthropic_output.h"
#include "server/http/admission.h"
#include "server/http/connections.h"
#include "server/http/listener.h"
#include "server/http/respond.h"
#include "server/ollama/ollama_handlers.h"
#include "server/ollama/ollama_output.h"
#include "server/openai/openai_handlers.h"
#include "server/responses/responses_handlers.h"
#include "server/serving/chat_page.h"
#include "server/serving/request_fields.h"
#include "server/serving/server_state.h"
#include "server/serving/util_handlers.h"
#include "text/tokenizer.h"

namespace tern::server {

namespace {

std::string iso_time_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Errors on the Anthropic routes have Anthropic's shape; everywhere else OpenAI's.
bool anthropic_path(const std::string& path) {
  return path == "/v1/messages" || path.rfind("/v1/messages/", 0) == 0;
}

// Ollama's routes (/api/...): errors as {"error": "message"}.
bool ollama_path(const std::string& path) { return path.rfind("/api/", 0) == 0; }

void respond_error_on(const std::string& path, httplib::Response& res, const ApiError& error) {
  if (anthropic_path(path)) return respond_anthropic_error(res, error);
  if (ollama_path(path)) return respond_ollama_error(res, error);
  respond_error(res, error);
}

// The checks made as soon as a request's headers are in (by the connection poller, before reading the body, and
// again in cpp-httplib's pre-routing handler, which writes the answer). `header(lower_name)` gives a header or null.
template <typename HeaderFn>
std::optional<ApiError> early_rejection(const ServerState& s, const std::string& method, const std::string& path,
                                        HeaderFn header) {
  if (s.stopping.load()) return api_error_shutting_down("The server is shutting down.");
  if (!host_allowed(header("host"), s.loopback, s.options.host, s.options.allowed_hosts)) {
    ApiError e = api_error_invalid("", "Host '" + *header("host") + "' is not allowed: this server listens on " +
                                           s.options.host + " and answers only requests addressed to it (or to "
                                           "localhost); start it with --allowed-hosts NAME to accept another name.");
    e.status = 403;
    e.type = "permission_error";
    e.code = "host_not_allowed";
    return e;
  }
  if (method == "OPTIONS") return std::nullopt;  // CORS preflight: browsers send no credentials
  const bool open = path == "/health" || path == "/" || path == "/favicon.ico" || path.rfind("/page/", 0) == 0;
  if (!open && !authorized(s.options.api_key, header("authorization"), header("x-api-key"))) return api_error_unauthorized();
  // Ollama's clients and documented `curl -d` calls send JSON without a JSON Content-Type; on its routes that is
  // accepted unless the request comes from a web page (an Origin header): a page may send a form or text/plain
  // cross-site without a preflight, and the JSON media type is what stops that.
  // Even there a multipart form is refused here: cpp-httplib would parse the JSON as a form and answer a bare 400.
  const bool any_type_ok = ollama_path(path) && header("origin") == nullptr;
  if (method == "POST") {
    const std::string* type = header("content-type");
    const bool multipart = type && media_type_of(*type).rfind("multipart/", 0) == 0;
    const bool json = type && media_type_of(*type) == "application/json";
    if (any_type_ok ? multipart : !json) {
      ApiError e = api_error_invalid("", "POST bodies must be JSON with 'Content-Type: application/json' (got " +
                                             (type ? "'" + *type + "'" : std::string("none")) + ").");
      e.status = 415;
      e.code = "unsupported_media_type";
      return e;
    }
  }
  if (const std::string* length = header("content-length")) {
    try {
      if (std::stoull(*length) > s.options.max_body_bytes) return api_error_too_large(s.options.max_body_bytes);
    } catch (...) {  // not a number: cpp-httplib answers 400
    }
  }
  return std::nullopt;
}

// The methods each route answers, for 405 + Allow on a known path asked with another method.
std::string allowed_methods(const ServerState& state, const std::string& path) {
  std::string allow;
  for (const ServerState::Route& r : state.routes)
    if (std::regex_match(path, r.pattern) && allow.find(r.method) == std::string::npos)
      allow += (allow.empty() ? "" : ", ") + r.method;
  return allow;
}

}  // namespace

HttpServer::HttpServer(ServerOptions options) : options_(std::move(options)), state_(std::make_shared<ServerState>()) {
  TERN_CHECK(options_.max_queue >= 1, "--max-queue must be at least 1, got ", options_.max_queue);
  TERN_CHECK(options_.max_body_bytes >= 1024, "--max-body-bytes must be at least 1024, got ", options_.max_body_bytes);
  TERN_CHECK(options_.max_connections >= 1 && options_.max_connections_per_address >= 1,
             "--max-connections and --max-connections-per-address must be at least 1");
  TERN_CHECK(options_.header_timeout_s > 0 && options_.body_timeout_s > 0 && options_.keep_alive_timeout_s > 0,
             "--header-timeout, --body-timeout and --keep-alive-timeout must be positive");
  TERN_CHECK(options_.stream_keep_alive_s > 0, "--stream-keep-alive must be positive, got ",
             options_.stream_keep_alive_s);
  state_->options = options_;
  state_->metrics = &metrics_;
  // Request-sized buffers (bodies, prompts, JSON) of 1 MiB or more come from mmap and go back to the system when
  // freed. (glibc's default threshold grows with the largest block freed, after which such buffers stay in the
  // heap arenas of the HTTP threads: hundreds of MB after a few large requests.)
  ::mallopt(M_MMAP_THRESHOLD, 1 << 20);
  state_->loopback = is_loopback_host(options_.host);
  auto ms = [](double s) { return std::chrono::milliseconds(std::max<int64_t>(1, int64_t(s * 1000))); };
  ConnectionLimits limits;
  limits.max_connections = options_.max_connections;
  limits.max_per_address = options_.max_connections_per_address;
  limits.header_timeout = ms(options_.header_timeout_s);
  limits.body_timeout = ms(options_.body_timeout_s);
  limits.idle_timeout = ms(options_.keep_alive_timeout_s);
  limits.max_body_bytes = options_.max_body_bytes;
  limits.workers = options_.http_threads > 0 ? size_t(options_.http_threads)
                                             : options_.max_queue + size_t(std::max(1, options_.scheduler.parallel)) + 8;
  ServerState* s = state_.get();
  http_ = std::make_unique<HttpConnections>(
      limits,
      [s](const RequestHead& head) {
        return early_rejection(*s, head.method, head.path, [&](const char* name) { return head.header(name); })
            .has_value();
      },
      &metrics_);
  http_->set_payload_max_length(options_.max_body_bytes);
  http_->set_keep_alive_max_count(1000);
  http_->set_keep_alive_timeout(std::max<time_t>(1, time_t(options_.keep_alive_timeout_s)));
  install_routes();
}

HttpServer::~HttpServer() {
  stop();
  http_->shut_down(std::chrono::seconds(10));  // joins the handler threads (their streams end: `stopping` is set)
  http_.reset();
  state_->engine.reset();  // then the engine thread
}

int HttpServer::bind() {
  const int fd = bind_listener(options_.host, options_.port, &port_);
  http_->adopt_listener(fd);
  return port_;
}

void HttpServer::listen() { http_->serve_forever(); }

void HttpServer::stop() {
  state_->stopping = true;
  if (http_) http_->stop_accepting();
}

void HttpServer::wait_stopped(double timeout_s) {
  http_->shut_down(std::chrono::milliseconds(int64_t(timeout_s * 1000)));
}

void HttpServer::set_model(const ServerModel& model) {
  TERN_CHECK(!state_->ready, "set_model called twice");
  TERN_CHECK(model.tokenizer && model.chat_template && model.generator && model.context > 0,
             "set_model: incomplete ServerModel");
  const bool as_announced = model.model_id == options_.model_id && model.aliases == options_.model_aliases;
  TERN_CHECK(options_.model_id.empty() || as_announced, "set_model: the model is named '", model.model_id, "', not '",
             options_.model_id, "' as announced (or its aliases differ)");
  state_->model = model;
  // The longest token's bytes: a prompt longer than context x this cannot fit, whatever it tokenizes to.
  size_t longest = 1;
  std::vector<std::string> special;
  for (int32_t id = 0; id < model.tokenizer->vocab_size(); ++id) {
    if (!model.tokenizer->contains(id)) continue;
    const std::string bytes = model.tokenizer->token_bytes(id);
    longest = std::max(longest, bytes.size());
    if (model.tokenizer->is_special(id)) special.push_back(bytes);
  }
  state_->max_token_bytes = longest;
  state_->special_tokens = std::move(special);
  // The memory plan's choices over the flags' (/props reads them from the state once ready).
  if (model.parallel > 0) state_->options.scheduler.parallel = model.parallel;
  if (model.cache_slots > 0) state_->options.prefix_cache.slots = model.cache_slots;
  if (model.cache_gpu_bytes >= 0) state_->options.prefix_cache.gpu_bytes = model.cache_gpu_bytes;
  state_->engine = std::make_unique<EngineLoop>(*model.generator, model.context, options_.max_queue, metrics_,
                                               state_->options.prefix_cache, state_->options.scheduler);
  state_->ready.store(true, std::memory_order_release);
}

int HttpServer::parallel() const { return state_->engine ? state_->engine->parallel() : 0; }

void HttpServer::install_routes() {
  ServerState& s = *state_;
  httplib::Server& h = *http_;

  h.set_pre_routing_handler([&s](const httplib::Request& req, httplib::Response& res) {
    RequestLog& log = request_log();
    log.start = std::chrono::steady_clock::now();
    log.route = "other";
    log.fields = Json::object();
    add_cors_headers(s.options.cors_origin, req, res);
    std::list<std::string> values;  // stable addresses for the pointers handed out
    auto header = [&](const char* name) -> const std::string* {
      if (!req.has_header(name)) return nullptr;
      return &values.emplace_back(req.get_header_value(name));
    };
    if (auto e = early_rejection(s, req.method, req.path, header)) {
      HttpConnections::close_after_response();  // the body (if any) was not read
      respond_error_on(req.path, res, *e);
      return httplib::Server::HandlerResponse::Handled;
    }
    if (req.method == "OPTIONS") {  // CORS preflight
      log.route = "preflight";
      res.status = 204;
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  // Every route is registered through these, which also record it for the 405 answers.
  auto get = [&s, &h](const std::string& pattern, httplib::Server::Handler handler) {
    h.Get(pattern, std::move(handler));
    s.routes.push_back({std::regex(pattern), "GET"});
  };
  auto post = [&s, &h](const std::string& pattern, httplib::Server::Handler handler) {
    h.Post(pattern, std::move(handler));
    s.routes.push_back({std::regex(pattern), "POST"});
  };
  get("/", [](const httplib::Request&, httplib::Response& res) {
    request_log().route = "/";
    res.set_content(chat_page_html(), "text/html; charset=utf-8");
  });
  get("/favicon.ico", [](const httplib::Request&, httplib::Response& res) {
    request_log().route = "/favicon.ico";
    const std::string_view icon = chat_page_favicon_svg();
    res.set_header("Cache-Control", "max-age=86400");
    res.set_content(icon.data(), icon.size(), "image/svg+xml");
  });
  get(R"(/page/([A-Za-z0-9._-]+))", [](const httplib::Request& req, httplib::Response& res) {
    request_log().route = "/page/";
    const std::optional<ChatPageAsset> asset = chat_page_asset(req.matches[1].str());
    if (!asset) {
      res.status = 404;
      res.set_content("not found\n", "text/plain; charset=utf-8");
      return;
    }
    res.set_header("Cache-Control", "max-age=86400");
    res.set_content(asset->bytes.data(), asset->bytes.size(), std::string(asset->content_type));
  });
  get("/health", [&s](const httplib::Request&, httplib::Response& res) {
    request_log().route = "/health";
    if (s.ready.load(std::memory_order_acquire)) respond_json(res, Json{{"status", "ok"}});
    else respond_json(res, Json{{"status", "loading"}}, 503);
  });
  get("/metrics", [&s](const httplib::Request&, httplib::Response& res) {
    request_log().route = "/metrics";
    res.set_content(s.metrics->render_prometheus(), "text/plain; version=0.0.4; charset=utf-8");
  });
  auto models = [&s](const httplib::Request& req, httplib::Response& res) { handle_models(s, req, res); };
  get("/v1/models", models);
  get("/models", models);
  get(R"(/v1/models/(.+))", [&s](const httplib::Request& req, httplib::Response& res) { handle_model(s, req, res); });
  auto chat = [&s](const httplib::Request& req, httplib::Response& res) { handle_chat_completions(s, req, res); };
  auto completions = [&s](const httplib::Request& req, httplib::Response& res) { handle_completions(s, req, res); };
  post("/v1/chat/completions", chat);
  post("/chat/completions", chat);
  post("/v1/completions", completions);
  post("/completions", completions);
  post("/v1/messages", [&s](const httplib::Request& req, httplib::Response& res) { handle_anthropic_messages(s, req, res); });
  post("/v1/messages/count_tokens",
       [&s](const httplib::Request& req, httplib::Response& res) { handle_anthropic_count_tokens(s, req, res); });
  auto responses = [&s](const httplib::Request& req, httplib::Response& res) { handle_responses(s, req, res); };
  auto response_lookup = [&s](const httplib::Request& req, httplib::Response& res) { handle_response_lookup(s, req, res); };
  post("/v1/responses", responses);
  post("/responses", responses);
  get(R"(/v1/responses/([^/]+))", response_lookup);
  get(R"(/responses/([^/]+))", response_lookup);
  // /tokenize: the chat form ("messages", OpenAI's chat shape, images counted) or the text form ("content").
  post("/tokenize", [&s](const httplib::Request& req, httplib::Response& res) {
    const bool chat = json_nesting_depth(req.body, 64) <= 64 && [&] {
      const Json j = Json::parse(req.body, nullptr, /*allow_exceptions=*/false);
      return j.is_object() && j.contains("messages");
    }();
    if (chat) handle_tokenize_chat(s, req, res);
    else handle_tokenize(s, req, res);
  });
  post("/detokenize", [&s](const httplib::Request& req, httplib::Response& res) { handle_detokenize(s, req, res); });
  get("/props", [&s](const httplib::Request& req, httplib::Response& res) { handle_props(s, req, res); });
  // Ollama's API (ollama_handlers.cpp).
  post("/api/chat", [&s](const httplib::Request& req, httplib::Response& res) { handle_ollama_chat(s, req, res); });
  post("/api/generate", [&s](const httplib::Request& req, httplib::Response& res) { handle_ollama_generate(s, req, res); });
  post("/api/show", [&s](const httplib::Request& req, httplib::Response& res) { handle_ollama_show(s, req, res); });
  get("/api/tags", [&s](const httplib::Request& req, httplib::Response& res) { handle_ollama_tags(s, req, res); });
  get("/api/ps", [&s](const httplib::Request& req, httplib::Response& res) { handle_ollama_ps(s, req, res); });
  get("/api/version", [&s](const httplib::Request& req, httplib::Response& res) { handle_ollama_version(s, req, res); });

  // Errors that no handler wrote (unknown route, body over the limit, unreadable request) become JSON here.
  h.set_error_handler(httplib::Server::HandlerWithResponse([&s](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e;
    const std::string allow = res.status == 404 ? allowed_methods(s, req.path) : std::string();
    if (!allow.empty()) {  // a known path asked with another method
      e = api_error_invalid("", "Method " + req.method + " is not allowed on " + req.path + " (allowed: " + allow + ").");
      e.status = 405;
      e.code = "method_not_allowed";
      res.status = 405;
      res.set_header("Allow", allow);
    } else if (res.status == 404) {
      e = api_error_not_found("Unknown route: " + req.method + " " + req.path +
                              " (see /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages, /v1/models, /api/chat, "
                              "/api/generate, /api/tags, /tokenize, /detokenize, /props, /health, /metrics).");
    } else if (res.status == 413) {
      e = api_error_too_large(s.options.max_body_bytes);
    } else if (res.status >= 500) {
      e = api_error_internal("internal error while serving " + req.path);
    } else {
      e = api_error_invalid("", "Bad request (HTTP " + std::to_string(res.status) + ").");
      e.status = res.status;
    }
    const int status = res.status;
    respond_error_on(req.path, res, e);
    res.status = status;
    return httplib::Server::HandlerResponse::Handled;
  }));
  h.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    std::fprintf(stderr, "tern serve: internal error in %s %s: %s\n", req.method.c_str(), req.path.c_str(), what.c_str());
    respond_error_on(req.path, res, api_error_internal("internal error: " + what));
  });
  h.set_logger([&s](const httplib::Request& req, const httplib::Response& res) {
    RequestLog& log = request_log();
    s.metrics->on_http_response(log.route, res.status);
    if (s.options.log_requests) {
      Json line = {{"time", iso_time_now()}, {"method", req.method}, {"path", req.path}, {"status", res.status},
                   {"remote", req.remote_addr}};
      if (log.start != std::chrono::steady_clock::time_point{})
        line["ms"] = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - log.start).count();
      for (auto& [k, v] : log.fields.items()) line[k] = v;
      const std::string text = json_dump(line) + "\n";
      std::fputs(text.c_str(), stderr);
    }
    log = RequestLog{};
  });
}

}  // namespace tern::server
