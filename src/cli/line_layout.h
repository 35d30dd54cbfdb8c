// Where the line editor (cli/line_editor.h) draws the edited line: its characters as terminal cells, and the rows
// they wrap onto after the prompt. Pure computation, no terminal: tested in tests/cli/line_layout_test.cpp.
//
// The line wraps at the terminal's width: a character that does not fit in what is left of a row (a wide CJK
// character in the last column) starts the next row. The cursor is one cell: after a row filled to the last column,
// a cursor at the end of the line sits at the start of a row of its own. When the rows are more than the screen
// holds, only a window of them is drawn, the cursor's row inside it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace tern::cli {

// One character of the edited line as drawn: its bytes [begin, end), its width in terminal cells (0 for a
// combining mark, 2 for a wide character), and what is drawn in its place when not its own bytes (a newline as ↵,
// another control character or a byte that is not UTF-8 as '?').
struct Glyph {
  size_t begin = 0, end = 0;
  int width = 1;
  std::string_view shown;
};
std::vector<Glyph> line_glyphs(const std::string& line);

struct LineLayout {
  // The first glyph of each row (row 0 starts after the prompt; rows[0] is 0). A row ends where the next starts, the
  // last at the end of the glyphs. The cursor's row may be one past the text's rows (an empty row: see above).
  std::vector<size_t> row_start;
  int cursor_row = 0, cursor_col = 0;  // the cell of the cursor; columns count from the row's left edge
  int rows() const { return int(row_start.size()); }
  // The glyphs [first, last) of row r.
  size_t row_begin(int r) const { return row_start[size_t(r)]; }
  size_t row_end(int r, size_t glyph_count) const {
    return size_t(r) + 1 < row_start.size() ? row_start[size_t(r) + 1] : glyph_count;
  }
};

// Lays out `glyphs` after a prompt of prompt_width cells on rows of `columns` cells, with the cursor before glyph
// `cursor` (glyphs.size(): at the end). columns is taken as at least prompt_width + 2.
LineLayout layout_line(const std::vector<Glyph>& glyphs, size_t cursor, int prompt_width, int columns);

// The rows drawn on a screen of screen_rows rows: [first, first + count), holding the cursor's row. All of them when
// they fit; else the last screen_rows rows up to the cursor's (the cursor on the bottom row), or from the first row
// when the cursor is within the first screen.
struct RowWindow {
  int first = 0, count = 0;
};
RowWindow visible_rows(const LineLayout& layout, int screen_rows);

}  // namespace tern::cli
