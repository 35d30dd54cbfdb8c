// The chat page's files (src/server/serving/page/) are embedded into the binary by the assembler's .incbin, as the demo
// model's assets are (src/engine/demo_assets.cpp): CMakeLists.txt passes their folder as TERN_PAGE_DIR and makes
// this file depend on them. At the first request they are put together into one self-contained HTML page.
#include "server/serving/chat_page.h"

#include <string_view>

#include "core/check.h"

#ifndef TERN_PAGE_DIR
#error "TERN_PAGE_DIR must name src/server/serving/page (set by CMakeLists.txt)"
#endif

#define TERN_PAGE_INCBIN(name, file)  \
  ".balign 16\n"                      \
  "tern_page_" name "_begin:\n"       \
  ".incbin \"" TERN_PAGE_DIR "/" file "\"\n" \
  "tern_page_" name "_end:\n"

__asm__(".pushsection .rodata\n"
        TERN_PAGE_INCBIN("html", "index.html")
        TERN_PAGE_INCBIN("css", "style.css")
        TERN_PAGE_INCBIN("markdown", "markdown.js")
        TERN_PAGE_INCBIN("app", "app.js")
        TERN_PAGE_INCBIN("favicon", "favicon.svg")
        ".popsection\n");

extern "C" const char tern_page_html_begin[], tern_page_html_end[];
extern "C" const char tern_page_css_begin[], tern_page_css_end[];
extern "C" const char tern_page_markdown_begin[], tern_page_markdown_end[];
extern "C" const char tern_page_app_begin[], tern_page_app_end[];
extern "C" const char tern_page_favicon_begin[], tern_page_favicon_end[];

namespace tern::server {
namespace {

std::string_view bytes(const char* begin, const char* end) { return {begin, size_t(end - begin)}; }

// Puts `part` where `marker` stands in `page`; the part must not be able to end its <style> or <script> element.
void splice(std::string& page, std::string_view marker, std::string_view part, std::string_view closing_tag) {
  const size_t at = page.find(marker);
  TERN_CHECK(at != std::string::npos, "chat page: index.html lacks the marker ", std::string(marker));
  TERN_CHECK(part.find(closing_tag) == std::string_view::npos, "chat page: an embedded file contains ",
             std::string(closing_tag), ", which would end its element early");
  page.replace(at, marker.size(), part);
}

std::string assemble() {
  std::string page(bytes(tern_page_html_begin, tern_page_html_end));
  std::string script(bytes(tern_page_markdown_begin, tern_page_markdown_end));
  script += '\n';
  script += bytes(tern_page_app_begin, tern_page_app_end);
  splice(page, "/*TERN:STYLE*/", bytes(tern_page_css_begin, tern_page_css_end), "</style");
  splice(page, "/*TERN:SCRIPT*/", script, "</script");
  return page;
}

}  // namespace

const std::string& chat_page_html() {
  static const std::string page = assemble();
  return page;
}

std::string_view chat_page_favicon_svg() { return bytes(tern_page_favicon_begin, tern_page_favicon_end); }

}  // namespace tern::server
