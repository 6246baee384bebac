#include "toolcall/call_format_util.h"

#include <nlohmann/json.hpp>

#include "util/json_nesting.h"

namespace loom::toolcall {
namespace {

using Json = nlohmann::ordered_json;  // arguments keep the order the model wrote them in

// Strings inside parsed values are valid UTF-8 (the parser refuses anything
// else), so this dump cannot meet bytes to replace; replace anyway, never throw.
std::string compact(const Json& value) { return value.dump(-1, ' ', false, Json::error_handler_t::replace); }

// Nesting is bounded first: dumping and destroying values recurse.
std::optional<Json> parse_json(std::string_view text) {
  if (json_nesting_depth(text) > kMaxJsonNesting) return std::nullopt;
  Json value = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return std::nullopt;
  return value;
}

}  // namespace

size_t skip_spaces(std::string_view text, size_t from) {
  while (from < text.size() && is_space(text[from])) ++from;
  return from;
}

size_t trailing_spaces_start(std::string_view text, size_t from, size_t end) {
  while (end > from && is_space(text[end - 1])) --end;
  return end;
}

bool is_proper_prefix_at(std::string_view text, size_t from, std::string_view marker) {
  const std::string_view rest = text.substr(from);
  return rest.size() < marker.size() && marker.substr(0, rest.size()) == rest;
}

size_t partial_marker_start(std::string_view text, size_t from, std::string_view marker) {
  const size_t first = text.size() >= marker.size() ? text.size() - marker.size() + 1 : 0;
  for (size_t position = std::max(from, first); position < text.size(); ++position)
    if (is_proper_prefix_at(text, position, marker)) return position;
  return text.size();
}

std::optional<std::string> parse_arguments_object(std::string_view json_text) {
  const std::optional<Json> value = parse_json(json_text);
  if (!value || !value->is_object()) return std::nullopt;
  return compact(*value);
}

std::optional<CallText> parse_call_object(std::string_view json_text) {
  const std::optional<Json> value = parse_json(json_text);
  if (!value || !value->is_object()) return std::nullopt;
  const auto name = value->find("name");
  if (name == value->end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return std::nullopt;
  CallText call{name->get<std::string>(), "{}"};
  auto arguments = value->find("arguments");
  if (arguments == value->end()) arguments = value->find("parameters");
  if (arguments == value->end() || arguments->is_null()) return call;
  if (arguments->is_object()) {
    call.arguments = compact(*arguments);
  } else if (arguments->is_string()) {  // some models write the arguments as a JSON string
    std::optional<std::string> text = parse_arguments_object(arguments->get_ref<const std::string&>());
    if (!text) return std::nullopt;
    call.arguments = std::move(*text);
  } else {
    return std::nullopt;
  }
  return call;
}

}  // namespace loom::toolcall
