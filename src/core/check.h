// Checks that stay on in release builds. One family, defined once.
//
//   TERN_CHECK(cond, "message with {} ...")   -> throws tern::Error with file:line
//   TERN_FAIL("message")                       -> always throws
//   TERN_INTERNAL_CHECK(cond, "...")           -> throws tern::InternalError with file:line
//   TERN_INTERNAL_FAIL("...")                  -> always throws tern::InternalError
//
// Bad input (a checkpoint, a request, a flag) is reported by throwing tern::Error; the CLI prints the message and
// exits with status 1. A fault of the program or the device itself (a CUDA error, a broken engine invariant) is a
// tern::InternalError: the CLI reports it the same way, the server answers it with 500 and logs it (a plain
// tern::Error raised while serving a request is the request's fault: 400). Nothing here aborts the process.
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

// A fault that is not the input's: the device failed, or an invariant of the engine broke.
class InternalError : public Error {
 public:
  using Error::Error;
};

[[noreturn]] void fail_at(const char* file, int line, const std::string& message);           // throws Error
[[noreturn]] void internal_fail_at(const char* file, int line, const std::string& message);  // throws InternalError

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

// The same for faults of the program or the device (tern::InternalError).
#define TERN_INTERNAL_CHECK(cond, ...)                                                      \
  do {                                                                                      \
    if (!(cond)) [[unlikely]]                                                               \
      ::tern::internal_fail_at(__FILE__, __LINE__, ::tern::detail::concat(__VA_ARGS__));    \
  } while (0)

#define TERN_INTERNAL_FAIL(...) ::tern::internal_fail_at(__FILE__, __LINE__, ::tern::detail::concat(__VA_ARGS__))
