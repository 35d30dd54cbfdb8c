// POST /v1/chat/completions and /v1/completions: validate, build the prompt, queue a task for the engine loop,
// then answer with one JSON object or an SSE stream fed by the engine's events. A client that goes away (seen by
// polling its socket, or by a failed write) cancels its task: withdrawn from the queue if it still waits, else
// stopped by the engine before its next decode step.
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <utility>
#include <vector>

#include "core/check.h"
#include "server/anthropic/anthropic_output.h"
#include "server/http/client_link.h"
#include "server/http/sse.h"
#include "server/ollama/ollama_output.h"
#include "server/openai/chat_output.h"
#include "server/openai/openai_response.h"
#include "server/responses/responses_output.h"
#include "server/serving/response_protocol.h"
#include "server/serving/server_state.h"
#include "text/tokenizer.h"

namespace tern::server {

namespace {

using namespace std::chrono_literals;
constexpr auto kPollInterval = 20ms;     // how often a waiting handler checks its client

}  // namespace

ParseOptions parse_options(const ServerState& state) {
  ParseOptions o;
  o.model_id = state.model.model_id;
  o.model_aliases = state.model.aliases;
  o.vocab_size = state.model.vocab_size;
  o.allow_forced_output = state.options.allow_forced_output;
  return o;
}

// generation_config defaults, overridden by the request.
std::variant<SamplingParams, ApiError> sampling_params(const ServerState& state, const SamplingOverrides& o,
                                                       int top_logprobs) {
  SamplingParams p = state.model.defaults;
  if (o.temperature) p.temperature = *o.temperature;
  if (o.top_p) p.top_p = *o.top_p;
  if (o.min_p) p.min_p = *o.min_p;
  if (o.top_k) p.top_k = *o.top_k < 0 ? 0 : *o.top_k;
  if (o.presence_penalty) p.presence_penalty = *o.presence_penalty;
  if (o.frequency_penalty) p.frequency_penalty = *o.frequency_penalty;
  if (o.repetition_penalty) p.repetition_penalty = *o.repetition_penalty;
  if (o.seed) p.seed = *o.seed;
  p.logit_bias = o.logit_bias;
  p.top_logprobs = top_logprobs;
  try {
    p.validate();
  } catch (const Error& e) {
    return api_error_invalid("", strip_error_location(e.what()));
  }
  return p;
}

// Before tokenizing: a prompt longer than context x the longest token's bytes cannot fit, whatever its tokens.
std::optional<ApiError> check_prompt_bytes(const ServerState& state, size_t bytes, const char* param) {
  const size_t limit = size_t(state.model.context) * state.max_token_bytes;
  if (bytes <= limit) return std::nullopt;
  ApiError e = api_error_invalid(param, "The prompt is " + std::to_string(bytes) + " bytes: more than this model's "
                                        "context of " + std::to_string(state.model.context) + " tokens can hold (" +
                                        std::to_string(limit) + " bytes at most, " +
                                        std::to_string(state.max_token_bytes) +
                                        " bytes being its longest token). Shorten the prompt.");
  e.code = "context_length_exceeded";
  return e;
}

std::optional<ApiError> check_context(const ServerState& state, size_t prompt_tokens) {
  if (int64_t(prompt_tokens) >= state.model.context)
    return api_error_context(int64_t(prompt_tokens), state.model.context);
  return std::nullopt;
}

bool truncate_prompt(std::vector<int32_t>& prompt, const std::optional<int64_t>& keep) {
  if (!keep || int64_t(prompt.size()) <= *keep) return false;
  prompt.erase(prompt.begin(), prompt.end() - *keep);
  return true;
}

namespace {

// Everything a streamed response needs after the handler returns (the content provider runs later on the same
// thread, possibly called several times).
template <typename Request, typename Output>
struct Exchange {
  ServerState* state = nullptr;
  Request request;
  std::unique_ptr<Output> output;
  std::shared_ptr<GenerationTask> task;
  std::shared_ptr<ClientLink> link;
  bool started = false;
  bool finished = false;      // the last event was handled (response complete)
  bool stop_requested = false;  // the server is stopping: the generation was cancelled, its end is still sent
  std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
  int64_t token_events = 0;     // token events streamed so far (for --debug-stream-fault-after)

  void cancel() {
    task->cancel = true;
    if (state->engine) state->engine->withdraw(task);
  }
  bool client_gone() const { return link->gone(); }
  // The server is stopping: cancels the generation. A task that was still waiting in the queue gets no event
  // from the engine, so its end (finish cancelled, no tokens) is made here.
  std::optional<EngineEvent> begin_shutdown() {
    stop_requested = true;
    task->cancel = true;
    if (state->engine && state->engine->withdraw(task)) {
      GenerationResult r;
      r.finish = FinishReason::cancelled;
      return EngineEvent::of_done(r);
    }
    return std::nullopt;
  }
};

// What a generation cancelled by the server's stop answers (503 shutting_down), streamed or not: never a finish,
// which would tell the client that its answer is complete.
ApiError shutdown_error() {
  return api_error_shutting_down("The server is shutting down; the generation was cancelled.");
}

void log_result(const GenerationResult& r, const std::string& id) {
  Json& f = request_log().fields;
  f["id"] = id;
  f["prompt_tokens"] = r.prompt_tokens;
  f["completion_tokens"] = r.completion_tokens;
  f["finish"] = finish_reason_name(r.finish);
  f["prefill_ms"] = int64_t(r.prefill_s * 1000);
  f["decode_tok_s"] = int64_t(r.decode_tok_s() * 10) / 10.0;
}

template <typename Output>
std::vector<Json> first_chunks(Output& output) {
  if constexpr (std::is_same_v<Output, ChatOutput>) return {output.first_chunk()};
  else if constexpr (std::is_same_v<Output, AnthropicOutput> || std::is_same_v<Output, ResponsesOutput>)
    return output.first_events();
  else return {};
}

// A protocol's stream media type and its keep-alive text (written when the stream has been quiet for a while): SSE's
// (an event-stream, a comment) unless the protocol names its own (Ollama's NDJSON: no comments, so nothing: "" writes
// nothing).
template <typename Protocol>
const char* stream_content_type() {
  if constexpr (requires { Protocol::content_type(); }) return Protocol::content_type();
  else return "text/event-stream";
}
template <typename Protocol>
std::string keep_alive_text() {
  if constexpr (requires { Protocol::keep_alive(); }) return Protocol::keep_alive();
  else return sse_comment("waiting");
}

template <typename Ex>
using ProtocolOf = ResponseProtocol<std::remove_reference_t<decltype(*std::declval<Ex&>().output)>>;

// Writes `s` to the stream. False when the write failed: the client is gone and the generation cancelled.
template <typename Ex>
bool stream_write(Ex& ex, httplib::DataSink& sink, const std::string& s) {
  if (sink.write(s.data(), s.size())) {
    ex.last_write = std::chrono::steady_clock::now();
    return true;
  }
  ex.link->mark_gone();
  ex.cancel();
  return false;
}

// The keep-alive text to write now: when nothing was written for --stream-keep-alive seconds (while the request
// waits in the queue, or while its tokens produce no output, as inside a tool call); else "".
template <typename Ex>
std::string keep_alive_due(const Ex& ex) {
  const std::chrono::duration<double> quiet = std::chrono::steady_clock::now() - ex.last_write;
  if (quiet.count() < ex.state->options.stream_keep_alive_s) return "";
  return keep_alive_text<ProtocolOf<Ex>>();
}

// Ends the stream with `error`: the headers are gone already, so the error travels as the protocol's error event
// (as OpenAI does), then the stream's end ([DONE] where the API has one). An output that numbers its events
// (Responses) makes them itself.
template <typename Ex>
bool stream_end_with_error(Ex& ex, httplib::DataSink& sink, const ApiError& error) {
  using Protocol = ProtocolOf<Ex>;
  ex.finished = true;
  request_log().fields["error"] = error.message;
  if constexpr (requires { ex.output->error_events(error); }) {
    for (const Json& c : ex.output->error_events(error))
      if (!stream_write(ex, sink, Protocol::stream_event(c))) return false;
  } else if (!stream_write(ex, sink, Protocol::stream_event(Protocol::error_body(error)))) {
    return false;
  }
  if (!Protocol::stream_end().empty() && !stream_write(ex, sink, Protocol::stream_end())) return false;
  sink.done();
  return true;
}

// The stream's content provider: returns false to end the response early (client gone, write failed).
template <typename Ex>
bool stream_step(Ex& ex, httplib::DataSink& sink) {
  using Protocol = ProtocolOf<Ex>;
  auto write = [&](const std::string& s) { return stream_write(ex, sink, s); };
  if (!ex.started) {
    ex.started = true;
    for (const Json& c : first_chunks(*ex.output))
      if (!write(Protocol::stream_event(c))) return false;
  }
  for (;;) {
    std::optional<EngineEvent> event;
    if (ex.state->stopping.load() && !ex.stop_requested) event = ex.begin_shutdown();
    if (!event) event = ex.task->events.pop(kPollInterval);
    if (!event) {
      if (ex.client_gone()) {
        ex.cancel();
        return false;
      }
      if (const std::string keep_alive = keep_alive_due(ex); !keep_alive.empty()) return write(keep_alive);
      continue;
    }
    switch (event->kind) {
      case EngineEvent::Kind::token: {
        const int64_t fault_after = ex.state->options.debug_stream_fault_after;
        if (fault_after > 0 && ++ex.token_events > fault_after)
          throw std::runtime_error("fault injected by --debug-stream-fault-after");
        const std::vector<Json> chunks = ex.output->on_token(event->token);
        for (const Json& c : chunks)
          if (!write(Protocol::stream_event(c))) return false;
        // Tokens that show nothing yet (a tool call being written) still keep the stream alive.
        const std::string keep_alive = chunks.empty() ? keep_alive_due(ex) : std::string();
        if (!keep_alive.empty() && !write(keep_alive)) return false;
        if (ex.client_gone()) {  // noticed between tokens: stop before the next decode step
          ex.cancel();
          return false;
        }
        return true;
      }
      case EngineEvent::Kind::done: {
        const GenerationResult& r = event->result;
        log_result(r, ex.task->id);
        ex.finished = true;
        // Cancelled because the client left: nobody to write to. Cancelled because the server stops: the answer is
        // incomplete, so the stream ends with an error (503 shutting_down) rather than a finish, then its end.
        if (r.finish == FinishReason::cancelled && !ex.stop_requested) return false;
        if (r.finish == FinishReason::cancelled) return stream_end_with_error(ex, sink, shutdown_error());
        for (const Json& c : ex.output->finish_chunks(r))
          if (!write(Protocol::stream_event(c))) return false;
        if (!Protocol::stream_end().empty() && !write(Protocol::stream_end())) return false;
        sink.done();
        return true;
      }
      case EngineEvent::Kind::error:
        return stream_end_with_error(ex, sink, event->error);
    }
  }
}

// Queues the task and answers: a stream, or one JSON object when the generation is done.
template <typename Request, typename Output>
void serve(ServerState& state, const httplib::Request& req, httplib::Response& res,
           std::shared_ptr<Exchange<Request, Output>> ex, bool stream) {
  using Protocol = ResponseProtocol<Output>;
  ex->link = std::make_shared<ClientLink>(CurrentConnection::socket());
  ex->task->client_gone = [link = ex->link] { return link->gone(); };
  request_log().fields["id"] = ex->task->id;
  request_log().fields["stream"] = stream;
  if (!state.engine->submit(ex->task)) {
    ex->link->release();
    Protocol::respond_error(res, api_error_overloaded(state.engine->max_queue(), 1));
    return;
  }
  if (stream) {
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    auto provider = [ex](size_t, httplib::DataSink& sink) {
      try {
        return stream_step(*ex, sink);
      } catch (const std::exception& e) {  // never let an exception into cpp-httplib's writer
        // A fault of ours: the generation stops, the client gets a 500 error event and the stream's end.
        std::fprintf(stderr, "tern serve: internal error while streaming %s: %s\n", ex->task->id.c_str(), e.what());
        ex->cancel();
        try {
          return stream_end_with_error(*ex, sink, api_error_internal(std::string("internal error: ") + e.what()));
        } catch (const std::exception&) {  // the error event itself failed: close the connection
          return false;
        }
      }
    };
    auto release = [ex](bool) {
      ex->link->release();
      if (!ex->finished) ex->cancel();
    };
    // HTTP/1.0 has no chunked coding: its stream is raw and ends when the connection closes.
    if (req.version == "HTTP/1.0")
      res.set_content_provider(stream_content_type<Protocol>(), std::move(provider), std::move(release));
    else
      res.set_chunked_content_provider(stream_content_type<Protocol>(), std::move(provider), std::move(release));
    return;
  }
  for (;;) {
    std::optional<EngineEvent> event;
    if (state.stopping.load() && !ex->stop_requested) event = ex->begin_shutdown();
    if (!event) event = ex->task->events.pop(kPollInterval);
    if (!event) {
      if (ex->client_gone()) {
        ex->cancel();
        ex->link->release();
        request_log().fields["error"] = "client disconnected";
        Protocol::respond_error(res, api_error_invalid("", "The client disconnected; the generation was cancelled."));
        return;
      }
      continue;
    }
    if (event->kind == EngineEvent::Kind::token) {
      try {
        ex->output->on_token(event->token);
      } catch (const std::exception& e) {  // a fault of ours: 500, logged; the generation must not run on
        ex->cancel();
        ex->link->release();
        std::fprintf(stderr, "tern serve: internal error in %s: %s\n", ex->task->id.c_str(), e.what());
        return Protocol::respond_error(res, api_error_internal(std::string("internal error: ") + e.what()));
      }
      continue;
    }
    ex->link->release();
    if (event->kind == EngineEvent::Kind::error) {
      request_log().fields["error"] = event->error.message;
      Protocol::respond_error(res, event->error);
      return;
    }
    log_result(event->result, ex->task->id);
    if (ex->stop_requested && event->result.finish == FinishReason::cancelled)
      return Protocol::respond_error(res, shutdown_error());
    respond_json(res, ex->output->response(event->result));
    return;
  }
}

}  // namespace

bool model_ready(const ServerState& state, httplib::Response& res, void (*respond)(httplib::Response&, const ApiError&)) {
  if (state.ready.load(std::memory_order_acquire)) return true;
  ApiError e = api_error_internal("The model is still loading; retry shortly (GET /health says when it is ready).");
  e.status = 503;
  e.code = "model_loading";
  e.retry_after_s = 5;
  respond(res, e);
  return false;
}

void handle_chat_completions(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  request_log().route = "/v1/chat/completions";
  if (!model_ready(state, res)) return;
  auto parsed = parse_chat_request(req.body, parse_options(state));
  if (auto* e = std::get_if<ApiError>(&parsed)) return respond_error(res, *e);
  auto ex = std::make_shared<Exchange<ChatRequest, ChatOutput>>();
  ex->state = &state;
  ex->request = std::move(std::get<ChatRequest>(parsed));
  const ChatRequest& request = ex->request;

  static const std::vector<std::string> kNone;
  auto prompt = chat_render_prompt(request, *state.model.chat_template,
                                   state.options.allow_special_in_content ? kNone : state.special_tokens);
  if (auto* e = std::get_if<ApiError>(&prompt)) return respond_error(res, *e);
  const ChatPrompt& chat_prompt = std::get<ChatPrompt>(prompt);
  auto sampling = sampling_params(state, request.sampling, request.logprobs ? request.top_logprobs : -1);
  if (auto* e = std::get_if<ApiError>(&sampling)) return respond_error(res, *e);

  // Asked to truncate, a prompt may be longer than the context: only its last tokens are kept.
  if (!request.truncate_prompt_tokens)
    if (auto e = check_prompt_bytes(state, chat_prompt.text.size(), "messages")) return respond_error(res, *e);

  auto task = std::make_shared<GenerationTask>();
  task->id = response_id("chatcmpl-");
  try {
    task->request.prompt = chat_prompt_tokens(chat_prompt, *state.model.tokenizer);
    if (request.forced_output) task->request.forced_tokens = state.model.tokenizer->encode(*request.forced_output);
  } catch (const Error& e) {
    return respond_error(res, api_error_invalid("messages", strip_error_location(e.what())));
  }
  truncate_prompt(task->request.prompt, request.truncate_prompt_tokens);
  if (auto e = check_context(state, task->request.prompt.size()))
    return respond_error(res, *e);
  // The prefix cache also snapshots where the generation prompt starts (the prompt's last <|im_start|>): the next
  // turn renders this turn's generation prompt and reply as the template renders history, which may differ from
  // what was generated (thinking dropped), but everything before that point is the same.
  task->request.checkpoint_at = chat_prompt_checkpoints(task->request.prompt, *state.model.tokenizer);
  task->request.sampling = std::get<SamplingParams>(sampling);
  task->request.max_tokens = request.max_tokens.value_or(-1);
  task->request.stop = request.stop;
  // The output constraint (response_format, a forced tool call). With thinking on, the prompt ends inside
  // <think>: the reasoning stays free and the constraint starts after the model closes it.
  task->request.grammar = request.grammar;
  if (request.grammar && chat_prompt.starts_in_reasoning) task->request.grammar_start_after = "</think>";
  set_thinking_budget(state, task->request, request.thinking_budget, chat_prompt.starts_in_reasoning);
  ex->task = task;
  ex->output = std::make_unique<ChatOutput>(ex->request, *state.model.tokenizer,
                                            ResponseMeta{task->id, unix_now(), state.model.model_id},
                                            chat_prompt.starts_in_reasoning);
  serve(state, req, res, ex, request.stream);
}

void handle_completions(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  request_log().route = "/v1/completions";
  if (!model_ready(state, res)) return;
  auto parsed = parse_completion_request(req.body, parse_options(state));
  if (auto* e = std::get_if<ApiError>(&parsed)) return respond_error(res, *e);
  auto ex = std::make_shared<Exchange<CompletionRequest, CompletionOutput>>();
  ex->state = &state;
  ex->request = std::move(std::get<CompletionRequest>(parsed));
  const CompletionRequest& request = ex->request;

  auto sampling = sampling_params(state, request.sampling, request.logprobs);
  if (auto* e = std::get_if<ApiError>(&sampling)) return respond_error(res, *e);
  if (!request.prompt_is_ids && !request.truncate_prompt_tokens)
    if (auto e = check_prompt_bytes(state, request.prompt_text.size(), "prompt")) return respond_error(res, *e);
  auto task = std::make_shared<GenerationTask>();
  task->id = response_id("cmpl-");
  std::string echo_text;
  try {
    if (request.prompt_is_ids) {
      task->request.prompt = request.prompt_ids;
      if (request.echo) echo_text = state.model.tokenizer->decode(request.prompt_ids);
    } else {
      task->request.prompt = state.model.tokenizer->encode(request.prompt_text);
      echo_text = request.prompt_text;
    }
    if (request.forced_output) task->request.forced_tokens = state.model.tokenizer->encode(*request.forced_output);
  } catch (const Error& e) {
    return respond_error(res, api_error_invalid("prompt", strip_error_location(e.what())));
  }
  if (task->request.prompt.empty()) return respond_error(res, api_error_invalid("prompt", "'prompt' encodes to no tokens."));
  if (truncate_prompt(task->request.prompt, request.truncate_prompt_tokens) && request.echo)
    echo_text = state.model.tokenizer->decode(task->request.prompt);  // what the model saw
  if (auto e = check_context(state, task->request.prompt.size())) {
    e->param = "prompt";
    return respond_error(res, *e);
  }
  task->request.sampling = std::get<SamplingParams>(sampling);
  task->request.max_tokens = request.max_tokens;
  task->request.stop = request.stop;
  ex->task = task;
  ex->output = std::make_unique<CompletionOutput>(ex->request, *state.model.tokenizer,
                                                  ResponseMeta{task->id, unix_now(), state.model.model_id},
                                                  std::move(echo_text));
  serve(state, req, res, ex, request.stream);
}

template <typename Output>
void serve_output(ServerState& state, const httplib::Request& req, httplib::Response& res,
                  std::shared_ptr<GenerationTask> task, std::unique_ptr<Output> output, bool stream) {
  auto ex = std::make_shared<Exchange<std::monostate, Output>>();
  ex->state = &state;
  ex->task = std::move(task);
  ex->output = std::move(output);
  serve(state, req, res, ex, stream);
}

// The APIs that serve through serve_output (anthropic_handlers.cpp, responses_handlers.cpp, ollama_handlers.cpp).
template void serve_output<AnthropicOutput>(ServerState&, const httplib::Request&, httplib::Response&,
                                            std::shared_ptr<GenerationTask>, std::unique_ptr<AnthropicOutput>, bool);
template void serve_output<ResponsesOutput>(ServerState&, const httplib::Request&, httplib::Response&,
                                            std::shared_ptr<GenerationTask>, std::unique_ptr<ResponsesOutput>, bool);
template void serve_output<OllamaOutput>(ServerState&, const httplib::Request&, httplib::Response&,
                                         std::shared_ptr<GenerationTask>, std::unique_ptr<OllamaOutput>, bool);

}  // namespace tern::server
