// Internal to src/server: the state the HTTP handlers share, and the generation handlers (serving/generation.cpp).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <variant>
#include <vector>

#include <httplib.h>

#include "server/http/errors.h"
#include "server/http/respond.h"
#include "server/http_server.h"
#include "server/openai/openai_schema.h"
#include "server/serving/engine_loop.h"

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
  struct Route {
    std::regex pattern;
    std::string method;
  };
  std::vector<Route> routes;            // every registered route (a known path asked with another method: 405)
};
using ServerState = HttpServer::State;

void handle_chat_completions(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_completions(ServerState& state, const httplib::Request& req, httplib::Response& res);

// Shared by the generation routes of both APIs (defined in generation_handlers.cpp).
// True once the model is loaded; until then false, with a 503 "model_loading" (Retry-After: 5) written by
// `respond` (the route's API shapes the error: respond_error, respond_anthropic_error).
bool model_ready(const ServerState& state, httplib::Response& res,
                 void (*respond)(httplib::Response&, const ApiError&) = respond_error);
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
// Queues a task whose request the handler built and answers with `output` (whole, or as its stream; cancelled when
// the client leaves): the serving path of the APIs translated onto the chat request. Instantiated in
// generation_handlers.cpp for AnthropicOutput (Anthropic messages and events), ResponsesOutput (OpenAI Responses)
// and OllamaOutput (Ollama objects, NDJSON).
template <typename Output>
void serve_output(ServerState& state, const httplib::Request& req, httplib::Response& res,
                  std::shared_ptr<GenerationTask> task, std::unique_ptr<Output> output, bool stream);

// Ollama (ollama_handlers.cpp): POST /api/chat, /api/generate, /api/show; GET /api/tags, /api/ps, /api/version.
void handle_ollama_chat(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_ollama_generate(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_ollama_show(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_ollama_tags(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_ollama_ps(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_ollama_version(ServerState& state, const httplib::Request& req, httplib::Response& res);

// OpenAI Responses (responses_handlers.cpp): POST /v1/responses; GET /v1/responses/{id} (404: nothing is stored).
void handle_responses(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_response_lookup(ServerState& state, const httplib::Request& req, httplib::Response& res);

// Anthropic Messages (anthropic_handlers.cpp): POST /v1/messages and /v1/messages/count_tokens.
void handle_anthropic_messages(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_anthropic_count_tokens(ServerState& state, const httplib::Request& req, httplib::Response& res);

// Utility routes (util_handlers.cpp): POST /tokenize, POST /detokenize, GET /props.
void handle_tokenize(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_detokenize(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_props(ServerState& state, const httplib::Request& req, httplib::Response& res);

// Where the prefix cache should also snapshot a chat prompt: where its generation prompt starts (the last
// <|im_start|>). The next turn renders this turn's reply as history, which may differ from what was generated
// (thinking dropped), but everything before that point stays the same.
std::vector<int64_t> chat_prompt_checkpoints(const std::vector<int32_t>& prompt, const Tokenizer& tokenizer);

// A thinking budget (thinking_budget, Anthropic's thinking.budget_tokens; else the server's --thinking-budget) for a
// chat prompt: when the prompt ends inside <think>, at most that many reasoning tokens, then a short closing note and
// "</think>\n\n" are forced (GenerationRequest::thinking_budget). Nothing without a budget.
void set_thinking_budget(const ServerState& state, GenerationRequest& request, std::optional<int64_t> budget,
                         bool starts_in_reasoning);

}  // namespace tern::server
