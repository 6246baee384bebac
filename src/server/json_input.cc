#include "server/json_input.h"

#include <vector>

#include <fmt/format.h>

#include "server/api_error.h"
#include "util/error.h"
#include "util/json_nesting.h"

namespace loom::server {
namespace {

using Json = nlohmann::json;

constexpr size_t kMaxMessageBytes = 300;

// nlohmann's text without its "[json.exception.parse_error.101] " prefix and
// the "; last read: '...'" token (raw body bytes, possibly megabytes of them),
// every byte outside printable ASCII as \xNN, cut to kMaxMessageBytes.
std::string safe_parser_message(const std::string& what) {
  std::string text = what;
  if (const size_t prefix_end = text.find("] "); text.rfind("[json.exception.", 0) == 0 && prefix_end != std::string::npos)
    text.erase(0, prefix_end + 2);
  if (const size_t token = text.find("; last read: "); token != std::string::npos) {
    const size_t expected = text.rfind("; expected ");
    text = text.substr(0, token) + (expected != std::string::npos && expected > token ? text.substr(expected) : "");
  }
  std::string safe;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f) safe += c;
    else safe += fmt::format("\\x{:02X}", byte);
    if (safe.size() >= kMaxMessageBytes) {
      safe += "...";
      break;
    }
  }
  return safe;
}

// Builds the value like nlohmann's DOM parser and keeps the path to the value
// being parsed, for errors.
class PathTrackingBuilder {
 public:
  bool null() { return scalar(Json(nullptr)); }
  bool boolean(bool value) { return scalar(Json(value)); }
  bool number_integer(Json::number_integer_t value) { return scalar(Json(value)); }
  bool number_unsigned(Json::number_unsigned_t value) { return scalar(Json(value)); }
  bool number_float(Json::number_float_t value, const Json::string_t&) { return scalar(Json(value)); }
  bool string(Json::string_t& value) { return scalar(Json(std::move(value))); }
  bool binary(Json::binary_t& value) { return scalar(Json::binary(value)); }  // never in JSON text

  bool start_object(size_t) {
    frames_.push_back({add(Json::object()), true});
    return true;
  }
  bool key(Json::string_t& key) {
    frames_.back().key = std::move(key);
    frames_.back().has_key = true;
    return true;
  }
  bool end_object() { return end_container(); }
  bool start_array(size_t) {
    frames_.push_back({add(Json::array()), false});
    return true;
  }
  bool end_array() { return end_container(); }

  bool parse_error(size_t, const std::string&, const Json::exception& error) {
    error_.field = current_path();
    // 406: a number that overflows a double (1e999, -1e999).
    error_.message = error.id == 406 ? std::string("invalid JSON: a number is out of range (numbers must be finite)")
                                     : "invalid JSON: " + safe_parser_message(error.what());
    return false;
  }

  Json& result() { return root_; }
  const JsonSyntaxError& error() const { return error_; }

 private:
  struct Frame {
    Json* container;
    bool is_object;
    std::string key;     // objects: the key whose value is being parsed
    bool has_key = false;
    size_t count = 0;    // arrays: elements completed
  };

  Json* add(Json value) {
    if (frames_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    Frame& parent = frames_.back();
    if (parent.is_object) {
      Json& slot = (*parent.container)[parent.key];  // a repeated key: the last one wins, as in Json::parse
      slot = std::move(value);
      return &slot;
    }
    parent.container->push_back(std::move(value));
    return &parent.container->back();
  }
  // The value in progress in the innermost container is complete.
  void completed() {
    if (frames_.empty()) return;
    Frame& parent = frames_.back();
    if (parent.is_object) parent.has_key = false;
    else ++parent.count;
  }
  bool scalar(Json value) {
    add(std::move(value));
    completed();
    return true;
  }
  bool end_container() {
    frames_.pop_back();
    completed();
    return true;
  }
  std::string current_path() const {
    std::string path;
    for (const Frame& frame : frames_) {
      if (frame.is_object) {
        if (!frame.has_key) break;  // between members: the object itself
        path = field_path(path, frame.key);
      } else {
        path = field_path(path, frame.count);
      }
    }
    return path;
  }

  Json root_;
  std::vector<Frame> frames_;
  JsonSyntaxError error_;
};

}  // namespace

std::string field_path(std::string_view parent, std::string_view key) {
  if (parent.empty()) return std::string(key);
  std::string path(parent);
  path += '.';
  path += key;
  return path;
}

std::string field_path(std::string_view parent, size_t index) { return fmt::format("{}[{}]", parent, index); }

std::optional<Json> parse_json_text(std::string_view text, JsonSyntaxError& error) {
  try {
    check_json_nesting(text, "the body");
  } catch (const Error& nesting) {
    error = {"", nesting.message()};
    return std::nullopt;
  }
  PathTrackingBuilder builder;
  bool parsed = false;
  try {
    parsed = Json::sax_parse(text.data(), text.data() + text.size(), &builder);
  } catch (const Json::exception& failure) {  // not expected with a SAX consumer; never let it escape
    error = {"", "invalid JSON: " + safe_parser_message(failure.what())};
    return std::nullopt;
  }
  if (!parsed) {
    error = builder.error();
    if (error.message.empty()) error.message = "invalid JSON";
    return std::nullopt;
  }
  return std::move(builder.result());
}

Json parse_json_object_body(std::string_view body) {
  JsonSyntaxError error;
  std::optional<Json> json = parse_json_text(body, error);
  if (!json) {
    const std::string message = error.field.empty() ? error.message : fmt::format("'{}': {}", error.field, error.message);
    throw ApiError(400, message, "invalid_request_error", error.field);
  }
  if (!json->is_object()) throw ApiError(400, "the body must be a JSON object");
  return std::move(*json);
}

void check_optional_string(const nlohmann::ordered_json& object, const char* key, const std::string& parent) {
  if (const auto* value = field(object, key); value && !value->is_string())
    throw_bad_request(field_path(parent, key), fmt::format("'{}' must be a string", key));
}

}  // namespace loom::server
