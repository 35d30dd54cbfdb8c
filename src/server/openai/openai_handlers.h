// The OpenAI API's routes (openai_handlers.cpp): POST /v1/chat/completions and /v1/completions, GET /v1/models
// and /v1/models/{id}. http_server.cpp registers them.
#pragma once

#include <httplib.h>

namespace tern::server {

struct ServerState;

void handle_chat_completions(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_completions(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_models(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_model(ServerState& state, const httplib::Request& req, httplib::Response& res);

}  // namespace tern::server
