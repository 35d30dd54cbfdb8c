#include "cli/line_layout.h"

#include <utf8proc.h>

#include <algorithm>

namespace tern::cli {

namespace {
constexpr std::string_view kNewlineMark = "\xe2\x86\xb5";  // ↵: a newline inside a recalled multi-line message
}  // namespace

std::vector<Glyph> line_glyphs(const std::string& line) {
  std::vector<Glyph> out;
  for (size_t i = 0; i < line.size();) {
    utf8proc_int32_t cp = 0;
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(line.data() + i),
                                    utf8proc_ssize_t(line.size() - i), &cp);
    if (n <= 0) {  // a stray byte: one cell, drawn as '?'
      out.push_back({i, i + 1, 1, "?"});
      ++i;
      continue;
    }
    Glyph g{i, i + size_t(n), std::clamp(utf8proc_charwidth(cp), 0, 2), {}};
    if (cp == '\n') g = {i, i + 1, 1, kNewlineMark};
    else if (cp < 0x20 || cp == 0x7f) g = {i, i + 1, 1, "?"};
    out.push_back(g);
    i += size_t(n);
  }
  return out;
}

LineLayout layout_line(const std::vector<Glyph>& glyphs, size_t cursor, int prompt_width, int columns) {
  columns = std::max({columns, prompt_width + 2, 2});
  cursor = std::min(cursor, glyphs.size());
  LineLayout l;
  l.row_start.push_back(0);
  int used = prompt_width;  // cells taken on the current row
  for (size_t i = 0; i < glyphs.size(); ++i) {
    const int w = glyphs[i].width;
    if (used + w > columns && used > 0) {  // does not fit: the next row (a glyph wider than a row gets one alone)
      l.row_start.push_back(i);
      used = 0;
    }
    if (i == cursor) {
      l.cursor_row = l.rows() - 1;
      l.cursor_col = std::min(used, columns - 1);  // before a combining mark at the end of a full row
    }
    used += w;
  }
  if (cursor == glyphs.size()) {
    l.cursor_row = l.rows() - 1;
    l.cursor_col = used;
    if (used >= columns) {  // the last row is full: the cursor starts a row of its own
      l.row_start.push_back(glyphs.size());
      l.cursor_row = l.rows() - 1;
      l.cursor_col = 0;
    }
  }
  return l;
}

RowWindow visible_rows(const LineLayout& layout, int screen_rows) {
  const int rows = layout.rows();
  if (screen_rows <= 0 || rows <= screen_rows) return {0, rows};
  return {std::max(0, layout.cursor_row - screen_rows + 1), screen_rows};
}

}  // namespace tern::cli
