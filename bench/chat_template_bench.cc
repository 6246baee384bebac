// Chat-template rendering time for a long agent conversation (Google
// Benchmark): the Qwen3-style tool template of the test corpus
// (tests/fixtures/chat/qwen3.jinja: tools block, <tool_call> turns,
// <tool_response> results, reasoning cut) with 20 tools and a conversation
// whose rendered prompt is ~130K characters (~32K tokens at ~4 characters a
// token; argument 96K: the messages' own text) or ~20K: user turns, assistant
// turns with tool calls, tool results. Each iteration is one
// ChatRenderer::render of the whole request, as a chat completion does it
// (message preparation included). Reports the rendered size as counters.
#include <fstream>
#include <sstream>
#include <string>

#include <benchmark/benchmark.h>
#include <nlohmann/json.hpp>

#include "chat/chat_renderer.h"

namespace loom {
namespace {

std::string read_fixture(const std::string& relative) {
  std::ifstream file(std::string(LOOM_SOURCE_DIR) + "/" + relative);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

nlohmann::ordered_json make_tools(int count) {
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  for (int i = 0; i < count; ++i) {
    nlohmann::ordered_json parameters = {
        {"type", "object"},
        {"properties",
         {{"path", {{"type", "string"}, {"description", "File or directory the tool works on"}}},
          {"limit", {{"type", "integer"}, {"description", "How many results at most"}}},
          {"mode", {{"enum", {"fast", "thorough", "dry-run"}}}}}},
        {"required", {"path"}}};
    tools.push_back({{"type", "function"},
                     {"function",
                      {{"name", "tool_" + std::to_string(i)},
                       {"description", "Tool number " + std::to_string(i) + ": searches, reads or edits the codebase."},
                       {"parameters", parameters}}}});
  }
  return tools;
}

// Turns of ~640 characters each until `characters` are reached.
nlohmann::ordered_json make_messages(size_t characters) {
  const std::string sentence = "The function parses the request, checks every field and hands the batch over. ";
  auto paragraph = [&](int sentences) {
    std::string text;
    for (int i = 0; i < sentences; ++i) text += sentence;
    return text;
  };
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  messages.push_back({{"role", "system"}, {"content", "You are a coding agent. " + paragraph(4)}});
  size_t total = 0;
  for (int turn = 0; total < characters; ++turn) {
    const std::string user = "Step " + std::to_string(turn) + ": " + paragraph(2);
    messages.push_back({{"role", "user"}, {"content", user}});
    const std::string call_id = "call_" + std::to_string(turn);
    messages.push_back(
        {{"role", "assistant"},
         {"content", paragraph(1)},
         {"tool_calls",
          {{{"id", call_id},
            {"type", "function"},
            {"function", {{"name", "tool_" + std::to_string(turn % 20)},
                          {"arguments", "{\"path\": \"src/module_" + std::to_string(turn) + ".cc\", \"limit\": 5}"}}}}}}});
    const std::string result = paragraph(4);
    messages.push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", result}});
    total += user.size() + sentence.size() + result.size() + 60;
  }
  messages.push_back({{"role", "user"}, {"content", "Summarise what you found."}});
  return messages;
}

void BM_RenderLongToolConversation(benchmark::State& state) {
  ModelChatTemplates model;
  model.default_source = read_fixture("tests/fixtures/chat/qwen3.jinja");
  model.has_model_template = true;
  model.special_tokens = {{"eos_token", "<|im_end|>"}};
  const ChatRenderer renderer(model);
  ChatRequest request;
  request.messages = make_messages(static_cast<size_t>(state.range(0)));
  request.tools = make_tools(20);
  size_t rendered = 0;
  for (auto _ : state) {
    const std::string prompt = renderer.render(request);
    rendered = prompt.size();
    benchmark::DoNotOptimize(prompt.data());
  }
  state.counters["messages"] = static_cast<double>(request.messages.size());
  state.counters["rendered_chars"] = static_cast<double>(rendered);
  state.counters["approx_tokens"] = static_cast<double>(rendered) / 4.0;
}
BENCHMARK(BM_RenderLongToolConversation)->Arg(8 << 10)->Arg(96 << 10)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace loom

BENCHMARK_MAIN();
