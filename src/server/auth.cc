#include "server/auth.h"

namespace loom::server {

bool api_key_matches(std::string_view authorization_header_value, std::string_view api_key) {
  static constexpr std::string_view kScheme = "Bearer ";
  const std::string_view value = authorization_header_value;
  const size_t expected_size = kScheme.size() + api_key.size();
  // volatile: the compiler may not turn the loop into an early-exit compare.
  volatile unsigned difference = value.size() == expected_size ? 0u : 1u;
  for (size_t i = 0; i < expected_size; ++i) {
    const char expected = i < kScheme.size() ? kScheme[i] : api_key[i - kScheme.size()];
    const char guess = value.empty() ? '\0' : value[i % value.size()];
    difference = difference | static_cast<unsigned char>(expected ^ guess);
  }
  return difference == 0;
}

}  // namespace loom::server
