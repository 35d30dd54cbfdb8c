// Ollama (ollama_handlers.cpp): POST /api/chat, /api/generate, /api/show; GET /api/tags, /api/ps, /api/version.
// http_server.cpp registers them.
#pragma once

#include <httplib.h>

namespace tern::server {

struct ServerState;

void handle_ollama_chat(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_ollama_generate(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_ollama_show(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_ollama_tags(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_ollama_ps(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_ollama_version(ServerState& state, const httplib::Request& req, httplib::Response& res);

}  // namespace tern::server
