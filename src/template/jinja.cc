#include "template/jinja.h"

#include "template/jinja_lexer.h"
#include "template/jinja_parser.h"
#include "template/jinja_renderer.h"

namespace loom {

namespace jinja {
struct Program {
  Body body;
};
}  // namespace jinja

JinjaTemplate::JinjaTemplate(std::string source, JinjaOptions options) : source_(std::move(source)) {
  jinja::LexOptions lex_options{options.trim_blocks, options.lstrip_blocks, options.keep_trailing_newline};
  auto program = std::make_unique<jinja::Program>();
  program->body = jinja::parse(jinja::tokenize(source_, lex_options));
  program_ = std::move(program);
}

JinjaTemplate::~JinjaTemplate() = default;
JinjaTemplate::JinjaTemplate(JinjaTemplate&&) noexcept = default;
JinjaTemplate& JinjaTemplate::operator=(JinjaTemplate&&) noexcept = default;

std::string JinjaTemplate::render(const nlohmann::ordered_json& context) const {
  return jinja::Renderer().render(program_->body, context);
}

std::string JinjaTemplate::render(const nlohmann::json& context) const {
  return render(nlohmann::ordered_json::parse(context.dump()));
}

}  // namespace loom
