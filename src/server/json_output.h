// JSON text for clients that never throws: strings from users, files or the
// tokenizer may hold invalid UTF-8 (a token can end inside a character; an
// adapter name can come from argv), which nlohmann's strict dump() throws on;
// here such bytes become U+FFFD. Every JSON body, SSE event and error body the
// server sends is written with dump_json.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace loom::server {

inline std::string dump_json(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace loom::server
