#include "cli/line_editor.h"

#include <poll.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "cli/line_layout.h"

namespace tern::cli {
namespace {

constexpr std::string_view kBold = "\x1b[1m", kReset = "\x1b[0m";
constexpr int kEscapeWaitMs = 50;  // after ESC: the rest of a key's sequence arrives at once; a lone ESC does not

bool continuation_byte(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

std::string_view trim_right(std::string_view s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

// ---- MessageLines --------------------------------------------------------------------------------------------

bool MessageLines::add_entered(std::string line) {
  const std::string_view t = trim_right(line);
  if (block_) {
    if (t.size() >= 3 && t.substr(t.size() - 3) == "\"\"\"") {
      lines_.emplace_back(t.substr(0, t.size() - 3));
      if (lines_.back().empty()) lines_.pop_back();  // the closing """ alone on its line
      block_ = false;
      return true;
    }
    lines_.push_back(std::move(line));
    return false;
  }
  if (lines_.empty() && t.substr(0, 3) == "\"\"\"") {
    std::string_view rest = t.substr(3);
    if (rest.size() >= 3 && rest.substr(rest.size() - 3) == "\"\"\"") {  // """one line"""
      lines_.emplace_back(rest.substr(0, rest.size() - 3));
      return true;
    }
    block_ = true;
    if (!rest.empty()) lines_.emplace_back(rest);
    return false;
  }
  if (!t.empty() && t.back() == '\\') {
    lines_.emplace_back(t.substr(0, t.size() - 1));
    return false;
  }
  lines_.push_back(std::move(line));
  return true;
}

std::string MessageLines::text() const {
  std::string out;
  for (size_t i = 0; i < lines_.size(); ++i) {
    if (i) out += '\n';
    out += lines_[i];
  }
  return out;
}

// ---- LineEditor ----------------------------------------------------------------------------------------------

LineEditor::LineEditor(int in_fd, int out_fd) : in_fd_(in_fd), out_fd_(out_fd) {
  have_saved_ = tcgetattr(in_fd_, &saved_) == 0;
}

LineEditor::~LineEditor() {
  if (raw_on_) raw(false);
  if (have_saved_) tcsetattr(in_fd_, TCSAFLUSH, &saved_);
}

void LineEditor::raw(bool on) {
  if (!have_saved_ || raw_on_ == on) return;
  if (on) {
    termios t = saved_;
    t.c_iflag &= ~tcflag_t(BRKINT | ICRNL | INPCK | ISTRIP | IXON);
    t.c_cflag |= CS8;
    t.c_lflag &= ~tcflag_t(ECHO | ICANON | IEXTEN | ISIG);  // Ctrl-C arrives as a byte: it clears the input
    t.c_cc[VMIN] = 1;
    t.c_cc[VTIME] = 0;
    tcsetattr(in_fd_, TCSADRAIN, &t);
    write_out("\x1b[?2004h");  // bracketed paste: pasted text comes between ESC[200~ and ESC[201~
  } else {
    write_out("\x1b[?2004l");
    tcsetattr(in_fd_, TCSADRAIN, &saved_);
  }
  raw_on_ = on;
}

void LineEditor::quiet_input(bool on) {
  if (!have_saved_) return;
  termios t = saved_;
  if (on) t.c_lflag &= ~tcflag_t(ECHO);
  tcsetattr(in_fd_, TCSADRAIN, &t);
}

void LineEditor::write_out(std::string_view s) {
  while (!s.empty()) {
    const ssize_t n = ::write(out_fd_, s.data(), s.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the terminal went away; nothing useful to do
    s.remove_prefix(size_t(n));
  }
}

LineEditor::ScreenSize LineEditor::screen_size() const {
  winsize ws{};
  if (ioctl(out_fd_, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return {ws.ws_col, ws.ws_row};
  return {80, 0};  // not known: 80 columns, rows without limit
}

bool LineEditor::input_waiting() const {
  pollfd p{in_fd_, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

int LineEditor::read_byte(int timeout_ms) {
  for (;;) {
    if (timeout_ms >= 0) {
      pollfd p{in_fd_, POLLIN, 0};
      const int r = poll(&p, 1, timeout_ms);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return -1;
    }
    unsigned char c = 0;
    const ssize_t n = ::read(in_fd_, &c, 1);
    if (n == 1) return c;
    if (n < 0 && errno == EINTR) continue;
    return -1;
  }
}

// Draws the prompt and the line, wrapped onto as many rows as it needs (cli/line_layout.h): back to the row the
// prompt is on, clear from there down, draw the rows, and put the cursor in its cell. Rows are ended by "\r\n"
// rather than left to the terminal's own wrapping, so that a row filled to the last column is no special case.
void LineEditor::refresh() {
  const std::vector<Glyph> gs = line_glyphs(line_);
  size_t cur = 0;  // the cursor's glyph index
  while (cur < gs.size() && gs[cur].begin < cursor_) ++cur;
  const ScreenSize screen = screen_size();
  const int prompt_width = int(prompt_.size());  // prompts are ASCII
  const LineLayout layout = layout_line(gs, cur, prompt_width, screen.columns);
  const RowWindow window = visible_rows(layout, screen.rows);
  std::string out = "\r";
  if (cursor_row_ > 0) out.append("\x1b[").append(std::to_string(cursor_row_)).append("A");
  out += "\x1b[J";  // clears the rows drawn last time, and anything below
  for (int r = window.first; r < window.first + window.count; ++r) {
    if (r > window.first) out += "\r\n";
    if (r == 0) {
      out += kBold;
      out += prompt_;
      out += kReset;
    }
    for (size_t i = layout.row_begin(r); i < layout.row_end(r, gs.size()); ++i)
      out += gs[i].shown.empty() ? std::string_view(line_).substr(gs[i].begin, gs[i].end - gs[i].begin) : gs[i].shown;
  }
  // The cursor: where the drawing ended when it is at the end of the line (the layout gives it a row of its own
  // after a full row); else up from the last row drawn to its own, then to its column.
  if (cur < gs.size()) {
    const int last = window.first + window.count - 1;
    out += "\r";
    if (last > layout.cursor_row) out.append("\x1b[").append(std::to_string(last - layout.cursor_row)).append("A");
    if (layout.cursor_col > 0) out.append("\x1b[").append(std::to_string(layout.cursor_col)).append("C");
  }
  cursor_row_ = layout.cursor_row - window.first;
  write_out(out);
}

void LineEditor::insert(std::string_view s) {
  line_.insert(cursor_, s);
  cursor_ += s.size();
}

void LineEditor::set_line(const std::string& s) {
  line_ = s;
  cursor_ = line_.size();
}

void LineEditor::move_left() {
  while (cursor_ > 0 && continuation_byte(line_[--cursor_])) {
  }
}

void LineEditor::move_right() {
  if (cursor_ >= line_.size()) return;
  ++cursor_;
  while (cursor_ < line_.size() && continuation_byte(line_[cursor_])) ++cursor_;
}

void LineEditor::word_left() {
  while (cursor_ > 0 && line_[cursor_ - 1] == ' ') --cursor_;
  while (cursor_ > 0 && line_[cursor_ - 1] != ' ') --cursor_;
}

void LineEditor::word_right() {
  while (cursor_ < line_.size() && line_[cursor_] == ' ') ++cursor_;
  while (cursor_ < line_.size() && line_[cursor_] != ' ') ++cursor_;
}

void LineEditor::delete_at_cursor() {
  const size_t at = cursor_;
  move_right();
  line_.erase(at, cursor_ - at);
  cursor_ = at;
}

void LineEditor::erase_before(size_t from) {
  line_.erase(from, cursor_ - from);
  cursor_ = from;
}

void LineEditor::history_step(int delta) {
  if (delta < 0 && history_pos_ == 0) return;
  if (delta > 0 && history_pos_ >= history_.size()) return;
  if (history_pos_ == history_.size()) scratch_ = line_;
  history_pos_ = size_t(int64_t(history_pos_) + delta);
  set_line(history_pos_ == history_.size() ? scratch_ : history_[history_pos_]);
}

bool LineEditor::add_history(const std::string& entry) {
  if (entry.empty() || (!history_.empty() && history_.back() == entry)) return false;
  history_.push_back(entry);
  if (history_.size() > kMaxHistory) history_.erase(history_.begin());
  history_pos_ = history_.size();
  return true;
}

// Reads the rest of an escape sequence. Keys it knows move the cursor or the history; any other sequence is
// swallowed whole, so that no ^[[... ever reaches the model. Returns false when the input ended.
bool LineEditor::handle_escape() {
  const int c = read_byte(kEscapeWaitMs);
  if (c < 0) return true;  // a lone ESC: ignored
  if (c == 'b') return word_left(), true;  // Alt-B, Alt-F
  if (c == 'f') return word_right(), true;
  if (c != '[' && c != 'O') return true;
  std::string params;
  int final_byte = -1;
  for (;;) {
    const int b = read_byte(kEscapeWaitMs);
    if (b < 0) return true;
    if (b >= 0x40 && b <= 0x7e) {
      final_byte = b;
      break;
    }
    params += char(b);
    if (params.size() > 16) return true;  // not a sequence we know
  }
  const bool ctrl = params.find(";5") != std::string::npos || params.find(";3") != std::string::npos;
  switch (final_byte) {
    case 'A': history_step(-1); break;
    case 'B': history_step(+1); break;
    case 'C': ctrl ? word_right() : move_right(); break;
    case 'D': ctrl ? word_left() : move_left(); break;
    case 'H': cursor_ = 0; break;
    case 'F': cursor_ = line_.size(); break;
    case '~':
      if (params == "1" || params == "7") cursor_ = 0;
      else if (params == "4" || params == "8") cursor_ = line_.size();
      else if (params == "3") {  // Delete
        delete_at_cursor();
      } else if (params == "200") in_paste_ = true;
      else if (params == "201") in_paste_ = false;
      break;
    default: break;
  }
  return true;
}

LineEditor::Result LineEditor::read(std::string_view prompt, std::string_view continuation) {
  std::fflush(stdout);
  std::fflush(stderr);
  MessageLines message;
  prompt_ = prompt;
  line_.clear();
  cursor_ = 0;
  history_pos_ = history_.size();
  in_paste_ = false;
  cursor_row_ = 0;
  raw(true);
  refresh();
  auto end_line = [&] {  // the edited line scrolls up; a new one starts
    cursor_ = line_.size();
    refresh();
    write_out("\r\n");
    cursor_row_ = 0;
    line_.clear();
    cursor_ = 0;
    prompt_ = continuation;
  };
  for (;;) {
    const int c = read_byte(-1);
    if (c < 0) {  // end of input or an error: whatever was typed is dropped
      end_line();
      raw(false);
      return {Status::end_of_input, {}};
    }
    if (c == '\r' || c == '\n') {
      // A newline with more bytes already waiting behind it is pasted text too (terminals without bracketed paste).
      const bool pasted = in_paste_ || input_waiting();
      std::string line = line_;
      end_line();
      if (pasted) {
        message.add_pasted(std::move(line));
        refresh();
        continue;
      }
      if (message.add_entered(std::move(line))) {
        raw(false);
        return {Status::message, message.text()};
      }
      refresh();
      continue;
    }
    switch (c) {
      case 0x01: cursor_ = 0; break;                 // Ctrl-A
      case 0x02: move_left(); break;                 // Ctrl-B
      case 0x03:                                     // Ctrl-C: drop the input
        cursor_ = line_.size();                      // below every row of a wrapped line
        refresh();
        write_out("^C\r\n");
        raw(false);
        return {Status::interrupted, {}};
      case 0x04:                                     // Ctrl-D: end on an empty input, else delete
        if (line_.empty() && message.empty()) {
          write_out("\r\n");
          raw(false);
          return {Status::end_of_input, {}};
        }
        delete_at_cursor();
        break;
      case 0x05: cursor_ = line_.size(); break;      // Ctrl-E
      case 0x06: move_right(); break;                // Ctrl-F
      case 0x08: case 0x7f: {                        // Backspace
        const size_t end = cursor_;
        move_left();
        line_.erase(cursor_, end - cursor_);
        break;
      }
      case 0x09: insert("    "); break;              // Tab: spaces (a tab's width is the terminal's secret)
      case 0x0b: line_.erase(cursor_); break;        // Ctrl-K
      case 0x0c:                                     // Ctrl-L
        write_out("\x1b[H\x1b[2J");
        cursor_row_ = 0;
        break;
      case 0x0e: history_step(+1); break;            // Ctrl-N
      case 0x10: history_step(-1); break;            // Ctrl-P
      case 0x15: erase_before(0); break;             // Ctrl-U
      case 0x17: {                                   // Ctrl-W
        const size_t end = cursor_;
        word_left();
        line_.erase(cursor_, end - cursor_);
        break;
      }
      case 0x1b:
        if (!handle_escape()) {
          raw(false);
          return {Status::end_of_input, {}};
        }
        break;
      default:
        if (c >= 0x20) insert(std::string(1, char(c)));  // UTF-8 bytes go in one by one; other controls are ignored
        break;
    }
    if (!input_waiting()) refresh();  // a paste is drawn once it is in, not once per byte
  }
}

}  // namespace tern::cli
