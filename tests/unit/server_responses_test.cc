// /v1/responses' pieces without a server: the request parser and its chat
// body (server/responses_request.h), and the bounded response store
// (server/response_store.h) with its three bounds (entries, bytes, TTL).
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/response_store.h"
#include "server/responses_output.h"
#include "server/responses_request.h"

namespace loom::server {
namespace {

using OrderedJson = nlohmann::ordered_json;

std::string bad_param(const std::string& body) {
  try {
    parse_responses_request(body);
  } catch (const ApiError& error) {
    EXPECT_EQ(error.status(), 400);
    return error.param();
  }
  ADD_FAILURE() << "accepted: " << body;
  return {};
}

OrderedJson chat_of(const std::string& body, const OrderedJson& history = OrderedJson::array()) {
  return to_chat_body(parse_responses_request(body), history);
}

TEST(ResponsesRequestTest, StringInputWithInstructionsBecomesSystemAndUserMessages) {
  const ResponsesRequest request =
      parse_responses_request(R"({"model": "tiny", "input": "hi", "instructions": "be brief"})");
  EXPECT_TRUE(request.store);
  EXPECT_FALSE(request.stream);
  ASSERT_EQ(request.input_items.size(), 1u);
  EXPECT_EQ(request.input_items[0]["role"], "user");
  const OrderedJson chat = to_chat_body(request, OrderedJson::array());
  EXPECT_EQ(chat["model"], "tiny");
  ASSERT_EQ(chat["messages"].size(), 2u);
  EXPECT_EQ(chat["messages"][0], (OrderedJson{{"role", "system"}, {"content", "be brief"}}));
  EXPECT_EQ(chat["messages"][1], (OrderedJson{{"role", "user"}, {"content", "hi"}}));
}

TEST(ResponsesRequestTest, ItemsBecomeMessagesWithToolCallsAndToolResults) {
  const OrderedJson chat = chat_of(R"({"input": [
      {"role": "developer", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
      {"type": "message", "role": "user", "content": "weather?"},
      {"type": "reasoning", "id": "rs_1", "summary": []},
      {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
       "content": [{"type": "output_text", "text": "let me look", "annotations": []}]},
      {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
      {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
      {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "noon"}]}]})");
  const OrderedJson& messages = chat["messages"];
  ASSERT_EQ(messages.size(), 5u) << messages.dump();
  EXPECT_EQ(messages[0], (OrderedJson{{"role", "developer"}, {"content", "ab"}}));
  EXPECT_EQ(messages[1]["role"], "user");
  // The function calls join the assistant message before them.
  EXPECT_EQ(messages[2]["role"], "assistant");
  EXPECT_EQ(messages[2]["content"], "let me look");
  ASSERT_EQ(messages[2]["tool_calls"].size(), 2u);
  EXPECT_EQ(messages[2]["tool_calls"][0]["id"], "c1");
  EXPECT_EQ(messages[2]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(messages[2]["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Paris\"}");
  EXPECT_EQ(messages[3], (OrderedJson{{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "sunny"},
                                      {"name", "get_weather"}}));
  EXPECT_EQ(messages[4]["content"], "noon");
  EXPECT_EQ(messages[4]["name"], "get_time");
}

TEST(ResponsesRequestTest, FunctionCallWithoutAssistantTextOpensAnAssistantMessage) {
  const OrderedJson messages = items_to_messages(OrderedJson::parse(R"([
      {"role": "user", "content": "x"},
      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}])"));
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_EQ(messages[1]["role"], "assistant");
  EXPECT_TRUE(messages[1]["content"].is_null());
  EXPECT_EQ(messages[1]["tool_calls"].size(), 1u);
}

TEST(ResponsesRequestTest, HistoryGoesBetweenInstructionsAndInput) {
  const OrderedJson history = OrderedJson::parse(R"([
      {"type": "message", "role": "user", "content": "first"},
      {"id": "fc_1", "type": "function_call", "status": "completed", "call_id": "c1", "name": "f",
       "arguments": "{}"}])");
  const OrderedJson chat = chat_of(R"({"instructions": "sys", "previous_response_id": "resp_1",
      "input": [{"type": "function_call_output", "call_id": "c1", "output": "42"}]})", history);
  const OrderedJson& messages = chat["messages"];
  ASSERT_EQ(messages.size(), 4u) << messages.dump();
  EXPECT_EQ(messages[0]["role"], "system");
  EXPECT_EQ(messages[1]["content"], "first");
  EXPECT_EQ(messages[2]["tool_calls"][0]["id"], "c1");
  EXPECT_EQ(messages[3]["role"], "tool");
  EXPECT_EQ(messages[3]["name"], "f");
}

TEST(ResponsesRequestTest, ToolsToolChoiceTextFormatAndLimitsMapToChatFields) {
  const OrderedJson chat = chat_of(R"({"input": "x", "max_output_tokens": 7, "temperature": 0.5, "seed": 3,
      "top_k": 4, "workflow": "w", "agent": "a", "store": false, "stream": true, "include": ["x"],
      "reasoning": {"effort": "low"}, "metadata": {"k": "v"}, "truncation": "disabled",
      "tools": [{"type": "function", "name": "f", "description": "d", "strict": true,
                 "parameters": {"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "integer"}}}}],
      "tool_choice": {"type": "function", "name": "f"},
      "text": {"format": {"type": "json_schema", "name": "out", "strict": true,
                          "schema": {"type": "object", "properties": {"b": {}, "a": {}}}}}})");
  EXPECT_EQ(chat["max_completion_tokens"], 7);
  EXPECT_EQ(chat["temperature"], 0.5);
  EXPECT_EQ(chat["seed"], 3);
  EXPECT_EQ(chat["top_k"], 4);
  EXPECT_EQ(chat["workflow"], "w");
  EXPECT_EQ(chat["agent"], "a");
  EXPECT_FALSE(chat.contains("stream"));  // the Responses handler streams itself
  EXPECT_FALSE(chat.contains("include"));
  const OrderedJson& function = chat["tools"][0]["function"];
  EXPECT_EQ(chat["tools"][0]["type"], "function");
  EXPECT_EQ(function["name"], "f");
  EXPECT_EQ(function["description"], "d");
  EXPECT_EQ(function["strict"], true);
  // Member order as sent (structured output follows it).
  EXPECT_EQ(function["parameters"]["properties"].begin().key(), "z");
  EXPECT_EQ(chat["tool_choice"], (OrderedJson{{"type", "function"}, {"function", {{"name", "f"}}}}));
  const OrderedJson& format = chat["response_format"];
  EXPECT_EQ(format["type"], "json_schema");
  EXPECT_EQ(format["json_schema"]["name"], "out");
  EXPECT_EQ(format["json_schema"]["strict"], true);
  EXPECT_EQ(format["json_schema"]["schema"]["properties"].begin().key(), "b");

  EXPECT_EQ(chat_of(R"({"input": "x", "text": {"format": {"type": "json_object"}}})")["response_format"],
            (OrderedJson{{"type", "json_object"}}));
  EXPECT_FALSE(chat_of(R"({"input": "x", "text": {"format": {"type": "text"}}})").contains("response_format"));
  EXPECT_EQ(chat_of(R"({"input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": "required"})")
                ["tool_choice"], "required");
  const ResponsesRequest request = parse_responses_request(R"({"input": "x", "store": false, "stream": true})");
  EXPECT_FALSE(request.store);
  EXPECT_TRUE(request.stream);
}

TEST(ResponsesRequestTest, RefusesWhatIsNotSupportedNamingTheField) {
  EXPECT_EQ(bad_param(R"({})"), "input");
  EXPECT_EQ(bad_param(R"({"input": 3})"), "input");
  EXPECT_EQ(bad_param(R"({"input": [3]})"), "input[0]");
  EXPECT_EQ(bad_param(R"({"input": [{"role": "tool", "content": "x"}]})"), "input[0].role");
  EXPECT_EQ(bad_param(R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]})"),
            "input[0].content[0].type");
  EXPECT_EQ(bad_param(R"({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]})"), "input[0].call_id");
  EXPECT_EQ(bad_param(R"({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]})"),
            "input[0].arguments");
  EXPECT_EQ(bad_param(R"({"input": [{"type": "function_call_output", "call_id": "c"}]})"), "input[0].output");
  EXPECT_EQ(bad_param(R"({"input": [{"type": "item_reference", "id": "x"}]})"), "input[0].type");
  EXPECT_EQ(bad_param(R"({"input": "x", "tools": [{"type": "web_search"}]})"), "tools[0].type");
  EXPECT_EQ(bad_param(R"({"input": "x", "tools": [{"type": "function"}]})"), "tools[0].name");
  EXPECT_EQ(bad_param(R"({"input": "x", "background": true})"), "background");
  EXPECT_EQ(bad_param(R"({"input": "x", "truncation": "auto"})"), "truncation");
  EXPECT_EQ(bad_param(R"({"input": "x", "top_logprobs": 2})"), "top_logprobs");
  EXPECT_EQ(bad_param(R"({"input": "x", "conversation": "c"})"), "conversation");
  EXPECT_EQ(bad_param(R"({"input": "x", "store": "yes"})"), "store");
  EXPECT_EQ(bad_param(R"({"input": "x", "previous_response_id": 5})"), "previous_response_id");
  EXPECT_EQ(bad_param(R"({"input": "x", "instructions": ["a"]})"), "instructions");
  // Malformed JSON: named where parsing stopped (server/json_input.h).
  EXPECT_EQ(bad_param(R"({"input": "x", "input": [)"), "input[0]");
  // Mapped only when the chat body is built.
  try {
    chat_of(R"({"input": "x", "text": {"format": {"type": "grammar"}}})");
    ADD_FAILURE() << "text.format grammar accepted";
  } catch (const ApiError& error) {
    EXPECT_EQ(error.param(), "text.format.type");
  }
  try {
    chat_of(R"({"input": "x", "tool_choice": {"type": "web_search"}})");
    ADD_FAILURE() << "hosted tool_choice accepted";
  } catch (const ApiError& error) {
    EXPECT_EQ(error.param(), "tool_choice");
  }
}

// ---- output items and the event sequence ----

RequestOutput text_output(const std::string& text, bool finished = false,
                          FinishReason reason = FinishReason::kStop) {
  RequestOutput output;
  output.text_delta = text;
  output.finished = finished;
  output.finish_reason = reason;
  return output;
}

// (type, data) of each SSE event in `stream`.
std::vector<std::pair<std::string, nlohmann::json>> events_of(const std::string& stream) {
  std::vector<std::pair<std::string, nlohmann::json>> events;
  size_t at = 0;
  while ((at = stream.find("event: ", at)) != std::string::npos) {
    const size_t type_end = stream.find('\n', at);
    const size_t data_end = stream.find("\n\n", type_end);
    const std::string type = stream.substr(at + 7, type_end - at - 7);
    events.emplace_back(type, nlohmann::json::parse(stream.substr(type_end + 7, data_end - type_end - 7)));
    at = data_end;
  }
  return events;
}

TEST(ResponsesOutputTest, TextStreamsAsOneMessageAndMatchesTheWholeResponse) {
  const ResponsesRequest request = parse_responses_request(R"({"input": "x", "metadata": {"k": "v"}})");
  ParsedRequest parsed;
  parsed.model = "tiny";
  ResponsesOutput output(request, parsed, "resp_1", 5);
  std::string stream = output.start_events();
  stream += output.output_events(text_output("Hel"));
  stream += output.output_events(text_output("lo"));
  stream += output.output_events(text_output("", true, FinishReason::kLength));
  stream += output.finish_events(FinishReason::kLength, Usage{10, 3, 4});
  const auto events = events_of(stream);
  std::vector<std::string> types;
  for (size_t i = 0; i < events.size(); ++i) {
    types.push_back(events[i].first);
    EXPECT_EQ(events[i].second["type"], events[i].first);
    EXPECT_EQ(events[i].second["sequence_number"], i);
  }
  EXPECT_EQ(types, (std::vector<std::string>{
                       "response.created", "response.in_progress", "response.output_item.added",
                       "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
                       "response.output_text.done", "response.content_part.done", "response.output_item.done",
                       "response.incomplete"}));
  const nlohmann::json& streamed = output.streamed_response();
  EXPECT_EQ(streamed["status"], "incomplete");
  EXPECT_EQ(streamed["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(streamed["output"][0]["content"][0]["text"], "Hello");
  EXPECT_EQ(streamed["usage"]["input_tokens"], 10);
  EXPECT_EQ(streamed["usage"]["input_tokens_details"]["cached_tokens"], 4);
  EXPECT_EQ(streamed["usage"]["total_tokens"], 13);
  EXPECT_EQ(streamed["metadata"]["k"], "v");
  EXPECT_EQ(streamed["id"], "resp_1");

  ChoiceResult result;
  result.text = "Hello";
  result.finished = true;
  result.finish_reason = FinishReason::kStop;
  const nlohmann::json whole = output.finished_response(result, Usage{10, 3, 4});
  EXPECT_EQ(whole["status"], "completed");
  EXPECT_TRUE(whole["incomplete_details"].is_null());
  ASSERT_EQ(whole["output"].size(), 1u);
  EXPECT_EQ(whole["output"][0]["type"], "message");
  EXPECT_EQ(whole["output"][0]["content"][0]["text"], "Hello");
}

TEST(ResponsesOutputTest, ANamedToolChoiceGivesOneFunctionCallItem) {
  const ResponsesRequest request = parse_responses_request(R"({"input": "x"})");
  ParsedRequest parsed;
  parsed.tool_choice.mode = ToolChoiceMode::kNamed;
  parsed.tool_choice.function_name = "get_weather";
  parsed.tool_choice.tool_names = {"get_weather"};
  ResponsesOutput output(request, parsed, "resp_2", 5);
  std::string stream = output.start_events();
  stream += output.output_events(text_output("{\"city\": "));
  stream += output.output_events(text_output("\"Paris\"}", true));
  stream += output.finish_events(FinishReason::kStop, Usage{});
  const auto events = events_of(stream);
  ASSERT_GE(events.size(), 6u);
  EXPECT_EQ(events[2].first, "response.output_item.added");
  EXPECT_EQ(events[2].second["item"]["type"], "function_call");
  EXPECT_EQ(events[2].second["item"]["name"], "get_weather");
  std::string arguments;
  for (const auto& [type, data] : events)
    if (type == "response.function_call_arguments.delta") arguments += data["delta"].get<std::string>();
  EXPECT_EQ(nlohmann::json::parse(arguments), nlohmann::json::parse(R"({"city": "Paris"})"));
  EXPECT_EQ(events[events.size() - 3].first, "response.function_call_arguments.done");
  EXPECT_EQ(events.back().first, "response.completed");
  const nlohmann::json& item = output.streamed_response()["output"][0];
  EXPECT_EQ(item["type"], "function_call");
  EXPECT_EQ(item["status"], "completed");
  EXPECT_FALSE(item["call_id"].get<std::string>().empty());
  EXPECT_EQ(output.streamed_response()["output"].size(), 1u);
}

// ---- the store ----

struct FakeClock {
  ResponseStore::Clock::time_point now{};
  std::function<ResponseStore::Clock::time_point()> function() {
    return [this] { return now; };
  }
  void advance(double seconds) {
    now += std::chrono::duration_cast<ResponseStore::Clock::duration>(std::chrono::duration<double>(seconds));
  }
};

std::shared_ptr<const StoredResponse> entry(size_t payload_bytes = 10) {
  auto stored = std::make_shared<StoredResponse>();
  stored->response = {{"text", std::string(payload_bytes, 'x')}};
  stored->conversation = OrderedJson::array({{{"role", "user"}, {"content", "hi"}}});
  return stored;
}

TEST(ResponseStoreTest, GetEraseAndReplace) {
  ResponseStore store({});
  EXPECT_EQ(store.get("a"), nullptr);
  EXPECT_TRUE(store.put("a", entry()));
  ASSERT_NE(store.get("a"), nullptr);
  EXPECT_EQ(store.get("a")->conversation[0]["content"], "hi");
  const int64_t one = store.bytes();
  EXPECT_GT(one, 10);
  EXPECT_TRUE(store.put("a", entry()));  // replaced, not added
  EXPECT_EQ(store.size(), 1);
  EXPECT_EQ(store.bytes(), one);
  EXPECT_TRUE(store.erase("a"));
  EXPECT_FALSE(store.erase("a"));
  EXPECT_EQ(store.get("a"), nullptr);
  EXPECT_EQ(store.size(), 0);
  EXPECT_EQ(store.bytes(), 0);
}

TEST(ResponseStoreTest, EvictsTheOldestBeyondMaxEntries) {
  ResponseStore store({.max_entries = 2, .max_bytes = 1 << 20, .ttl_seconds = 0});
  store.put("a", entry());
  store.put("b", entry());
  store.put("c", entry());
  EXPECT_EQ(store.size(), 2);
  EXPECT_EQ(store.get("a"), nullptr);
  EXPECT_NE(store.get("b"), nullptr);
  EXPECT_NE(store.get("c"), nullptr);
  ResponseStore off({.max_entries = 0, .max_bytes = 1 << 20, .ttl_seconds = 0});
  EXPECT_FALSE(off.put("a", entry()));
  EXPECT_EQ(off.get("a"), nullptr);
}

TEST(ResponseStoreTest, EvictsTheOldestBeyondMaxBytesAndRefusesWhatCannotFit) {
  ResponseStore probe({});
  probe.put("a", entry(1000));
  const int64_t size = probe.bytes();
  ResponseStore store({.max_entries = 100, .max_bytes = 2 * size + size / 2, .ttl_seconds = 0});
  store.put("a", entry(1000));
  store.put("b", entry(1000));
  EXPECT_EQ(store.size(), 2);
  store.put("c", entry(1000));
  EXPECT_EQ(store.size(), 2);
  EXPECT_EQ(store.get("a"), nullptr);
  EXPECT_LE(store.bytes(), store.config().max_bytes);
  // Larger than the whole store: not stored, and nothing else evicted for it.
  EXPECT_FALSE(store.put("huge", entry(10000)));
  EXPECT_EQ(store.get("huge"), nullptr);
  EXPECT_NE(store.get("b"), nullptr);
  EXPECT_NE(store.get("c"), nullptr);
}

TEST(ResponseStoreTest, ExpiresAfterTheTtl) {
  FakeClock clock;
  ResponseStore store({.max_entries = 10, .max_bytes = 1 << 20, .ttl_seconds = 60}, clock.function());
  store.put("a", entry());
  clock.advance(30);
  store.put("b", entry());
  clock.advance(29);
  EXPECT_NE(store.get("a"), nullptr);
  clock.advance(2);  // a is 61 s old, b 31 s
  EXPECT_EQ(store.get("a"), nullptr);
  EXPECT_NE(store.get("b"), nullptr);
  EXPECT_EQ(store.size(), 1);
  clock.advance(30);
  EXPECT_FALSE(store.erase("b"));
  EXPECT_EQ(store.size(), 0);
  EXPECT_EQ(store.bytes(), 0);
}

}  // namespace
}  // namespace loom::server
