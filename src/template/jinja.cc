#include "template/jinja.h"

#include "template/jinja_lexer.h"
#include "template/jinja_parser.h"
#include "template/jinja_renderer.h"
#include "util/error.h"

namespace loom {

namespace jinja {
struct Program {
  Body body;
};
}  // namespace jinja

namespace {

// The last line of defence: whatever escapes the interpreter's own checks
// (std::bad_alloc, a library's exception) becomes an Error, never a crash.
template <typename Function>
auto guarded(Function&& function) -> decltype(function()) {
  try {
    return function();
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    fail(ErrorKind::kInvalidArgument, "template: out of memory");
  } catch (const std::exception& error) {
    fail(ErrorKind::kInvalidArgument, "template: {}", error.what());
  }
}

// nlohmann::json to ordered_json without dump() (which throws on invalid
// UTF-8), bounded in depth as the renderer bounds data.
nlohmann::ordered_json to_ordered(const nlohmann::json& value, int depth) {
  if (depth > jinja::kMaxDataDepth)
    fail(ErrorKind::kInvalidArgument, "template context nested deeper than {}", jinja::kMaxDataDepth);
  if (value.is_array()) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const auto& item : value) out.push_back(to_ordered(item, depth + 1));
    return out;
  }
  if (value.is_object()) {
    nlohmann::ordered_json out = nlohmann::ordered_json::object();
    for (const auto& [key, item] : value.items()) out[key] = to_ordered(item, depth + 1);
    return out;
  }
  switch (value.type()) {
    case nlohmann::json::value_t::null: return nullptr;
    case nlohmann::json::value_t::boolean: return value.get<bool>();
    case nlohmann::json::value_t::string: return value.get_ref<const std::string&>();
    case nlohmann::json::value_t::number_integer: return value.get<int64_t>();
    case nlohmann::json::value_t::number_unsigned: return value.get<uint64_t>();
    case nlohmann::json::value_t::number_float: return value.get<double>();
    default: return nullptr;  // binary, discarded
  }
}

}  // namespace

JinjaTemplate::JinjaTemplate(std::string source, JinjaOptions options) : source_(std::move(source)) {
  guarded([&] {
    jinja::LexOptions lex_options{options.trim_blocks, options.lstrip_blocks, options.keep_trailing_newline};
    auto program = std::make_unique<jinja::Program>();
    program->body = jinja::parse(jinja::tokenize(source_, lex_options));
    program_ = std::move(program);
  });
}

JinjaTemplate::~JinjaTemplate() = default;
JinjaTemplate::JinjaTemplate(JinjaTemplate&&) noexcept = default;
JinjaTemplate& JinjaTemplate::operator=(JinjaTemplate&&) noexcept = default;

std::string JinjaTemplate::render(const nlohmann::ordered_json& context) const {
  if (!program_) fail(ErrorKind::kInvalidArgument, "template: render() on a moved-from template");
  return guarded([&] { return jinja::Renderer().render(program_->body, context); });
}

std::string JinjaTemplate::render(const nlohmann::json& context) const {
  if (!program_) fail(ErrorKind::kInvalidArgument, "template: render() on a moved-from template");
  return guarded([&] { return jinja::Renderer().render(program_->body, to_ordered(context, 0)); });
}

}  // namespace loom
