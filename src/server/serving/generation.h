// How every generation route serves, whatever its API: the checks and settings the APIs share (the model loaded,
// sampling defaults, the prompt against the context), then the task queued to the engine loop and answered with the
// API's output object (its <api>_output.h) -- one JSON object, or a stream fed by the engine's events. A client that
// goes away (seen by polling its socket, or by a failed write) cancels its task: withdrawn from the queue if it
// still waits, else stopped by the engine before its next decode step. A server that stops ends each stream with a
// 503 shutting_down error event.
//
// The serving path is a template over the output type; each API's handlers (openai_handlers.cpp,
// anthropic_handlers.cpp, responses_handlers.cpp, ollama_handlers.cpp) instantiate it with their own output, whose
// stream framing and error shape ResponseProtocol<Output> gives (response_protocol.h). Nothing here names an API.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <httplib.h>

#include "engine/generator.h"
#include "engine/sampler.h"
#include "server/http/client_link.h"
#include "server/http/errors.h"
#include "server/http/respond.h"
#include "server/http/sse.h"
#include "server/serving/chat_request.h"
#include "server/serving/request_queue.h"
#include "server/serving/response_protocol.h"
#include "server/serving/server_state.h"

namespace tern::server {

// True once the model is loaded; until then false, with a 503 "model_loading" (Retry-After: 5) written by
// `respond` (the route's API shapes the error: respond_error, respond_anthropic_error, respond_ollama_error).
bool model_ready(const ServerState& state, httplib::Response& res,
                 void (*respond)(httplib::Response&, const ApiError&) = respond_error);
// What the request parsers need to know of the served model and the server's flags.
ParseOptions parse_options(const ServerState& state);
// generation_config defaults, overridden by the request; a 400 naming the value when out of range.
std::variant<SamplingParams, ApiError> sampling_params(const ServerState& state, const SamplingOverrides& overrides,
                                                       int top_logprobs);
// Before tokenizing: a prompt longer than context x the longest token's bytes cannot fit, whatever its tokens.
std::optional<ApiError> check_prompt_bytes(const ServerState& state, size_t bytes, const char* param);
// The prompt must leave room for at least one generated token.
std::optional<ApiError> check_context(const ServerState& state, size_t prompt_tokens);
// truncate_prompt_tokens (vLLM's request field): keeps only the prompt's last `keep` tokens (none: unchanged).
// Returns whether tokens were dropped.
bool truncate_prompt(std::vector<int32_t>& prompt, const std::optional<int64_t>& keep);

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

namespace generation_detail {

constexpr std::chrono::milliseconds kPollInterval{20};  // how often a waiting handler checks its client

// What a generation cancelled by the server's stop answers (503 shutting_down), streamed or not: never a finish,
// which would tell the client that its answer is complete.
ApiError shutdown_error();
// The generation's numbers in the request log line.
void log_result(const GenerationResult& r, const std::string& id);

// What a stream starts with before any token: the output's first events (Anthropic's message_start, Responses'
// response.created, ...), its first chunk (OpenAI chat's role delta), or nothing.
template <typename Output>
std::vector<Json> first_chunks(Output& output) {
  if constexpr (requires { output.first_events(); }) return output.first_events();
  else if constexpr (requires { output.first_chunk(); }) return {output.first_chunk()};
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

// The client hung up (its socket says so, or a write failed): cancels the generation, and the request log line says
// so (client_closed; a non-streamed request is also answered 499, see serve).
template <typename Ex>
void client_left(Ex& ex) {
  request_log().fields["client_closed"] = true;
  ex.cancel();
}

// Writes `s` to the stream. False when the write failed: the client is gone and the generation cancelled.
template <typename Ex>
bool stream_write(Ex& ex, httplib::DataSink& sink, const std::string& s) {
  if (sink.write(s.data(), s.size())) {
    ex.last_write = std::chrono::steady_clock::now();
    return true;
  }
  ex.link->mark_gone();
  client_left(ex);
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
        client_left(ex);
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
          client_left(ex);
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
        if (r.finish == FinishReason::cancelled && !ex.stop_requested) {
          request_log().fields["client_closed"] = true;
          return false;
        }
        if (r.finish == FinishReason::cancelled) return stream_end_with_error(ex, sink, shutdown_error());
        for (const Json& c : ex.output->finish_chunks(r))
          if (!write(Protocol::stream_event(c))) return false;
        if (!Protocol::stream_end().empty() && !write(Protocol::stream_end())) return false;
        sink.done();
        return true;
      }
      case EngineEvent::Kind::error:
        return stream_end_with_error(ex, sink, event->error);
      case EngineEvent::Kind::progress: {
        // Only a task whose client asked gets these (GenerationTask::report_progress, which the OpenAI routes set);
        // an output that writes no progress chunks skips them.
        if constexpr (requires { ex.output->progress_chunks(event->progress); }) {
          for (const Json& c : ex.output->progress_chunks(event->progress))
            if (!write(Protocol::stream_event(c))) return false;
          return true;
        }
        continue;
      }
    }
  }
}

}  // namespace generation_detail

// Queues the task and answers: a stream, or one JSON object when the generation is done.
template <typename Request, typename Output>
void serve(ServerState& state, const httplib::Request& req, httplib::Response& res,
           std::shared_ptr<Exchange<Request, Output>> ex, bool stream) {
  using namespace generation_detail;
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
      if (ex->client_gone()) {  // nobody reads the answer: 499 is for the log line and the metrics
        client_left(*ex);
        ex->link->release();
        Protocol::respond_error(res, api_error_client_closed());
        return;
      }
      continue;
    }
    if (event->kind == EngineEvent::Kind::progress) continue;  // a stream's only
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
    if (event->kind == EngineEvent::Kind::error) return Protocol::respond_error(res, event->error);
    log_result(event->result, ex->task->id);
    if (event->result.finish == FinishReason::cancelled) {
      if (ex->stop_requested) return Protocol::respond_error(res, shutdown_error());
      client_left(*ex);  // the engine saw the client leave before this thread did
      return Protocol::respond_error(res, api_error_client_closed());
    }
    respond_json(res, ex->output->response(event->result));
    return;
  }
}

// Queues a task whose request the handler built and answers with `output` (whole, or as its stream; cancelled when
// the client leaves). The output must not refer to the request the handler parsed (it is gone when a stream's
// provider runs): one that does goes through an Exchange that holds both, and serve().
template <typename Output>
void serve_output(ServerState& state, const httplib::Request& req, httplib::Response& res,
                  std::shared_ptr<GenerationTask> task, std::unique_ptr<Output> output, bool stream) {
  auto ex = std::make_shared<Exchange<std::monostate, Output>>();
  ex->state = &state;
  ex->task = std::move(task);
  ex->output = std::move(output);
  serve(state, req, res, ex, stream);
}

}  // namespace tern::server
