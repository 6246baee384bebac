// Typed errors for bad input. Internal invariants use assert/LOOM_CHECK instead.
//
// Every error that a user can cause (a corrupt file, an unknown adapter, a bad
// flag) is a loom::Error with a kind and, where it helps, a hint. The API edge
// (CLI, HTTP server) turns the kind into an exit code or an HTTP status.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace loom {

enum class ErrorKind {
  kInvalidArgument,  // a request or flag that cannot be served as given
  kNotFound,         // a file, tensor, adapter or model that does not exist
  kFormat,           // a file that exists but is malformed, truncated or inconsistent
  kUnsupported,      // well-formed but not handled (architecture, quantization, dtype)
  kCapacity,         // over a configured limit (context length, memory, queue length)
  kCancelled,        // the caller cancelled the request (its stream dropped or cancel())
  kUnavailable,      // the service is going away (shutting down): retry elsewhere
  kInternal,         // a bug: an invariant broke at run time
};

const char* error_kind_name(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message, std::string hint = {})
      : std::runtime_error(hint.empty() ? message : message + " (hint: " + hint + ")"),
        kind_(kind), message_(std::move(message)), hint_(std::move(hint)) {}

  ErrorKind kind() const { return kind_; }
  const std::string& message() const { return message_; }
  const std::string& hint() const { return hint_; }

 private:
  ErrorKind kind_;
  std::string message_;
  std::string hint_;
};

// Throws loom::Error(kind, fmt::format(...)).
template <typename... Args>
[[noreturn]] void fail(ErrorKind kind, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(kind, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace loom

// Invariant check that stays on in release builds; a failure is a bug in Loom.
#define LOOM_CHECK(condition)                                                              \
  do {                                                                                     \
    if (!(condition))                                                                      \
      ::loom::fail(::loom::ErrorKind::kInternal, "invariant failed: {} at {}:{}", #condition, \
                   __FILE__, __LINE__);                                                    \
  } while (0)
