// GET /: a small built-in chat page (vanilla HTML/JS, no external resources) that streams from
// /v1/chat/completions and shows reasoning apart from the answer.
#pragma once

#include <string>

namespace tern::server {

const std::string& chat_page_html();

}  // namespace tern::server
