#include "engine/text_stream.h"

#include "text/unicode.h"

namespace tern {

TextStream::TextStream(std::vector<std::string> stop_strings) : stops_(std::move(stop_strings)) {}

bool TextStream::push(std::string_view bytes, std::string& out) {
  if (stopped()) return true;
  raw_.append(bytes);
  const size_t complete = utf8_complete_prefix(raw_);
  StopMatcher::Result r = stops_.push(utf8_lossy(std::string_view(raw_).substr(0, complete)));
  raw_.erase(0, complete);
  out += r.text;
  if (r.stopped) raw_.clear();
  return r.stopped;
}

void TextStream::finish(std::string& out) {
  if (stopped()) return;
  out += stops_.flush();
  out += utf8_lossy(raw_);
  raw_.clear();
}

}  // namespace tern
