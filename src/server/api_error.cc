#include "server/api_error.h"

#include <nlohmann/json.hpp>

namespace loom::server {

std::string ApiError::body() const {
  nlohmann::json error = {{"message", message_}, {"type", type_}, {"param", nullptr}, {"code", nullptr}};
  if (!param_.empty()) error["param"] = param_;
  if (!code_.empty()) error["code"] = code_;
  return nlohmann::json{{"error", error}}.dump();
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
    case ErrorKind::kInternal:
      return ApiError(500, error.what(), "server_error", param, "internal_error");
    default:
      return ApiError(400, error.what(), "invalid_request_error", param);
  }
}

}  // namespace loom::server
