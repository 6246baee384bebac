// JSON text for clients that never throws: strings from users, files or the
// tokenizer may hold invalid UTF-8, which nlohmann's strict dump() would throw
// on; here such bytes become U+FFFD.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace loom::server {

inline std::string dump_json(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace loom::server
