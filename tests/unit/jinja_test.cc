// The Jinja interpreter (src/template) against Python's jinja2, set up as
// transformers' apply_chat_template sets it up: tests/fixtures/template/
// jinja_cases.json (from scripts/make_jinja_fixtures.py) holds one case per
// construct and the three chat templates of that folder (ChatML with tools,
// Llama-3.1 with ipython tools, Mistral [INST]) on several conversations.
// The tests below the fixture cover what jinja2 cannot produce: error lines,
// options, Loom's deliberate differences and limits.
#include <pthread.h>

#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "template/jinja.h"
#include "test_util.h"
#include "util/error.h"

namespace loom {
namespace {

using Json = nlohmann::ordered_json;

std::string read_text(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  EXPECT_TRUE(file.good()) << path;
  std::stringstream buffer;
  buffer << file.rdbuf();
  return buffer.str();
}

Json fixture_cases() {
  return Json::parse(read_text(test::fixture_path("template/jinja_cases.json"))).at("cases");
}

std::string render(const std::string& source, const Json& context = Json::object(), JinjaOptions options = {}) {
  return JinjaTemplate(source, options).render(context);
}

// The message of the Error that `source` throws when parsed and rendered.
std::string error_of(const std::string& source, const Json& context = Json::object()) {
  try {
    render(source, context);
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kInvalidArgument) << error.what();
    return error.message();
  }
  ADD_FAILURE() << "no error for: " << source;
  return {};
}

void run_fixture_cases(const std::string& name_prefix, int* num_run) {
  for (const auto& test_case : fixture_cases()) {
    std::string name = test_case.at("name");
    if (name.rfind(name_prefix, 0) != 0) continue;
    SCOPED_TRACE(name);
    std::string source = test_case.at("template");
    if (source[0] == '@') source = read_text(test::fixture_path("template/" + source.substr(1)));
    JinjaOptions options;
    if (test_case.contains("trim_blocks")) options.trim_blocks = options.lstrip_blocks = test_case["trim_blocks"].get<bool>();
    ++*num_run;
    if (test_case.contains("expected")) {
      try {
        EXPECT_EQ(render(source, test_case.at("context"), options), test_case["expected"].get<std::string>());
      } catch (const Error& error) {
        ADD_FAILURE() << error.what();
      }
      continue;
    }
    std::string message = error_of(source, test_case.at("context"));
    EXPECT_EQ(message.rfind("template line ", 0), 0u) << message;
    if (test_case.at("message_matches").get<bool>()) {
      EXPECT_NE(message.find(test_case["error"].get<std::string>()), std::string::npos) << message;
    }
  }
}

TEST(JinjaTest, ConstructsRenderAsJinja2Does) {
  int num_run = 0;
  run_fixture_cases("", &num_run);
  EXPECT_GE(num_run, 80);
}

TEST(JinjaTest, ChatTemplatesRenderAsTransformersDoes) {
  int num_run = 0;
  for (const char* prefix : {"chatml_tools/", "llama31_tools/", "mistral_inst/"}) run_fixture_cases(prefix, &num_run);
  EXPECT_EQ(num_run, 17);
}

TEST(JinjaTest, SyntaxErrorsNameTheLine) {
  EXPECT_EQ(error_of("a\n{% if x %}\nno end"), "template line 3: unexpected end of template: expected '{% endif %}'");
  EXPECT_EQ(error_of("a\n\n{% frobnicate %}"), "template line 3: unknown tag 'frobnicate'");
  EXPECT_EQ(error_of("{{ 1 +\n\n }}"), "template line 3: unexpected '}}'");
  EXPECT_EQ(error_of("line\n{{ x"), "template line 2: missing '}}'");
  EXPECT_EQ(error_of("{# open"), "template line 1: missing end of comment tag");
  EXPECT_EQ(error_of("x\n{{ 'open }}"), "template line 2: unterminated string");
  EXPECT_EQ(error_of("{% break %}"), "template line 1: 'break' outside of a loop");
  EXPECT_EQ(error_of("{% for x in y %}{% endif %}"), "template line 1: unknown tag 'endif'");
  EXPECT_EQ(error_of("{% include 'other.jinja' %}"), "template line 1: unknown tag 'include'");
  EXPECT_EQ(error_of("{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}"),
            "template line 1: expression nested too deeply");
}

TEST(JinjaTest, EvaluationErrorsNameTheLine) {
  EXPECT_EQ(error_of("ok\n{{ raise_exception('Bad role: ' ~ role) }}", {{"role", "robot"}}),
            "template line 2: Bad role: robot");
  EXPECT_EQ(error_of("\n\n{{ missing.strip() }}"), "template line 3: 'missing' is undefined");
  EXPECT_EQ(error_of("{{ x }}\n{{ 'a' + 1 }}", {{"x", 1}}),
            "template line 2: unsupported operand type(s) for +: 'str' and 'int'");
  EXPECT_EQ(error_of("{% for m in messages %}\n{{ m.content.strip() }}{% endfor %}", {{"messages", {Json::object()}}}),
            "template line 2: 'content' is undefined");
  EXPECT_EQ(error_of("{{ 1 | no_such_filter }}"), "template line 1: no filter named 'no_such_filter'");
  EXPECT_EQ(error_of("{{ 1 is no_such_test }}"), "template line 1: no test named 'no_such_test'");
  EXPECT_EQ(error_of("{{ x }}", Json::array()), "template context must be a JSON object");
  EXPECT_EQ(error_of("{{ 1 // 0 }}"), "template line 1: integer division or modulo by zero");
  EXPECT_EQ(error_of("{{ undefined_function(1) }}"), "template line 1: 'undefined_function' is undefined");
  EXPECT_EQ(error_of("{% set d = {} %}{% set d.x = 1 %}"), "template line 1: cannot assign attribute on non-namespace object 'd'");
  EXPECT_EQ(error_of("{% for a, b in [[1, 2, 3]] %}{% endfor %}"), "template line 1: cannot unpack [1, 2, 3] into 2 names");
  EXPECT_EQ(error_of("{{ range(1000000) | length }}"), "template line 1: range too big");
  EXPECT_EQ(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
            "template line 1: macro calls nested deeper than 64");
}

TEST(JinjaTest, IntegerArithmeticOverflowIsAnError) {  // used to trap (SIGFPE) or overflow silently
  std::string min = "(-9223372036854775807 - 1)";
  EXPECT_EQ(error_of("{{ " + min + " // -1 }}"), "template line 1: integer overflow");
  EXPECT_EQ(render("{{ " + min + " % -1 }}"), "0");
  EXPECT_EQ(render("{{ " + min + " is divisibleby(-1) }}"), "True");
  EXPECT_EQ(error_of("{{ 9223372036854775807 + 1 }}"), "template line 1: integer overflow");
  EXPECT_EQ(error_of("{{ " + min + " - 1 }}"), "template line 1: integer overflow");
  EXPECT_EQ(error_of("{{ 4294967296 * 4294967296 }}"), "template line 1: integer overflow");
  EXPECT_EQ(error_of("{{ -" + min + " }}"), "template line 1: integer overflow");
  EXPECT_EQ(error_of("{{ " + min + " | abs }}"), "template line 1: integer overflow");
  EXPECT_EQ(error_of("{{ 2 ** 64 }}"), "template line 1: integer overflow");
  EXPECT_EQ(error_of("{{ 1e300 | int }}"), "template line 1: integer overflow");
  EXPECT_EQ(render("{{ '1e300' | int }} {{ -2.5 | int }}"), "0 -2");  // jinja2's default on a failed conversion
  EXPECT_EQ(render("{{ 2 ** 62 }} {{ 1 ** 9223372036854775807 }} {{ -7 // 2 }} {{ -7 % 2 }} {{ 7 % -2 }}"),
            "4611686018427387904 1 -4 1 -1");
  EXPECT_EQ(render("{{ range(9223372036854775800, 9223372036854775807, 5) | list }}"),
            "[9223372036854775800, 9223372036854775805]");
  EXPECT_EQ(render("{{ range(-9223372036854775800, " + min + ", -5) | list }}"),
            "[-9223372036854775800, -9223372036854775805]");
}

TEST(JinjaTest, SlicesWithHugeBoundsAndStepsStayInside) {  // used to step past the end (i += stride overflowed)
  EXPECT_EQ(render("{{ [1, 2, 3][2::9223372036854775806] }}"), "[3]");
  EXPECT_EQ(render("{{ [1, 2, 3][2::9223372036854775807] }}"), "[3]");
  EXPECT_EQ(render("{{ [1, 2, 3][0::-9223372036854775807] }}"), "[1]");
  EXPECT_EQ(render("{{ [1, 2, 3][::-9223372036854775807 - 1] }}"), "[3]");
  EXPECT_EQ(render("{{ 'abc'[-9223372036854775807 - 1:9223372036854775807:2] }}"), "ac");
  EXPECT_EQ(render("{{ 'abcde'[::-2] }} {{ [1, 2, 3, 4][3:0:-1] }} {{ [1, 2][5:] }} {{ 'ab'[-5::-1] }}"),
            "eca [4, 3, 2] [] ");
}

TEST(JinjaTest, LibraryExceptionsBecomeErrors) {  // each used to escape as std::out_of_range, length_error, ...
  EXPECT_EQ(render("{{ 1e999 }}"), "inf");
  EXPECT_EQ(error_of("{{ x.99999999999999999999 }}"), "template line 1: integer literal out of range");
  EXPECT_EQ(render("{{ [[1]] | map(attribute='99999999999999999999') | list }}"), "[None]");
  EXPECT_EQ(error_of("{{ '{99999999999999999999999}'.format(1) }}"),
            "template line 1: Replacement index out of range for positional args tuple");
  EXPECT_EQ(render("{{ 'a\nb' | indent(-1) }}"), "a\nb");
  EXPECT_NE(error_of("{{ d.cycle(1, 2) }}", {{"d", {{"index0", "x"}, {"revindex0", 1}}}}).find("template line 1: "),
            std::string::npos);
  EXPECT_EQ(render("{{ d | tojson }}", {{"d", "\xff"}}), "\"\xff\"");
  nlohmann::json invalid_utf8 = {{"d", "\xff"}};
  EXPECT_EQ(JinjaTemplate("{{ d }}").render(invalid_utf8), "\xff");
  EXPECT_EQ(error_of("{{ [1] | tojson(indent=9223372036854775807) }}"), "template line 1: tojson: indent too large");
  EXPECT_EQ(error_of("{{ [1] | tojson(indent=2147483647) }}"), "template line 1: tojson: result too large");

  JinjaTemplate moved("x");
  JinjaTemplate target(std::move(moved));
  EXPECT_THROW(moved.render(Json::object()), Error);  // NOLINT(bugprone-use-after-move): the point of the test
  EXPECT_THROW(moved.render(nlohmann::json::object()), Error);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(target.render(Json::object()), "x");
}

TEST(JinjaTest, DeeplyNestedDataIsAnError) {
  Json deep = 1;
  for (int i = 0; i < 200; ++i) deep = Json::array({deep});
  EXPECT_EQ(error_of("{{ d }}", {{"d", deep}}), "template context nested deeper than 128");
  nlohmann::json deep_sorted = 1;
  for (int i = 0; i < 200; ++i) deep_sorted = nlohmann::json::array({deep_sorted});
  EXPECT_THROW(JinjaTemplate("{{ d }}").render(nlohmann::json{{"d", deep_sorted}}), Error);
  EXPECT_EQ(error_of("{% set x = 1 %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}",
                     Json::object()).rfind("template line 1: ", 0), 0u);
  EXPECT_EQ(error_of("{% set ns = namespace(x=1) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}"),
            "template line 1: a value nested deeper than 128");
  EXPECT_EQ(error_of("{% set o = namespace(n=namespace(x=1)) %}{% for i in range(100000) %}"
                     "{% set o.n = namespace(x=[o.n.x]) %}{% endfor %}"),
            "template line 1: a namespace attribute nested deeper than 128");
  EXPECT_EQ(error_of("{% set ns = namespace(x=1) %}{% for i in range(100000) %}{% set ns.x = dict(a=ns.x) %}"
                     "{% endfor %}"),
            "template line 1: a dict nested deeper than 128");
}

// Each of these used to spin for minutes or exhaust memory.
TEST(JinjaTest, WorkAndMemoryAreBounded) {
  EXPECT_EQ(render("[{{ '' * 9223372036854775807 }}][{{ [] * 9223372036854775807 }}]"), "[][[]]");
  EXPECT_EQ(error_of("{{ 'ab' * 9223372036854775807 }}"), "template line 1: repetition result too large");
  EXPECT_EQ(error_of("{{ [1, 2] * 4611686018427387904 }}"), "template line 1: repetition result too large");
  EXPECT_EQ(error_of("{{ 3 ** 9223372036854775807 }}"), "template line 1: integer overflow");
  EXPECT_EQ(render("{{ 1 ** 9223372036854775807 }}{{ (-1) ** 9223372036854775807 }}{{ 0 ** 9223372036854775807 }}"),
            "1-10");
  // Steps: nested loops of 100000 * 100000.
  EXPECT_EQ(error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"),
            "template line 1: template ran more than 1000000 steps (loop iterations, statements and calls)");
  // Doubling strings and lists.
  std::string doubling_string = "{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}";
  EXPECT_NE(error_of(doubling_string).find("result too large"), std::string::npos);
  std::string doubling_plus = "{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}{% endfor %}";
  EXPECT_NE(error_of(doubling_plus).find("result too large"), std::string::npos);
  std::string doubling_list = "{% set ns = namespace(l=[1]) %}{% for i in range(100) %}{% set ns.l = ns.l + ns.l %}{% endfor %}";
  EXPECT_NE(error_of(doubling_list).find("too large"), std::string::npos);
  // Copying a large value over and over.
  std::string copying = "{% set big = 'x' * 16000000 %}{% for i in range(100000) %}{% set l = [big] %}{% endfor %}";
  EXPECT_NE(error_of(copying).find("template built more than"), std::string::npos);
  // Output.
  EXPECT_NE(error_of("{% set s = 'x' * 16000000 %}{% for i in range(100) %}{{ s }}{% endfor %}").find("too large"),
            std::string::npos);
  // Filters and methods that multiply their input.
  EXPECT_EQ(error_of("{{ [1] | batch(9223372036854775807, 0) }}"), "template line 1: batch: result too large");
  EXPECT_NE(error_of("{{ ('x\n' * 1000) | indent(100000) }}").find("too large"), std::string::npos);
  EXPECT_NE(error_of("{{ ('x' * 16000000) | replace('', 'yyyy') }}").find("too large"), std::string::npos);
  EXPECT_NE(error_of("{{ ('{0}' * 1000000).format('x' * 1000) }}").find("too large"), std::string::npos);
  EXPECT_NE(error_of("{{ ('x' * 10000).join(['y' * 10000] * 10000) }}").find("too large"), std::string::npos);
  EXPECT_NE(error_of("{{ range(100000) | unique | list | length }}").find("steps"), std::string::npos);
  // Going over a large list or string again and again.
  EXPECT_NE(error_of("{% set l = [0] * 1000000 %}{% for i in range(100000) %}{{ 1 in l }}{% endfor %}").find("steps"),
            std::string::npos);
  EXPECT_NE(error_of("{% set s = 'x' * 16000000 %}{% for i in range(100000) %}{{ s.find('y') }}{% endfor %}")
                .find("steps"),
            std::string::npos);
  EXPECT_EQ(render("{{ range(5000) | unique | list | length }}"), "5000");
  EXPECT_EQ(render("{{ 'a-b' | replace('-', '+') }} {{ 'ab' | replace('', '.') }}"), "a+b .a.b.");
}

// Runs `body` on a thread with a 1 MiB stack (a server's worker may have no
// more): a recursion the limits let through would crash the test.
void run_on_small_stack(std::function<void()> body) {
  pthread_attr_t attributes;
  ASSERT_EQ(pthread_attr_init(&attributes), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attributes, size_t{1} << 20), 0);
  pthread_t thread;
  auto trampoline = [](void* argument) -> void* {
    (*static_cast<std::function<void()>*>(argument))();
    return nullptr;
  };
  ASSERT_EQ(pthread_create(&thread, &attributes, trampoline, &body), 0);
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attributes);
}

std::string repeated(const std::string& text, int count) {
  std::string out;
  for (int i = 0; i < count; ++i) out += text;
  return out;
}

TEST(JinjaTest, DeepNestingIsAnErrorOnASmallStack) {  // each used to overflow the stack
  run_on_small_stack([] {
    EXPECT_NE(error_of(repeated("{% if true %}", 20000) + "x" + repeated("{% endif %}", 20000)).find("nested too deeply"),
              std::string::npos);
    EXPECT_EQ(error_of(repeated("{% generation %}", 20000) + "x" + repeated("{% endgeneration %}", 20000)),
              "template line 1: blocks nested too deeply");
    EXPECT_EQ(error_of("{{ 1" + repeated(" + 1", 20000) + " }}"), "template line 1: expression nested too deeply");
    EXPECT_EQ(error_of("{{ 1" + repeated(" ~ 1", 20000) + " }}"), "template line 1: expression nested too deeply");
    EXPECT_EQ(error_of("{{ x" + repeated(" | first", 20000) + " }}"), "template line 1: expression nested too deeply");
    EXPECT_EQ(error_of("{{ x" + repeated(".a", 20000) + " }}"), "template line 1: expression nested too deeply");
    EXPECT_EQ(error_of("{{ x" + repeated("[0]", 20000) + " }}"), "template line 1: expression nested too deeply");
    EXPECT_EQ(error_of("{{ f" + repeated("()", 20000) + " }}"), "template line 1: expression nested too deeply");
    EXPECT_EQ(error_of("{{ 1" + repeated(" if 1 else 1", 20000) + " }}"), "template line 1: expression nested too deeply");
    EXPECT_EQ(error_of("{{ " + repeated("not ", 20000) + "1 }}"), "template line 1: expression nested too deeply");
    EXPECT_EQ(error_of("{{ " + repeated("-", 20000) + "1 }}"), "template line 1: expression nested too deeply");
    EXPECT_EQ(error_of("{{ " + repeated("[", 20000) + repeated("]", 20000) + " }}"),
              "template line 1: expression nested too deeply");
    // At the limits: blocks and expressions as deep as the parser takes, in a
    // macro recursing as deep as the renderer takes.
    std::string deepest_expression = "n" + repeated(" + 1", 150);
    std::string blocks = repeated("{% if true %}", 40) + "{{ f(" + deepest_expression + ") }}" + repeated("{% endif %}", 40);
    std::string recursive = "{% macro f(n) %}" + blocks + "{% endmacro %}{{ f(0) }}";
    std::string message = error_of(recursive);
    EXPECT_EQ(message, "template line 1: template nested too deeply when rendered (more than 300 levels)");
    // Deep data within the data limit.
    Json deep = 1;
    for (int i = 0; i < 127; ++i) deep = Json::array({deep});
    EXPECT_EQ(render("{{ d == d }}{{ (d | tojson | length) > 0 }}{{ (d | string | length) > 0 }}", {{"d", deep}}),
              "TrueTrueTrue");
  });
}

TEST(JinjaTest, UndefinedFollowsJinja2AndAttributesOfItAreUndefined) {
  EXPECT_EQ(render("[{{ nothing }}][{{ nothing | length }}][{% for x in nothing %}x{% endfor %}][{{ nothing is defined }}]"),
            "[][0][][False]");
  // jinja2 raises here ('nothing' is undefined); Loom renders "" (issue 16's spec: lenient attribute access).
  EXPECT_EQ(render("[{{ nothing.attribute.deeper }}][{{ nothing['k'] is defined }}][{{ nothing[0] }}]"), "[][False][]");
  EXPECT_EQ(render("{% if m.tool_calls %}calls{% else %}none{% endif %}", {{"m", {{"role", "user"}}}}), "none");
}

TEST(JinjaTest, WhitespaceOptionsDefaultToTransformers) {
  std::string source = "{% if true %}\n  x\n  {% endif %}\ny\n";
  EXPECT_EQ(render(source), "  x\ny");
  JinjaOptions jinja2_defaults{.trim_blocks = false, .lstrip_blocks = false, .keep_trailing_newline = false};
  EXPECT_EQ(render(source, Json::object(), jinja2_defaults), "\n  x\n  \ny");
  JinjaOptions keep_newline;
  keep_newline.keep_trailing_newline = true;
  EXPECT_EQ(render(source, Json::object(), keep_newline), "  x\ny\n");
  EXPECT_EQ(render("a\n  {#- c #}\n b"), "a b");
  EXPECT_EQ(render("{% if true +%}\nkept newline{% endif %}"), "\nkept newline");
}

TEST(JinjaTest, GenerationBlockRendersItsBody) {  // transformers' {% generation %} (assistant masks): rendered in place
  EXPECT_EQ(render("{% for m in ms %}{% generation %}<{{ m }}>{% endgeneration %}{% endfor %}", {{"ms", {1, 2}}}),
            "<1><2>");
}

TEST(JinjaTest, StrftimeNowFormatsTheLocalTime) {
  std::string year = render("{{ strftime_now('%Y') }}");
  ASSERT_EQ(year.size(), 4u);
  EXPECT_GE(std::stoi(year), 2024);
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y') | length }}"), "11");
}

TEST(JinjaTest, ObjectKeyOrderIsKeptForOrderedJsonAndSortedForJson) {
  std::string source = "{{ tool | tojson }}";
  Json ordered = Json::parse(R"({"tool": {"name": "f", "arguments": {"z": 1, "a": 2}}})");
  EXPECT_EQ(JinjaTemplate(source).render(ordered), R"({"name": "f", "arguments": {"z": 1, "a": 2}})");
  nlohmann::json sorted = nlohmann::json::parse(ordered.dump());
  EXPECT_EQ(JinjaTemplate(source).render(sorted), R"({"arguments": {"a": 2, "z": 1}, "name": "f"})");
}

// 2000 messages of 2 KB through the ChatML template and a loop that looks the
// whole list up on every iteration: variable lookups and loop items share the
// context's JSON (they used to copy it: seconds). No timing assertion here.
TEST(JinjaTest, LongConversationsRenderWithoutCopyingTheContext) {
  Json messages = Json::array();
  for (int i = 0; i < 2000; ++i)
    messages.push_back({{"role", i % 2 ? "assistant" : "user"}, {"content", std::string(2048, 'a' + i % 26)}});
  Json context = {{"messages", messages}, {"add_generation_prompt", true}};
  JinjaTemplate chat_template(read_text(test::fixture_path("template/chatml_tools.jinja")));
  EXPECT_GT(chat_template.render(context).size(), 2000u * 2048u);
  std::string lookups = render(
      "{% for m in messages %}{% if messages[loop.index0].role == m.role and messages | length > 0 %}"
      "{{ loop.index }}{% endif %}{% endfor %}",
      context);
  EXPECT_EQ(lookups.substr(0, 3), "123");
}

TEST(JinjaTest, OneTemplateRendersOnManyThreads) {
  JinjaTemplate chat_template(read_text(test::fixture_path("template/chatml_tools.jinja")));
  Json context = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"add_generation_prompt", true}};
  std::string expected = chat_template.render(context);
  std::vector<std::thread> threads;
  std::vector<int> num_matching(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) num_matching[t] += chat_template.render(context) == expected;
    });
  for (auto& thread : threads) thread.join();
  for (int count : num_matching) EXPECT_EQ(count, 200);
}

}  // namespace
}  // namespace loom
