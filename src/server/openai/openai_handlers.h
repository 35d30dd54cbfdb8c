// The OpenAI API's routes (openai_handlers.cpp): POST /v1/chat/completions and /v1/completions, GET /v1/models
// and /v1/models/{id}, and /tokenize's chat form (vLLM's: chat messages, their images counted). http_server.cpp
// registers them.
#pragma once

#include <httplib.h>

namespace tern::server {

struct ServerState;

void handle_chat_completions(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_completions(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_models(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_model(ServerState& state, const httplib::Request& req, httplib::Response& res);
// POST /tokenize with "messages" (a chat completions body): the prompt's tokens as a chat request would make them,
// each image's tokens included -> {"tokens": [...], "count": n, "max_model_len": context}.
void handle_tokenize_chat(ServerState& state, const httplib::Request& req, httplib::Response& res);

}  // namespace tern::server
