#include "server/kv_auth.h"

#include <chrono>
#include <charconv>

#include <fmt/format.h>

#include "kvtransfer/kv_link_crypto.h"

namespace loom::server {

namespace {

std::string signature_tag(std::string_view secret, std::string_view method, std::string_view path,
                          std::string_view body, std::string_view seconds) {
  const std::string body_digest = kvlink::to_hex(kvlink::sha256(kvlink::as_bytes(body)));
  const std::string text = fmt::format("loom kv http 1\n{}\n{}\n{}\n{}", method, path, seconds, body_digest);
  return kvlink::to_hex(kvlink::hmac_sha256(kvlink::as_bytes(secret), {kvlink::as_bytes(text)}));
}

}  // namespace

std::string sign_kv_request(std::string_view secret, std::string_view method, std::string_view path,
                            std::string_view body, int64_t unix_seconds) {
  const std::string seconds = std::to_string(unix_seconds);
  return fmt::format("1 {} {}", seconds, signature_tag(secret, method, path, body, seconds));
}

bool kv_request_signed(std::string_view secret, std::string_view method, std::string_view path, std::string_view body,
                       std::string_view header_value, int64_t now_seconds) {
  if (header_value.substr(0, 2) != "1 ") return false;
  const std::string_view rest = header_value.substr(2);
  const size_t space = rest.find(' ');
  if (space == std::string_view::npos || space == 0 || space > 19) return false;
  const std::string_view seconds = rest.substr(0, space);
  int64_t when = 0;
  const auto [end, error] = std::from_chars(seconds.data(), seconds.data() + seconds.size(), when);
  if (error != std::errc() || end != seconds.data() + seconds.size()) return false;
  if (when < now_seconds - kKvAuthMaxSkewSeconds || when > now_seconds + kKvAuthMaxSkewSeconds) return false;
  const std::string expected = signature_tag(secret, method, path, body, seconds);
  return kvlink::constant_time_equal(kvlink::as_bytes(expected), kvlink::as_bytes(rest.substr(space + 1)));
}

int64_t unix_seconds_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace loom::server
