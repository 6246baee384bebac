// API key check for `--api-key`.
#pragma once

#include <string_view>

namespace loom::server {

// Whether an Authorization header value is "Bearer <api_key>". Takes the same
// time whatever the bytes of the guess (no early exit at the first difference).
bool api_key_matches(std::string_view authorization_header_value, std::string_view api_key);

}  // namespace loom::server
