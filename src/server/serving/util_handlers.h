// Utility routes in llama.cpp's shapes (util_handlers.cpp): POST /tokenize, POST /detokenize, GET /props.
// http_server.cpp registers them.
#pragma once

#include <httplib.h>

namespace tern::server {

struct ServerState;

void handle_tokenize(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_detokenize(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_props(ServerState& state, const httplib::Request& req, httplib::Response& res);

}  // namespace tern::server
