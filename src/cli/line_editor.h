// A small line editor for `tern run` on a terminal (raw termios, no library): left/right (by character and, with
// Ctrl or Alt, by word), Home/End, Backspace/Delete, Up/Down history, Ctrl-A/E/B/F/K/U/W/L/P/N, Ctrl-C clears the
// input, Ctrl-D on an empty input ends. One line is edited at a time; a line longer than the terminal is wide wraps
// onto more rows (cli/line_layout.h), and the cursor moves across them.
//
// A message may span lines: a line ending in a backslash continues on the next, a first line starting with """
// opens a block that a line ending with """ closes, and pasted text keeps its newlines (bracketed paste, or bytes
// already waiting behind a newline). Finished lines scroll up out of editing; history entries hold whole messages,
// their newlines shown as ↵ when recalled.
#pragma once

#include <termios.h>

#include <string>
#include <string_view>
#include <vector>

namespace tern::cli {

// The lines of one message as they are entered, and the rules that say when the message is complete.
class MessageLines {
 public:
  // A line ended by Enter: true when the message is complete (text() then holds it).
  bool add_entered(std::string line);
  // A line ended by a newline inside pasted text: the message always goes on.
  void add_pasted(std::string line) { lines_.push_back(std::move(line)); }
  bool empty() const { return lines_.empty(); }
  bool in_block() const { return block_; }
  std::string text() const;
  void clear() { lines_.clear(); block_ = false; }

 private:
  std::vector<std::string> lines_;
  bool block_ = false;  // inside a """ block
};

class LineEditor {
 public:
  enum class Status { message, interrupted, end_of_input };
  struct Result {
    Status status;
    std::string text;  // the message (Status::message)
  };

  LineEditor(int in_fd, int out_fd);
  ~LineEditor();
  LineEditor(const LineEditor&) = delete;
  LineEditor& operator=(const LineEditor&) = delete;

  // Reads one message. `prompt` and `continuation` are shown in bold before the first and the following lines.
  Result read(std::string_view prompt, std::string_view continuation);
  // Adds a message to the history (not empty ones, not a repeat of the last: false); the oldest go beyond
  // kMaxHistory.
  static constexpr size_t kMaxHistory = 1000;
  bool add_history(const std::string& entry);

  // While an answer streams: the terminal does not echo what is typed (it waits for the next prompt), and Ctrl-C
  // raises SIGINT as usual.
  void quiet_input(bool on);

 private:
  void raw(bool on);
  int read_byte(int timeout_ms);  // -1: nothing in time or end of input
  bool handle_escape();           // after ESC; false when the input ended
  void refresh();
  void write_out(std::string_view s);
  struct ScreenSize {
    int columns, rows;  // rows 0: not known
  };
  ScreenSize screen_size() const;
  bool input_waiting() const;  // bytes are ready to read now
  void insert(std::string_view s);
  void set_line(const std::string& s);
  void move_left();
  void move_right();
  void word_left();
  void word_right();
  void erase_before(size_t from);  // erases [from, cursor_)
  void delete_at_cursor();
  void history_step(int delta);

  int in_fd_, out_fd_;
  termios saved_{};
  bool have_saved_ = false, raw_on_ = false;
  std::vector<std::string> history_;
  size_t history_pos_ = 0;
  std::string scratch_;  // the line being typed when the user went up into the history
  std::string line_;     // the line being edited (UTF-8)
  size_t cursor_ = 0;    // byte offset into line_, on a character boundary
  std::string prompt_;
  int cursor_row_ = 0;   // the terminal row of the cursor, counted from the row the prompt was last drawn on
  bool in_paste_ = false;
};

}  // namespace tern::cli
