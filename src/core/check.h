// Checks that stay on in release builds. One family, defined once.
//
//   TERN_CHECK(cond, "message with {} ...")   -> throws tern::Error with file:line
//   TERN_FAIL("message")                       -> always throws
//
// Bad input (a checkpoint, a request, a flag) is reported by throwing tern::Error; the CLI prints the message and
// exits with status 1. Nothing here aborts the process.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace tern {

// The one exception type for user-visible failures. what() is the message a person reads.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void fail_at(const char* file, int line, const std::string& message);

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream s;
  (s << ... << std::forward<Args>(args));
  return s.str();
}
}  // namespace detail

}  // namespace tern

// TERN_CHECK(cond, parts...): parts are streamed together into the message.
#define TERN_CHECK(cond, ...)                                                        \
  do {                                                                               \
    if (!(cond)) [[unlikely]]                                                        \
      ::tern::fail_at(__FILE__, __LINE__, ::tern::detail::concat(__VA_ARGS__));      \
  } while (0)

#define TERN_FAIL(...) ::tern::fail_at(__FILE__, __LINE__, ::tern::detail::concat(__VA_ARGS__))
