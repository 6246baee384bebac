// API key check for `--api-key`.
#pragma once

#include <string_view>

namespace loom::server {

// Whether an Authorization header value is exactly "Bearer <api_key>".
//
// Constant time in the guess: every byte of the expected text is compared
// (the guess is read cyclically, so a short or long guess does the same work)
// and the differences are OR-ed together, with no exit at the first mismatch.
// The running time depends on the key's length only; the key's length is the
// one thing a timing attacker could learn, which is accepted (as in most
// servers) since a key must be long enough to resist guessing anyway.
// Any thread.
bool api_key_matches(std::string_view authorization_header_value, std::string_view api_key);

}  // namespace loom::server
