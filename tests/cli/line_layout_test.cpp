// The line editor's layout (cli/line_layout.h): glyph widths, rows wrapped at the terminal's width after the prompt,
// the cursor's cell across rows, and the window of rows drawn when they outgrow the screen.
#include "cli/line_layout.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tern::cli {
namespace {

// The text of each row of `line` as laid out (glyphs as their own bytes or what is shown for them).
std::vector<std::string> rows_of(const std::string& line, const LineLayout& l) {
  const std::vector<Glyph> gs = line_glyphs(line);
  std::vector<std::string> out;
  for (int r = 0; r < l.rows(); ++r) {
    std::string row;
    for (size_t i = l.row_begin(r); i < l.row_end(r, gs.size()); ++i)
      row += gs[i].shown.empty() ? line.substr(gs[i].begin, gs[i].end - gs[i].begin) : std::string(gs[i].shown);
    out.push_back(row);
  }
  return out;
}

LineLayout layout(const std::string& line, size_t cursor_glyph, int prompt, int columns) {
  return layout_line(line_glyphs(line), cursor_glyph, prompt, columns);
}

TEST(LineGlyphs, WidthsAndShownText) {
  const std::vector<Glyph> gs = line_glyphs("a\xe4\xb8\xad\xcc\x81\n\x01\xff");  // a, 中, U+0301, \n, ^A, a bad byte
  ASSERT_EQ(gs.size(), 6u);
  EXPECT_EQ(gs[0].width, 1);
  EXPECT_EQ(gs[1].width, 2);
  EXPECT_EQ(gs[1].end - gs[1].begin, 3u);
  EXPECT_EQ(gs[2].width, 0);  // a combining mark
  EXPECT_EQ(gs[3].shown, "\xe2\x86\xb5");
  EXPECT_EQ(gs[4].shown, "?");
  EXPECT_EQ(gs[5].shown, "?");
  EXPECT_EQ(gs[5].width, 1);
}

TEST(LineLayout, ShortLineIsOneRow) {
  const LineLayout l = layout("hello", 5, 2, 80);
  EXPECT_EQ(l.rows(), 1);
  EXPECT_EQ(l.cursor_row, 0);
  EXPECT_EQ(l.cursor_col, 7);  // after "> hello"
  const LineLayout empty = layout("", 0, 2, 80);
  EXPECT_EQ(empty.rows(), 1);
  EXPECT_EQ(empty.cursor_col, 2);
}

TEST(LineLayout, WrapsAfterThePromptAtTheWidth) {
  // Width 10, prompt 2: the first row holds 8 characters, the next ones 10.
  const std::string line = "abcdefghijklmnopqrstuvwxyz";
  const LineLayout l = layout(line, line.size(), 2, 10);
  EXPECT_EQ(rows_of(line, l), (std::vector<std::string>{"abcdefgh", "ijklmnopqr", "stuvwxyz"}));
  EXPECT_EQ(l.cursor_row, 2);
  EXPECT_EQ(l.cursor_col, 8);
}

TEST(LineLayout, CursorMovesAcrossRows) {
  const std::string line = "abcdefghijklmnopqrstuvwxyz";
  struct Case {
    size_t glyph;
    int row, col;
  } cases[] = {{0, 0, 2}, {7, 0, 9}, {8, 1, 0}, {9, 1, 1}, {17, 1, 9}, {18, 2, 0}, {25, 2, 7}};
  for (const Case& c : cases) {
    const LineLayout l = layout(line, c.glyph, 2, 10);
    EXPECT_EQ(l.rows(), 3) << c.glyph;
    EXPECT_EQ(l.cursor_row, c.row) << c.glyph;
    EXPECT_EQ(l.cursor_col, c.col) << c.glyph;
  }
}

TEST(LineLayout, CursorAfterAFullRowStartsARowOfItsOwn) {
  const std::string line = "abcdefghijklmnopqr";  // 8 + 10: both rows full
  const LineLayout end = layout(line, line.size(), 2, 10);
  EXPECT_EQ(end.rows(), 3);
  EXPECT_EQ(rows_of(line, end), (std::vector<std::string>{"abcdefgh", "ijklmnopqr", ""}));
  EXPECT_EQ(end.cursor_row, 2);
  EXPECT_EQ(end.cursor_col, 0);
  const LineLayout mid = layout(line, line.size() - 1, 2, 10);  // on the last character: no extra row
  EXPECT_EQ(mid.rows(), 2);
  EXPECT_EQ(mid.cursor_row, 1);
  EXPECT_EQ(mid.cursor_col, 9);
  const LineLayout first = layout("abcdefgh", 8, 2, 10);  // the prompt's row full
  EXPECT_EQ(first.rows(), 2);
  EXPECT_EQ(first.cursor_row, 1);
  EXPECT_EQ(first.cursor_col, 0);
}

TEST(LineLayout, WideCharacterThatDoesNotFitStartsTheNextRow) {
  // "abcdefg" leaves one cell on the prompt's row of 10: 中 (two cells) goes to the next row, then wraps again.
  const std::string zh = "\xe4\xb8\xad";
  std::string line = "abcdefg";
  for (int i = 0; i < 6; ++i) line += zh;
  const LineLayout l = layout(line, line_glyphs(line).size(), 2, 10);
  const std::string five = zh + zh + zh + zh + zh;
  EXPECT_EQ(rows_of(line, l), (std::vector<std::string>{"abcdefg", five, zh}));
  EXPECT_EQ(l.cursor_row, 2);
  EXPECT_EQ(l.cursor_col, 2);
  const LineLayout on_wide = layout(line, 7, 2, 10);  // the cursor on the first 中: the next row's first cell
  EXPECT_EQ(on_wide.cursor_row, 1);
  EXPECT_EQ(on_wide.cursor_col, 0);
}

TEST(LineLayout, CombiningMarkStaysWithItsCharacter) {
  const std::string line = "abcdefgh\xcc\x81z";  // h fills the prompt's row; the accent (no width) stays on it
  const LineLayout l = layout(line, line_glyphs(line).size(), 2, 10);
  EXPECT_EQ(rows_of(line, l), (std::vector<std::string>{"abcdefgh\xcc\x81", "z"}));
  const LineLayout on_mark = layout(line, 8, 2, 10);
  EXPECT_EQ(on_mark.cursor_row, 0);
  EXPECT_LT(on_mark.cursor_col, 10);  // never past the last column
}

TEST(LineLayout, NarrowTerminalAndManyRows) {
  std::string line(1000, 'x');
  const LineLayout l = layout(line, 500, 2, 1);  // taken as prompt + 2 = 4 columns
  EXPECT_EQ(l.rows(), 1 + (1000 - 2 + 3) / 4);
  for (int r = 1; r < l.rows(); ++r) EXPECT_EQ(l.row_begin(r), size_t(2 + 4 * (r - 1))) << r;
  EXPECT_EQ(l.cursor_row, 1 + (500 - 2) / 4);
  EXPECT_EQ(l.cursor_col, (500 - 2) % 4);
  // A newline in a recalled message is drawn as one cell (↵), not as a line break.
  const LineLayout nl = layout("ab\ncd", 5, 2, 80);
  EXPECT_EQ(nl.rows(), 1);
  EXPECT_EQ(nl.cursor_col, 7);
}

TEST(VisibleRows, AllWhenTheyFitElseAWindowWithTheCursor) {
  const std::string line(95, 'x');  // 8 + 10 * 8 + 7: 10 rows of 10 columns
  const LineLayout end = layout(line, line.size(), 2, 10);
  ASSERT_EQ(end.rows(), 10);
  EXPECT_EQ(visible_rows(end, 0).count, 10);  // the screen's height unknown: every row
  EXPECT_EQ(visible_rows(end, 10).count, 10);
  const RowWindow w = visible_rows(end, 4);  // the cursor at the end: the last four rows
  EXPECT_EQ(w.first, 6);
  EXPECT_EQ(w.count, 4);
  const RowWindow top = visible_rows(layout(line, 3, 2, 10), 4);  // the cursor on the first row
  EXPECT_EQ(top.first, 0);
  EXPECT_EQ(top.count, 4);
  const RowWindow mid = visible_rows(layout(line, 50, 2, 10), 4);  // row 5: the window's bottom row
  EXPECT_EQ(mid.first, 2);
  EXPECT_EQ(mid.count, 4);
}

}  // namespace
}  // namespace tern::cli
