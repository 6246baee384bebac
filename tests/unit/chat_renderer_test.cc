// ChatRenderer (src/chat) against Python's jinja2 as vLLM's OpenAI server uses
// it: tests/fixtures/chat/chat_cases.json (scripts/make_chat_fixtures.py) holds
// chat requests, as an OpenAI client sends them, rendered by jinja2 with
// transformers' environment and vLLM's message preparation, for 14 chat
// templates written for the tests in the styles of Llama-3.1/3.2/3.3,
// Qwen2.5/Qwen3, Mistral v1/v3/v7-tekken, Gemma, Phi-3/4, DeepSeek-R1,
// SmolLM2/3 and Granite. Every case must come out byte-identical, or fail
// where jinja2 failed. The tests below cover what the fixture cannot:
// template choice, errors and their lines, the tokenizer's templates.
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "chat/chat_renderer.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
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

ChatRequest request_from_json(const Json& fields) {
  ChatRequest request;
  request.messages = fields.at("messages");
  if (fields.contains("tools")) request.tools = fields["tools"];
  if (fields.contains("documents")) request.documents = fields["documents"];
  if (fields.contains("chat_template_kwargs")) request.template_kwargs = fields["chat_template_kwargs"];
  request.add_generation_prompt = fields.value("add_generation_prompt", true);
  request.continue_final_message = fields.value("continue_final_message", false);
  return request;
}

ModelChatTemplates model_templates(const std::string& source) {
  ModelChatTemplates model;
  model.default_source = source;
  model.has_model_template = true;
  model.special_tokens = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  return model;
}

std::string error_of(const ChatRenderer& renderer, const ChatRequest& request, const std::string& source = {}) {
  try {
    renderer.render(request, source);
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kInvalidArgument);
    return error.message();
  }
  ADD_FAILURE() << "no error";
  return {};
}

Json user(const std::string& text) { return {{"role", "user"}, {"content", text}}; }

TEST(ChatRendererTest, PerRequestTemplateCacheStaysWithinItsLimit) {
  ChatRenderer renderer(model_templates("{{ messages[0]['content'] }}"), "");
  ChatRequest request;
  request.messages = Json::array({user("hi")});
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(renderer.render(request, "{{ messages[0]['content'] }}" + std::to_string(i)), "hi" + std::to_string(i));
    const CacheGauge gauge = renderer.cache_gauge();
    EXPECT_EQ(gauge.name, "chat_templates");
    EXPECT_LE(gauge.entries, gauge.capacity);
    EXPECT_EQ(gauge.entries, std::min<int64_t>(i + 1, gauge.capacity));
  }
  const CacheGauge gauge = renderer.cache_gauge();
  EXPECT_EQ(gauge.evictions, 50 - gauge.capacity);
  EXPECT_GT(gauge.bytes, 0);
}

TEST(ChatRendererTest, RendersTheCorpusAsJinja2AndVllmDo) {
  const Json fixture = Json::parse(read_text(test::fixture_path("chat/chat_cases.json")));
  int num_rendered = 0, num_errors = 0;
  std::set<std::string> templates;
  for (const Json& test_case : fixture.at("cases")) {
    const std::string name = test_case.at("name");
    SCOPED_TRACE(name);
    templates.insert(test_case.at("template").get<std::string>());
    const ChatRenderer renderer(model_templates(read_text(test::fixture_path(test_case.at("template")))));
    const ChatRequest request = request_from_json(test_case.at("request"));
    if (test_case.contains("expected")) {
      try {
        EXPECT_EQ(renderer.render(request), test_case["expected"].get<std::string>());
      } catch (const Error& error) {
        ADD_FAILURE() << error.what();
      }
      ++num_rendered;
    } else {
      const std::string message = error_of(renderer, request);
      EXPECT_NE(message.find(test_case.at("error").get<std::string>()), std::string::npos) << message;
      EXPECT_NE(message.find("template line "), std::string::npos) << message;
      ++num_errors;
    }
  }
  EXPECT_EQ(templates.size(), 14u);
  EXPECT_GE(num_rendered, 140);
  EXPECT_GE(num_errors, 3);  // raise_exception in templates that refuse tool turns
}

TEST(ChatRendererTest, ToolUseTemplateIsChosenWhenToolsAreGiven) {
  ModelChatTemplates model = model_templates("default:{{ messages | length }}");
  model.tool_use_source = "tool_use:{{ tools | length }}";
  const ChatRenderer renderer(model);
  ChatRequest request;
  request.messages = Json::array({user("hi")});
  EXPECT_EQ(renderer.render(request), "default:1");
  request.tools = Json::array();  // empty: as none
  EXPECT_EQ(renderer.render(request), "default:1");
  request.tools = Json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
  EXPECT_EQ(renderer.render(request), "tool_use:1");
  EXPECT_EQ(renderer.render(request, "request:{{ tools[0].function.name }}"), "request:f");
}

TEST(ChatRendererTest, OverrideReplacesTheModelsTemplates) {
  ModelChatTemplates model = model_templates("model");
  model.tool_use_source = "model tool_use";
  const ChatRenderer renderer(model, "override {{ bos_token }}");
  ChatRequest request;
  request.messages = Json::array({user("hi")});
  request.tools = Json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
  EXPECT_EQ(renderer.render(request), "override <s>");
}

TEST(ChatRendererTest, ContextHasNoneForAbsentToolsAndKwargsBecomeVariables) {
  const ChatRenderer renderer(model_templates(
      "{{ tools is none }} {{ documents is none }} {{ add_generation_prompt }} {{ enable_thinking }} {{ eos_token }} "
      "{{ continue_final_message is defined }}"));
  ChatRequest request;
  request.messages = Json::array({user("hi")});
  request.template_kwargs = {{"enable_thinking", false}, {"eos_token", "<end>"}};
  EXPECT_EQ(renderer.render(request), "True True True False <end> False");
}

TEST(ChatRendererTest, ReservedKwargsAndBothFlagsAreErrors) {
  const ChatRenderer renderer(model_templates("x"));
  ChatRequest request;
  request.messages = Json::array({user("hi")});
  request.template_kwargs = {{"messages", Json::array()}};
  EXPECT_NE(error_of(renderer, request).find("chat_template_kwargs may not set 'messages'"), std::string::npos);
  request.template_kwargs = Json::object();
  request.continue_final_message = true;
  EXPECT_NE(error_of(renderer, request).find("cannot both be true"), std::string::npos);
}

TEST(ChatRendererTest, ErrorsNameTheTemplateLine) {
  EXPECT_THROW(ChatRenderer(model_templates("a\n{% if %}")), Error);
  try {
    ChatRenderer renderer(ModelChatTemplates{}, "line one\n{% for x in %}");
    ADD_FAILURE() << "a syntax error was accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.message().rfind("--chat-template chat template: template line 2:", 0), 0u) << error.message();
  }
  const ChatRenderer renderer(model_templates("ok"));
  ChatRequest request;
  request.messages = Json::array({user("hi")});
  EXPECT_EQ(error_of(renderer, request, "one\ntwo\n{{ raise_exception('no system role') }}"),
            "chat template: template line 3: no system role");
  EXPECT_EQ(error_of(renderer, request, "{% if x %}\n{% endfor %}").rfind("chat template: template line 2:", 0), 0u);
  EXPECT_EQ(error_of(renderer, request, "\n{{ messages[0].content.nope() }}").rfind("chat template: template line 2", 0),
            0u);
  EXPECT_EQ(renderer.render(request), "ok");  // the renderer still works
}

TEST(ChatRendererTest, ToolCallArgumentsReachTemplatesAsObjects) {
  const ChatRenderer renderer(model_templates(
      "{% for m in messages %}{% for c in m.tool_calls | default([]) %}{{ c.function.arguments | tojson }}|"
      "{{ c.function.arguments is mapping }};{% endfor %}{% endfor %}"));
  ChatRequest request;
  request.messages = Json::array(
      {user("hi"),
       {{"role", "assistant"},
        {"content", nullptr},
        {"tool_calls",
         {{{"id", "a"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", "{\"b\": 1, \"a\": [2.5]}"}}}},
          {{"id", "b"}, {"type", "function"}, {"function", {{"name", "g"}, {"arguments", ""}}}},
          {{"id", "c"}, {"type", "function"}, {"function", {{"name", "h"}, {"arguments", {{"z", true}}}}}}}}}});
  EXPECT_EQ(renderer.render(request), "{\"b\": 1, \"a\": [2.5]}|True;{}|True;{\"z\": true}|True;");
  request.messages[1]["tool_calls"][0]["function"]["arguments"] = "{not json";
  EXPECT_EQ(error_of(renderer, request), "messages[1].tool_calls[0].function.arguments is not valid JSON");
}

TEST(ChatRendererTest, ContentFormatFollowsTheTemplate) {
  EXPECT_EQ(detect_content_format("{% for part in message['content'] %}"), ChatContentFormat::kOpenAi);
  EXPECT_EQ(detect_content_format("{%- for block in msg.content -%}"), ChatContentFormat::kOpenAi);
  EXPECT_EQ(detect_content_format("{{ message['content'] }}{% for m in messages %}"), ChatContentFormat::kString);
  EXPECT_EQ(detect_content_format("{% for x in message [ \"content\" ] %}"), ChatContentFormat::kOpenAi);
  EXPECT_EQ(detect_content_format("{% for x in message.contents %}{% for y in m['content_type'] %}"),
            ChatContentFormat::kString);
  EXPECT_EQ(detect_content_format("information in message['content']"), ChatContentFormat::kString);
  EXPECT_EQ(detect_content_format(std::string(1 << 20, 'f') + "for " + std::string(1 << 20, 'x')),
            ChatContentFormat::kString);  // linear, no recursion
  const Json parts = Json::array({{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}});
  const Json messages = Json::array({{{"role", "user"}, {"content", parts}}, {{"role", "assistant"}}});
  const Json as_string = prepare_chat_messages(messages, ChatContentFormat::kString);
  EXPECT_EQ(as_string[0]["content"], "a\nb");
  EXPECT_EQ(as_string[1]["content"], "");
  const Json as_parts = prepare_chat_messages(Json::array({user("x")}), ChatContentFormat::kOpenAi);
  EXPECT_EQ(as_parts[0]["content"], Json::array({{{"type", "text"}, {"text", "x"}}}));
}

TEST(ChatRendererTest, ContinueFinalMessageCutsAsTransformersDoes) {
  const Json spaced = {{"role", "assistant"}, {"content", "Hello "}};
  EXPECT_EQ(cut_after_final_message("<a>Hello <end>", spaced), "<a>Hello ");
  EXPECT_EQ(cut_after_final_message("<a>Hello<end>", spaced), "<a>Hello");  // the template trimmed it
  EXPECT_THROW(cut_after_final_message("<a>Bye<end>", spaced), Error);
}

TEST(ChatRendererTest, PerRequestTemplatesAreCachedAndThreadSafe) {
  const ChatRenderer renderer(model_templates("model"));
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      ChatRequest request;
      request.messages = Json::array({user("hi")});
      for (int i = 0; i < 50; ++i) {
        const std::string source = "t" + std::to_string((t + i) % 12) + "{{ messages[0].content }}";
        if (renderer.render(request, source) != "t" + std::to_string((t + i) % 12) + "hi") ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(ChatRendererTest, BuiltInTemplatesRenderAsTheNativeRenderers) {
  // Models without a template (and the synthetic tokenizers) get ChatTemplate's
  // built-in sources; through the interpreter they must give the native prompts.
  const std::vector<ChatMessage> messages = {{"system", "sys"}, {"user", " hi "}, {"assistant", "yo"}, {"user", "q"}};
  Json json_messages = Json::array();
  for (const ChatMessage& message : messages) json_messages.push_back({{"role", message.role}, {"content", message.content}});
  for (const ChatTemplate& builtin : {ChatTemplate::chatml(), ChatTemplate::chatml("Be nice."), ChatTemplate::llama3()}) {
    ModelChatTemplates model;
    model.default_source = builtin.jinja();
    model.special_tokens = {{"bos_token", "<|begin_of_text|>"}};
    const ChatRenderer renderer(model);
    for (const bool add_generation_prompt : {true, false}) {
      ChatRequest request;
      request.messages = json_messages;
      request.add_generation_prompt = add_generation_prompt;
      EXPECT_EQ(renderer.render(request), builtin.render(messages, add_generation_prompt));
      request.messages = Json::array({json_messages[1]});
      EXPECT_EQ(renderer.render(request), builtin.render({messages[1]}, add_generation_prompt));
    }
  }
}

TEST(ChatRendererTest, TokenizerConfigTemplatesAreRead) {
  const std::string directory =
      (std::filesystem::temp_directory_path() / ("loom_chat_renderer_" + std::to_string(getpid()))).string();
  std::filesystem::create_directories(directory);
  const std::string tokenizer_json =
      R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []},
          "added_tokens": [{"id": 2, "content": "<s>", "special": true}, {"id": 3, "content": "</s>", "special": true}]})";
  std::ofstream(directory + "/tokenizer.json") << tokenizer_json;
  std::ofstream(directory + "/tokenizer_config.json")
      << R"({"bos_token": "<s>", "eos_token": {"content": "</s>"}, "chat_template": [
             {"name": "default", "template": "D{{ bos_token }}{{ eos_token }}"},
             {"name": "tool_use", "template": "T{{ tools | length }}"}]})";
  const auto tokenizer = Tokenizer::from_hf_directory(directory);
  const ModelChatTemplates& model = tokenizer->model_chat_templates();
  EXPECT_TRUE(model.has_model_template);
  const ChatRenderer renderer(model);
  ChatRequest request;
  request.messages = Json::array({user("hi")});
  EXPECT_EQ(renderer.render(request), "D<s></s>");
  request.tools = Json::array({Json::object(), Json::object()});
  EXPECT_EQ(renderer.render(request), "T2");
  // The list form survives a round trip through to_hf_tokenizer_config_json.
  EXPECT_TRUE(nlohmann::json::parse(tokenizer->to_hf_tokenizer_config_json())["chat_template"].is_array());

  // No config: the built-in ChatML template stands in; chat_template.jinja beside it is the model's.
  std::filesystem::remove(directory + "/tokenizer_config.json");
  EXPECT_FALSE(Tokenizer::from_hf_directory(directory)->model_chat_templates().has_model_template);
  std::ofstream(directory + "/chat_template.jinja") << "J{{ messages[0].content }}";
  const auto with_file = Tokenizer::from_hf_directory(directory);
  EXPECT_EQ(ChatRenderer(with_file->model_chat_templates()).render(request), "Jhi");
  std::filesystem::remove_all(directory);
}

}  // namespace
}  // namespace loom
