#include "server/api_error.h"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "server/json_output.h"

namespace loom::server {

std::string ApiError::body() const {
  nlohmann::json error = {{"message", message_}, {"type", type_}, {"param", nullptr}, {"code", nullptr}};
  if (!param_.empty()) error["param"] = param_;
  if (!code_.empty()) error["code"] = code_;
  return dump_json(nlohmann::json{{"error", error}});
}

void throw_bad_request(const std::string& param, const std::string& message) {
  throw ApiError(400, message, "invalid_request_error", param);
}

ApiError api_error_from(const Error& error, const std::string& param) {
  switch (error.kind()) {
    case ErrorKind::kNotFound:
      return ApiError(404, error.what(), "invalid_request_error", param, "not_found");
    case ErrorKind::kCapacity:
      return ApiError(503, error.what(), "server_error", param, "server_busy");
    case ErrorKind::kUnavailable:
      return ApiError(503, error.what(), "server_error", param, "server_shutting_down");
    case ErrorKind::kInternal:
      // A broken invariant: the detail is for the log, not for clients.
      spdlog::error("internal error: {}", error.what());
      return ApiError(500, "internal error", "server_error", param, "internal_error");
    default:
      return ApiError(400, error.what(), "invalid_request_error", param);
  }
}

}  // namespace loom::server
