#include "server/http_server.h"

#include <cstdio>
#include <ctime>

#include "core/check.h"
#include "server/chat_page.h"
#include "server/server_state.h"
#include "server/sse.h"

namespace tern::server {

RequestLog& request_log() {
  thread_local RequestLog log;
  return log;
}

void respond_json(httplib::Response& res, const Json& body, int status) {
  res.status = status;
  res.set_content(json_dump(body), "application/json");
}

void respond_error(httplib::Response& res, const ApiError& error) {
  res.status = error.status;
  if (error.retry_after_s > 0) res.set_header("Retry-After", std::to_string(error.retry_after_s));
  res.set_content(api_error_body(error), "application/json");
  if (error.status >= 500) request_log().fields["error"] = error.message;
}

namespace {

std::string iso_time_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

bool authorized(const ServerOptions& options, const httplib::Request& req) {
  if (options.api_key.empty()) return true;
  const std::string header = req.get_header_value("Authorization");
  const std::string expected = "Bearer " + options.api_key;
  if (header.size() != expected.size()) return false;
  unsigned char diff = 0;  // constant time in the key's length
  for (size_t i = 0; i < header.size(); ++i) diff |= static_cast<unsigned char>(header[i] ^ expected[i]);
  return diff == 0;
}

Json model_entry(const ServerState& state) {
  return Json{{"id", state.model.model_id},
              {"object", "model"},
              {"created", 0},
              {"owned_by", "tern"},
              {"max_model_len", state.model.context}};
}

}  // namespace

HttpServer::HttpServer(ServerOptions options)
    : options_(std::move(options)), http_(std::make_unique<httplib::Server>()), state_(std::make_shared<State>()) {
  TERN_CHECK(options_.max_queue >= 1, "--max-queue must be at least 1, got ", options_.max_queue);
  TERN_CHECK(options_.max_body_bytes >= 1024, "--max-body-bytes must be at least 1024, got ", options_.max_body_bytes);
  state_->options = options_;
  state_->metrics = &metrics_;
  const size_t threads = options_.http_threads > 0 ? size_t(options_.http_threads) : options_.max_queue + 8;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_->set_payload_max_length(options_.max_body_bytes);
  http_->set_keep_alive_max_count(1000);
  http_->set_read_timeout(30, 0);
  http_->set_write_timeout(30, 0);
  if (!options_.cors_origin.empty()) {
    http_->set_default_headers({{"Access-Control-Allow-Origin", options_.cors_origin},
                                {"Access-Control-Allow-Headers", "Authorization, Content-Type"},
                                {"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
                                {"Vary", "Origin"}});
  }
  install_routes();
}

HttpServer::~HttpServer() {
  stop();
  http_.reset();           // joins the handler threads (their streams end: `stopping` is set)
  state_->engine.reset();  // then the engine thread
}

int HttpServer::bind() {
  if (options_.port == 0) {
    port_ = http_->bind_to_any_port(options_.host);
    TERN_CHECK(port_ > 0, "cannot listen on ", options_.host, " (any port)");
  } else {
    TERN_CHECK(http_->bind_to_port(options_.host, options_.port), "cannot listen on ", options_.host, ":",
               options_.port, " (address in use, or not an address of this machine)");
    port_ = options_.port;
  }
  return port_;
}

void HttpServer::listen() { http_->listen_after_bind(); }

void HttpServer::stop() {
  state_->stopping = true;
  if (http_) http_->stop();
}

void HttpServer::set_model(const ServerModel& model) {
  TERN_CHECK(!state_->ready, "set_model called twice");
  TERN_CHECK(model.tokenizer && model.chat_template && model.generator && model.context > 0,
             "set_model: incomplete ServerModel");
  state_->model = model;
  state_->engine = std::make_unique<EngineLoop>(*model.generator, model.context, options_.max_queue, metrics_);
  state_->ready.store(true, std::memory_order_release);
}

void HttpServer::install_routes() {
  State& s = *state_;
  httplib::Server& h = *http_;

  h.set_pre_routing_handler([&s](const httplib::Request& req, httplib::Response& res) {
    RequestLog& log = request_log();
    log.start = std::chrono::steady_clock::now();
    log.route = "other";
    log.fields = Json::object();
    if (req.method == "OPTIONS") {  // CORS preflight
      log.route = "preflight";
      res.status = 204;
      return httplib::Server::HandlerResponse::Handled;
    }
    const bool open = req.path == "/health" || req.path == "/" || req.path == "/favicon.ico";
    if (!open && !authorized(s.options, req)) {
      respond_error(res, api_error_unauthorized());
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  h.Get("/", [](const httplib::Request&, httplib::Response& res) {
    request_log().route = "/";
    res.set_content(chat_page_html(), "text/html; charset=utf-8");
  });
  h.Get("/health", [&s](const httplib::Request&, httplib::Response& res) {
    request_log().route = "/health";
    if (s.ready.load(std::memory_order_acquire)) respond_json(res, Json{{"status", "ok"}});
    else respond_json(res, Json{{"status", "loading"}}, 503);
  });
  h.Get("/metrics", [&s](const httplib::Request&, httplib::Response& res) {
    request_log().route = "/metrics";
    res.set_content(s.metrics->render_prometheus(), "text/plain; version=0.0.4; charset=utf-8");
  });
  auto models = [&s](const httplib::Request&, httplib::Response& res) {
    request_log().route = "/v1/models";
    Json data = Json::array();
    if (s.ready.load(std::memory_order_acquire)) data.push_back(model_entry(s));
    respond_json(res, Json{{"object", "list"}, {"data", data}});
  };
  h.Get("/v1/models", models);
  h.Get("/models", models);
  h.Get(R"(/v1/models/(.+))", [&s](const httplib::Request& req, httplib::Response& res) {
    request_log().route = "/v1/models/{id}";
    const std::string id = req.matches[1];
    if (s.ready.load(std::memory_order_acquire) && id == s.model.model_id) return respond_json(res, model_entry(s));
    respond_error(res, api_error_not_found_model(id, s.model.model_id));
  });
  auto chat = [&s](const httplib::Request& req, httplib::Response& res) { handle_chat_completions(s, req, res); };
  auto completions = [&s](const httplib::Request& req, httplib::Response& res) { handle_completions(s, req, res); };
  h.Post("/v1/chat/completions", chat);
  h.Post("/chat/completions", chat);
  h.Post("/v1/completions", completions);
  h.Post("/completions", completions);

  // Errors that no handler wrote (unknown route, body over the limit, unreadable request) become JSON here.
  h.set_error_handler(httplib::Server::HandlerWithResponse([&s](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e;
    if (res.status == 404) {
      e = api_error_not_found("Unknown route: " + req.method + " " + req.path +
                              " (see /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics).");
    } else if (res.status == 413) {
      e = api_error_too_large(s.options.max_body_bytes);
    } else if (res.status >= 500) {
      e = api_error_internal("internal error while serving " + req.path);
    } else {
      e = api_error_invalid("", "Bad request (HTTP " + std::to_string(res.status) + ").");
      e.status = res.status;
    }
    const int status = res.status;
    respond_error(res, e);
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
    respond_error(res, api_error_internal("internal error: " + what));
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
