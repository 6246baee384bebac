#include "server/responses_output.h"

#include <random>

#include <fmt/format.h>

#include "server/json_output.h"

namespace loom::server {
namespace {

using Json = nlohmann::json;

Json plain(const nlohmann::ordered_json& value) { return Json::parse(value.dump()); }

Json usage_json(const Usage& usage) {
  return {{"input_tokens", usage.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", usage.cached_tokens}}},
          {"output_tokens", usage.completion_tokens},
          {"output_tokens_details", {{"reasoning_tokens", usage.reasoning_tokens}}},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

Json text_part(const std::string& text) {
  return {{"type", "output_text"}, {"text", text}, {"annotations", Json::array()}, {"logprobs", Json::array()}};
}

Json message_item(const std::string& id, const std::string& text, const char* status) {
  return {{"id", id},
          {"type", "message"},
          {"status", status},
          {"role", "assistant"},
          {"content", Json::array({text_part(text)})}};
}

Json reasoning_item(const std::string& id, const std::string& text, const char* status) {
  Json content = Json::array();
  if (!text.empty()) content.push_back({{"type", "reasoning_text"}, {"text", text}});
  return {{"id", id},
          {"type", "reasoning"},
          {"status", status},
          {"summary", Json::array()},
          {"content", std::move(content)},
          {"encrypted_content", nullptr}};
}

Json call_item(const std::string& id, const std::string& call_id, const std::string& name,
               const std::string& arguments, const char* status) {
  return {{"id", id}, {"type", "function_call"}, {"status", status},
          {"call_id", call_id}, {"name", name}, {"arguments", arguments}};
}

}  // namespace

std::string make_responses_id(const char* prefix) {
  thread_local std::mt19937_64 generator{std::random_device{}()};
  return fmt::format("{}_{:016x}{:016x}", prefix, generator(), generator());
}

ResponsesOutput::ResponsesOutput(const ResponsesRequest& request, const ParsedRequest& parsed, std::string id,
                                 int64_t created_at)
    : parsed_(parsed), id_(std::move(id)), created_at_(created_at),
      id_seed_((static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()) {
  const nlohmann::ordered_json& body = request.body;
  auto echo = [&](const char* key, Json fallback) {
    const auto it = body.find(key);
    echoed_[key] = it == body.end() || it->is_null() ? std::move(fallback) : plain(*it);
  };
  echo("instructions", nullptr);
  echo("max_output_tokens", nullptr);
  echo("metadata", Json::object());
  echo("parallel_tool_calls", true);
  echo("previous_response_id", nullptr);
  echo("reasoning", Json{{"effort", nullptr}, {"summary", nullptr}});
  echo("text", Json{{"format", {{"type", "text"}}}});
  echo("tool_choice", "auto");
  echo("tools", Json::array());
  echo("truncation", "disabled");
  echo("user", nullptr);
  echoed_["store"] = request.store;
  echoed_["background"] = false;
  echoed_["model"] = parsed.model;
  echoed_["temperature"] = parsed.engine_template.sampling.temperature;
  echoed_["top_p"] = parsed.engine_template.sampling.top_p;
  if (parsed.tool_choice.parses_output())
    reader_ = std::make_unique<ToolCallReader>(parsed.tool_choice, id_seed_);
  if (parsed.reasoning.active()) splitter_.emplace(parsed.reasoning.kind, parsed.reasoning.starts_in_answer);
}

Json ResponsesOutput::head(const char* status) const {
  Json response = echoed_;
  response["id"] = id_;
  response["object"] = "response";
  response["created_at"] = created_at_;
  response["status"] = status;
  response["error"] = nullptr;
  response["incomplete_details"] = nullptr;
  response["output"] = Json::array();
  response["usage"] = nullptr;
  return response;
}

Json ResponsesOutput::finished_response(const ChoiceResult& result, const Usage& usage) const {
  const bool incomplete = result.finish_reason == FinishReason::kLength;
  reasoning::ReasoningDelta split;
  if (parsed_.reasoning.active())
    split = reasoning::split_reasoning(parsed_.reasoning.kind, parsed_.reasoning.starts_in_answer, result.text);
  else
    split.content = result.text;
  toolcall::ParsedOutput parsed;
  if (parsed_.tool_choice.parses_output()) parsed = read_tool_calls(parsed_.tool_choice, split.content, id_seed_);
  else parsed.content = split.content;
  Json response = head(incomplete ? "incomplete" : "completed");
  // Only the last item can be cut short (a call: its arguments partial).
  const auto status = [&](bool last) { return incomplete && last ? "incomplete" : "completed"; };
  const bool answered = !parsed.content.empty() || !parsed.tool_calls.empty();
  if (!split.reasoning.empty())
    response["output"].push_back(reasoning_item(make_responses_id("rs"), split.reasoning, status(!answered)));
  if (!parsed.content.empty() || (parsed.tool_calls.empty() && split.reasoning.empty()))
    response["output"].push_back(
        message_item(make_responses_id("msg"), parsed.content, status(parsed.tool_calls.empty())));
  for (size_t i = 0; i < parsed.tool_calls.size(); ++i) {
    const toolcall::ToolCall& call = parsed.tool_calls[i];
    response["output"].push_back(call_item(make_responses_id("fc"), call.id, call.name, call.arguments,
                                           status(i + 1 == parsed.tool_calls.size())));
  }
  if (incomplete) response["incomplete_details"] = {{"reason", "max_output_tokens"}};
  response["usage"] = usage_json(usage);
  return response;
}

std::string ResponsesOutput::event(const char* type, Json fields) {
  fields["type"] = type;
  fields["sequence_number"] = sequence_++;
  return fmt::format("event: {}\ndata: {}\n\n", type, dump_json(fields));
}

std::string ResponsesOutput::start_events() {
  const Json response = head("in_progress");
  std::string events = event("response.created", {{"response", response}});
  return events + event("response.in_progress", {{"response", response}});
}

std::string ResponsesOutput::open_message() {
  open_ = Open::kMessage;
  text_.clear();
  item_ = message_item(make_responses_id("msg"), "", "in_progress");
  item_["content"] = Json::array();
  const auto index = output_.size();
  std::string events = event("response.output_item.added", {{"output_index", index}, {"item", item_}});
  return events + event("response.content_part.added",
                        {{"item_id", item_["id"]}, {"output_index", index}, {"content_index", 0}, {"part", text_part("")}});
}

std::string ResponsesOutput::open_reasoning() {
  open_ = Open::kReasoning;
  text_.clear();
  item_ = reasoning_item(make_responses_id("rs"), "", "in_progress");
  return event("response.output_item.added", {{"output_index", output_.size()}, {"item", item_}});
}

std::string ResponsesOutput::close_open_item(bool incomplete) {
  if (open_ == Open::kNone) return {};
  const auto index = output_.size();
  std::string events;
  if (open_ == Open::kMessage) {
    const Json fields = {{"item_id", item_["id"]}, {"output_index", index}, {"content_index", 0}};
    Json done = fields;
    done["text"] = text_;
    done["logprobs"] = Json::array();
    events += event("response.output_text.done", done);
    Json part = fields;
    part["part"] = text_part(text_);
    events += event("response.content_part.done", part);
    item_ = message_item(item_["id"], text_, incomplete ? "incomplete" : "completed");
  } else if (open_ == Open::kReasoning) {
    events += event("response.reasoning_text.done",
                    {{"item_id", item_["id"]}, {"output_index", index}, {"content_index", 0}, {"text", text_}});
    item_ = reasoning_item(item_["id"], text_, incomplete ? "incomplete" : "completed");
  } else {
    events += event("response.function_call_arguments.done", {{"item_id", item_["id"]},
                                                               {"output_index", index},
                                                               {"name", item_["name"]},
                                                               {"arguments", item_["arguments"]}});
    item_["status"] = incomplete ? "incomplete" : "completed";
  }
  events += event("response.output_item.done", {{"output_index", index}, {"item", item_}});
  output_.push_back(std::move(item_));
  item_ = nullptr;
  open_ = Open::kNone;
  return events;
}

std::string ResponsesOutput::output_events(const RequestOutput& output) {
  if (!splitter_) return answer_events(output);
  reasoning::ReasoningDelta split = output.finished ? splitter_->finish(output.text_delta) : splitter_->feed(output.text_delta);
  std::string events;
  if (!split.reasoning.empty()) {
    if (open_ == Open::kNone) events += open_reasoning();
    text_ += split.reasoning;
    events += event("response.reasoning_text.delta", {{"item_id", item_["id"]},
                                                      {"output_index", output_.size()},
                                                      {"content_index", 0},
                                                      {"delta", split.reasoning}});
  }
  RequestOutput answer = output;
  answer.text_delta = std::move(split.content);
  if (answer.text_delta.empty() && !answer.finished) return events;
  if (open_ == Open::kReasoning && splitter_->in_answer()) events += close_open_item(false);
  return events + answer_events(answer);
}

std::string ResponsesOutput::answer_events(const RequestOutput& output) {
  toolcall::StreamDelta released;
  if (reader_) released = reader_->next(output);
  else released.content = output.text_delta;
  std::string events;
  if (!released.content.empty()) {
    if (open_ == Open::kCall) events += close_open_item(false);
    if (open_ == Open::kNone) events += open_message();
    text_ += released.content;
    events += event("response.output_text.delta", {{"item_id", item_["id"]},
                                                    {"output_index", output_.size()},
                                                    {"content_index", 0},
                                                    {"delta", released.content},
                                                    {"logprobs", Json::array()}});
  }
  for (const toolcall::ToolCallDelta& delta : released.tool_calls) {
    if (delta.is_first()) {
      events += close_open_item(false);
      open_ = Open::kCall;
      call_index_ = delta.index;
      item_ = call_item(make_responses_id("fc"), delta.id, delta.name, "", "in_progress");
      events += event("response.output_item.added", {{"output_index", output_.size()}, {"item", item_}});
    }
    if (open_ != Open::kCall || delta.index != call_index_ || delta.arguments.empty()) continue;
    item_["arguments"] = item_["arguments"].get<std::string>() + delta.arguments;
    events += event("response.function_call_arguments.delta",
                    {{"item_id", item_["id"]}, {"output_index", output_.size()}, {"delta", delta.arguments}});
  }
  return events;
}

std::string ResponsesOutput::finish_events(FinishReason reason, const Usage& usage) {
  const bool incomplete = reason == FinishReason::kLength;
  std::string events = close_open_item(incomplete);
  if (output_.empty()) {  // one (empty) message, as the whole body has
    events += open_message();
    events += close_open_item(incomplete);
  }
  streamed_ = head(incomplete ? "incomplete" : "completed");
  streamed_["output"] = output_;
  if (incomplete) streamed_["incomplete_details"] = {{"reason", "max_output_tokens"}};
  streamed_["usage"] = usage_json(usage);
  return events + event(incomplete ? "response.incomplete" : "response.completed", {{"response", streamed_}});
}

std::string ResponsesOutput::error_event(const std::string& code, const std::string& message) {
  return event("error", {{"code", code}, {"message", message}, {"param", nullptr}});
}

}  // namespace loom::server
