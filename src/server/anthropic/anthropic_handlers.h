// Anthropic Messages (anthropic_handlers.cpp): POST /v1/messages and /v1/messages/count_tokens. http_server.cpp
// registers them.
#pragma once

#include <httplib.h>

namespace tern::server {

struct ServerState;

void handle_anthropic_messages(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_anthropic_count_tokens(ServerState& state, const httplib::Request& req, httplib::Response& res);

}  // namespace tern::server
