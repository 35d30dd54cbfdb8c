// OpenAI Responses (responses_handlers.cpp): POST /v1/responses; GET /v1/responses/{id} (404: nothing is stored).
// http_server.cpp registers them.
#pragma once

#include <httplib.h>

namespace tern::server {

struct ServerState;

void handle_responses(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_response_lookup(ServerState& state, const httplib::Request& req, httplib::Response& res);

}  // namespace tern::server
