// GET /: the built-in chat page, one self-contained HTML document (no external resources) put together from
// src/server/serving/page/ (index.html, style.css, markdown.js, app.js), which the binary embeds at build time.
// It streams from /v1/chat/completions; docs/server.md and README.md describe what it offers.
#pragma once

#include <string>
#include <string_view>

namespace tern::server {

const std::string& chat_page_html();

// GET /favicon.ico: the page's icon, an SVG (page/favicon.svg; browsers take an SVG icon whatever its path).
std::string_view chat_page_favicon_svg();

}  // namespace tern::server
