// OpenAI-style API errors: {"error": {"message", "type", "param", "code"}} with
// an HTTP status. Everything a client can get wrong becomes an ApiError thrown
// by the parsing code and turned into a response by the HTTP layer.
#pragma once

#include <stdexcept>
#include <string>

#include "util/error.h"

namespace loom::server {

class ApiError : public std::runtime_error {
 public:
  // `type` follows OpenAI ("invalid_request_error", "authentication_error",
  // "server_error"); `param` names the offending field ("" for none).
  ApiError(int status, std::string message, std::string type = "invalid_request_error", std::string param = {},
           std::string code = {})
      : std::runtime_error(message), status_(status), message_(std::move(message)), type_(std::move(type)),
        param_(std::move(param)), code_(std::move(code)) {}

  int status() const { return status_; }
  const std::string& message() const { return message_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  // Seconds for a Retry-After header (503 only; 0 = no header).
  int retry_after_seconds() const { return status_ == 503 ? 1 : 0; }

  // The JSON body (param/code null when empty). Never throws on content:
  // invalid UTF-8 in the message or param becomes U+FFFD (dump_json).
  std::string body() const;

 private:
  int status_;
  std::string message_, type_, param_, code_;
};

// 400 invalid_request_error, with the offending field.
[[noreturn]] void throw_bad_request(const std::string& param, const std::string& message);

// Maps an engine/loader error: kNotFound -> 404, kCapacity -> 503 (queue full;
// context overflow is caught before submit and gets 400), kUnavailable -> 503
// server_shutting_down (the engine is shutting down), kInternal -> 500
// with the generic message "internal error" (the detail is logged, never sent),
// anything else (kCancelled included) -> 400.
ApiError api_error_from(const Error& error, const std::string& param = {});

}  // namespace loom::server
