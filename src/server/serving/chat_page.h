// GET /: the built-in chat page, one HTML document put together from src/server/serving/page/ (index.html,
// style.css, markdown.js, app.js), which the binary embeds at build time. Its only other resources are the code
// highlighting and math libraries (highlight.js, KaTeX), also embedded and served by this server under /page/.
// It streams from /v1/chat/completions; docs/server.md and README.md describe what it offers.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace tern::server {

const std::string& chat_page_html();

// GET /favicon.ico: the page's icon, an SVG (page/favicon.svg; browsers take an SVG icon whatever its path).
std::string_view chat_page_favicon_svg();

// GET /page/NAME: highlight.min.js, highlight.css (its light and dark themes), katex.min.js, katex.min.css;
// nullopt for any other name.
struct ChatPageAsset {
  std::string_view bytes;
  std::string_view content_type;
};
std::optional<ChatPageAsset> chat_page_asset(std::string_view name);

}  // namespace tern::server
