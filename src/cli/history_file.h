// tern run's message history on disk, so that Up recalls messages of earlier sessions (as a shell, Ollama's `run`
// or Python's REPL do).
//
// One message per line, `\` written as `\\` and a newline as `\n` (messages may span lines); UTF-8 as typed. The
// file is private to the user (mode 0600, its folder 0700 when tern makes it). Loading keeps the last `max_entries`
// messages and rewrites a file that grew past twice that. A file that cannot be read or written costs the history
// between sessions, never the session: the first failure is reported once on stderr.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace tern::cli {

// The default place: $TERN_HISTORY_FILE when set (empty: no file), else $XDG_STATE_HOME/tern/run_history, else
// $HOME/.local/state/tern/run_history; empty when none of these is set.
std::string default_history_path();

// One message as one line of the file, and back (decode of a line that encode did not write: its text as is,
// with unknown escapes kept).
std::string encode_history_entry(const std::string& message);
std::string decode_history_entry(const std::string& line);

class HistoryFile {
 public:
  // An empty path: nothing is read or written.
  HistoryFile(std::string path, size_t max_entries);
  // The stored messages, oldest first (at most max_entries).
  std::vector<std::string> load();
  // Appends one message (what LineEditor::add_history kept).
  void append(const std::string& message);
  const std::string& path() const { return path_; }

 private:
  void report(const std::string& what);
  std::string path_;
  size_t max_entries_;
  bool reported_ = false;
};

}  // namespace tern::cli
