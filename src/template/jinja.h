// A Jinja2 template interpreter for Hugging Face chat templates.
//
// Covers the language chat templates use (jinja2 3.1 semantics, rendered as
// transformers' apply_chat_template does): {{ }}, {% %}, {# #}, whitespace
// control, raw; if/elif/else, for (else, loop.*, unpacking, "if" filter,
// break/continue), set (names, tuples, namespace attributes, blocks), macro
// and call blocks, filter blocks, {% generation %}; jinja2's operators, tests
// and the filters and Python str/dict methods that templates call; globals
// range, namespace, dict, raise_exception(message), strftime_now(format).
// Not supported (a syntax error): extends/block/include/import, recursive
// loops, autoescape.
//
// Values are JSON (nlohmann::ordered_json: object keys keep their order, so
// tojson prints them as given, as transformers' tojson does) plus Undefined,
// namespace objects and macros. Undefined follows jinja2's default Undefined:
// it prints as "", is false, iterates as empty, has length 0, and
// `is defined` is false for it; calling it or a method on it is an error.
// Unlike jinja2, an attribute or item of Undefined is Undefined (jinja2
// raises), so `{{ a.b.c }}` with `a` missing renders "".
//
// Example:
//   JinjaTemplate chat_template(source);  // parse once
//   std::string prompt = chat_template.render({{"messages", messages}, {"add_generation_prompt", true}});
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace loom {

namespace jinja {
struct Program;
}

struct JinjaOptions {
  // transformers renders chat templates with both on (jinja2's own default is off).
  bool trim_blocks = true;     // drop the first newline after a block or comment tag
  bool lstrip_blocks = true;   // drop spaces and tabs before a block or comment tag at a line's start
  bool keep_trailing_newline = false;  // jinja2's default: one trailing newline of the source is dropped
};

// An immutable parsed template. Thread-safe: render() may run on several
// threads at once (each render owns all of its run-time state).
class JinjaTemplate {
 public:
  // Parses once; throws Error(ErrorKind::kInvalidArgument, "template line N: ...")
  // on a syntax error (unknown tag, unclosed block, bad expression) and on
  // nesting deeper than the parser's limit; never anything but Error
  // ("template: ..." for what has no line, such as running out of memory).
  explicit JinjaTemplate(std::string source, JinjaOptions options = {});
  ~JinjaTemplate();
  JinjaTemplate(JinjaTemplate&&) noexcept;
  JinjaTemplate& operator=(JinjaTemplate&&) noexcept;

  // Renders with `context`'s keys as variables (context must be an object,
  // nested at most 128 deep). Throws Error(kInvalidArgument, "template line N: ...")
  // on an evaluation error (an undefined function, a bad operand, a filter's
  // bad argument, integer overflow), for raise_exception(message), whose
  // message it includes, and when the render exceeds its limits (1M steps,
  // 64 MiB per value and for the output, 1 GiB built in all, nesting);
  // Error(kInvalidArgument, "template...") for a bad context, a moved-from
  // template or anything else (out of memory). Never throws anything else.
  std::string render(const nlohmann::ordered_json& context) const;
  // The same for nlohmann::json, whose objects keep keys sorted: tojson then
  // prints keys in sorted order, not the request's.
  std::string render(const nlohmann::json& context) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::unique_ptr<const jinja::Program> program_;
};

}  // namespace loom
