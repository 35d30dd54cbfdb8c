// Stop strings over streamed text: passes text through, holding back only a tail that could still grow into a
// stop string; on the first complete stop string it returns the text before it and reports stopped. The stop
// string itself is never returned, whichever way it is split across pushes.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tern {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);  // empty strings are ignored

  struct Result {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string was completed; nothing more will be emitted
  };
  Result push(std::string_view text);
  std::string flush();  // the held-back tail (empty once stopped)

  bool stopped() const { return stopped_; }
  const std::string& matched_stop() const { return matched_; }  // the stop string that ended the text

 private:
  std::vector<std::string> stops_;
  std::string held_;
  std::string matched_;
  bool stopped_ = false;
};

}  // namespace tern
