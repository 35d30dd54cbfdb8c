// The chat page's files (src/server/serving/page/) are embedded into the binary by the assembler's .incbin, as the demo
// model's assets are (src/engine/demo_assets.cpp): CMakeLists.txt passes their folder as TERN_PAGE_DIR and makes
// this file depend on them. At the first request they are put together into one HTML page. The libraries it uses
// for code highlighting and math (highlight.js and KaTeX, from Debian's packages; CMakeLists.txt cuts and copies
// them into TERN_PAGE_LIB_DIR at configure time) are embedded the same way and served under /page/.
#include "server/serving/chat_page.h"

#include <array>
#include <string_view>

#include "core/check.h"

#ifndef TERN_PAGE_DIR
#error "TERN_PAGE_DIR must name src/server/serving/page (set by CMakeLists.txt)"
#endif
#ifndef TERN_PAGE_LIB_DIR
#error "TERN_PAGE_LIB_DIR must name the folder of the page's libraries (set by CMakeLists.txt)"
#endif

#define TERN_PAGE_INCBIN_FROM(dir, name, file)  \
  ".balign 16\n"                                \
  "tern_page_" name "_begin:\n"                 \
  ".incbin \"" dir "/" file "\"\n"              \
  "tern_page_" name "_end:\n"
#define TERN_PAGE_INCBIN(name, file) TERN_PAGE_INCBIN_FROM(TERN_PAGE_DIR, name, file)
#define TERN_PAGE_LIB_INCBIN(name, file) TERN_PAGE_INCBIN_FROM(TERN_PAGE_LIB_DIR, name, file)

// KaTeX's fonts (woff2), as CMakeLists.txt's TERN_KATEX_FONTS lists them: X(symbol, file name part).
#define TERN_KATEX_FONTS(X)                                                                                        \
  X(AMS_Regular, "AMS-Regular") X(Caligraphic_Bold, "Caligraphic-Bold")                                            \
  X(Caligraphic_Regular, "Caligraphic-Regular") X(Fraktur_Bold, "Fraktur-Bold")                                    \
  X(Fraktur_Regular, "Fraktur-Regular") X(Main_Bold, "Main-Bold") X(Main_BoldItalic, "Main-BoldItalic")            \
  X(Main_Italic, "Main-Italic") X(Main_Regular, "Main-Regular") X(Math_BoldItalic, "Math-BoldItalic")              \
  X(Math_Italic, "Math-Italic") X(SansSerif_Bold, "SansSerif-Bold") X(SansSerif_Italic, "SansSerif-Italic")        \
  X(SansSerif_Regular, "SansSerif-Regular") X(Script_Regular, "Script-Regular") X(Size1_Regular, "Size1-Regular")  \
  X(Size2_Regular, "Size2-Regular") X(Size3_Regular, "Size3-Regular") X(Size4_Regular, "Size4-Regular")            \
  X(Typewriter_Regular, "Typewriter-Regular")
#define TERN_FONT_INCBIN(sym, part) TERN_PAGE_LIB_INCBIN("font_" #sym, "KaTeX_" part ".woff2")

__asm__(".pushsection .rodata\n"
        TERN_PAGE_INCBIN("html", "index.html")
        TERN_PAGE_INCBIN("css", "style.css")
        TERN_PAGE_INCBIN("markdown", "markdown.js")
        TERN_PAGE_INCBIN("app", "app.js")
        TERN_PAGE_INCBIN("favicon", "favicon.svg")
        TERN_PAGE_LIB_INCBIN("hljs", "highlight.min.js")
        TERN_PAGE_LIB_INCBIN("hljs_css", "highlight.css")
        TERN_PAGE_LIB_INCBIN("katex", "katex.min.js")
        TERN_PAGE_LIB_INCBIN("katex_css", "katex.min.css")
        TERN_KATEX_FONTS(TERN_FONT_INCBIN)
        ".popsection\n");

extern "C" const char tern_page_html_begin[], tern_page_html_end[];
extern "C" const char tern_page_css_begin[], tern_page_css_end[];
extern "C" const char tern_page_markdown_begin[], tern_page_markdown_end[];
extern "C" const char tern_page_app_begin[], tern_page_app_end[];
extern "C" const char tern_page_favicon_begin[], tern_page_favicon_end[];
extern "C" const char tern_page_hljs_begin[], tern_page_hljs_end[];
extern "C" const char tern_page_hljs_css_begin[], tern_page_hljs_css_end[];
extern "C" const char tern_page_katex_begin[], tern_page_katex_end[];
extern "C" const char tern_page_katex_css_begin[], tern_page_katex_css_end[];
#define TERN_FONT_DECL(sym, part) extern "C" const char tern_page_font_##sym##_begin[], tern_page_font_##sym##_end[];
TERN_KATEX_FONTS(TERN_FONT_DECL)

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

std::optional<ChatPageAsset> chat_page_asset(std::string_view name) {
  constexpr std::string_view js = "text/javascript; charset=utf-8", css = "text/css; charset=utf-8",
                             woff2 = "font/woff2";
#define TERN_FONT_ASSET(sym, part) \
  {"KaTeX_" part ".woff2", {bytes(tern_page_font_##sym##_begin, tern_page_font_##sym##_end), woff2}},
  const std::pair<std::string_view, ChatPageAsset> assets[] = {
      {"highlight.min.js", {bytes(tern_page_hljs_begin, tern_page_hljs_end), js}},
      {"highlight.css", {bytes(tern_page_hljs_css_begin, tern_page_hljs_css_end), css}},
      {"katex.min.js", {bytes(tern_page_katex_begin, tern_page_katex_end), js}},
      {"katex.min.css", {bytes(tern_page_katex_css_begin, tern_page_katex_css_end), css}},
      TERN_KATEX_FONTS(TERN_FONT_ASSET)};
#undef TERN_FONT_ASSET
  for (const auto& [n, asset] : assets)
    if (n == name) return asset;
  return std::nullopt;
}

}  // namespace tern::server
