#include "cli/history_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

namespace tern::cli {

std::string default_history_path() {
  if (const char* e = std::getenv("TERN_HISTORY_FILE")) return e;
  if (const char* x = std::getenv("XDG_STATE_HOME"); x && *x) return std::string(x) + "/tern/run_history";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.local/state/tern/run_history";
  return {};
}

std::string encode_history_entry(const std::string& message) {
  std::string out;
  out.reserve(message.size());
  for (char c : message) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else out += c;
  }
  return out;
}

std::string decode_history_entry(const std::string& line) {
  std::string out;
  out.reserve(line.size());
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] != '\\' || i + 1 == line.size()) {
      out += line[i];
      continue;
    }
    const char n = line[++i];
    if (n == '\\') out += '\\';
    else if (n == 'n') out += '\n';
    else if (n == 'r') out += '\r';
    else (out += '\\') += n;
  }
  return out;
}

namespace {

// mkdir -p of the folder that holds `path` (mode 0700 for what it makes); false with errno set.
bool make_parent_dirs(const std::string& path) {
  for (size_t i = 1; i < path.size(); ++i) {
    if (path[i] != '/') continue;
    const std::string dir = path.substr(0, i);
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return false;
  }
  return true;
}

}  // namespace

HistoryFile::HistoryFile(std::string path, size_t max_entries) : path_(std::move(path)), max_entries_(max_entries) {}

void HistoryFile::report(const std::string& what) {
  if (reported_) return;
  reported_ = true;
  std::fprintf(stderr, "tern run: history not kept between sessions: %s %s: %s\n", what.c_str(), path_.c_str(),
               std::strerror(errno));
}

std::vector<std::string> HistoryFile::load() {
  std::vector<std::string> lines;
  if (path_.empty()) return lines;
  std::ifstream in(path_, std::ios::binary);
  if (!in) {
    if (errno != ENOENT) report("cannot read");
    return lines;
  }
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();  // a file edited elsewhere with CRLF ends (we write \r escaped)
    if (!line.empty()) lines.push_back(std::move(line));
  }
  const size_t total = lines.size();
  if (total > max_entries_) lines.erase(lines.begin(), lines.end() - std::ptrdiff_t(max_entries_));
  if (total > 2 * max_entries_) {  // keep the file bounded: rewrite it with what was kept (atomically)
    // A temporary name of its own (two sessions starting at once must not share one). A message another session
    // appends between the read above and the rename is lost: history, not data.
    std::string tmp = path_ + ".XXXXXX";
    const int fd = ::mkostemp(tmp.data(), O_CLOEXEC);  // mode 0600
    bool ok = fd >= 0;
    for (size_t i = 0; ok && i < lines.size(); ++i) {
      const std::string l = lines[i] + "\n";
      ok = ::write(fd, l.data(), l.size()) == ssize_t(l.size());
    }
    if (fd >= 0) ok = (::close(fd) == 0) && ok;
    if (!ok || ::rename(tmp.c_str(), path_.c_str()) != 0) {
      report("cannot rewrite");
      ::unlink(tmp.c_str());
    }
  }
  std::vector<std::string> out;
  out.reserve(lines.size());
  for (const std::string& l : lines) out.push_back(decode_history_entry(l));
  return out;
}

void HistoryFile::append(const std::string& message) {
  if (path_.empty() || message.empty()) return;
  if (!make_parent_dirs(path_)) return report("cannot make the folder of");
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return report("cannot open");
  const std::string line = encode_history_entry(message) + "\n";
  const bool ok = ::write(fd, line.data(), line.size()) == ssize_t(line.size());  // one write: whole lines
  if (::close(fd) != 0 || !ok) report("cannot write");
}

}  // namespace tern::cli
