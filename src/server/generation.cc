#include "server/generation.h"

#include <algorithm>
#include <ctime>
#include <mutex>
#include <set>
#include <thread>

#include <spdlog/spdlog.h>

namespace loom::server {

using std::chrono::milliseconds;

Usage Generation::usage() const {
  Usage usage;
  for (const auto& prompt : request.prompts) usage.prompt_tokens += static_cast<int64_t>(prompt.size());
  for (const auto& result : results) {
    usage.completion_tokens += result.num_output_tokens;
    usage.reasoning_tokens += result.num_reasoning_tokens;
  }
  // Each prompt counts once, as its tokens do: its first choice's cache hits.
  for (size_t prompt = 0; prompt < request.prompts.size(); ++prompt)
    usage.cached_tokens += results[prompt * static_cast<size_t>(request.n)].num_cached_prompt_tokens;
  return usage;
}

void Generation::record(int32_t index, const RequestOutput& output) {
  ChoiceResult& result = results[static_cast<size_t>(index)];
  if (!first_token_at && !output.new_tokens.empty()) first_token_at = Clock::now();
  result.text += output.text_delta;
  result.tokens.insert(result.tokens.end(), output.new_tokens.begin(), output.new_tokens.end());
  const int32_t before = result.num_output_tokens;
  result.num_output_tokens = std::max<int32_t>(output.num_output_tokens, static_cast<int32_t>(result.tokens.size()));
  if (!reasoning_trackers.empty()) {
    reasoning::ReasoningSplitter& tracker = reasoning_trackers[static_cast<size_t>(index)];
    if (!tracker.in_answer()) {
      result.num_reasoning_tokens += result.num_output_tokens - before;
      tracker.feed(output.text_delta);
    }
  }
  result.num_cached_prompt_tokens = std::max(result.num_cached_prompt_tokens, output.num_cached_prompt_tokens);
  if (output.finished && !result.finished) {
    result.finished = true;
    result.finish_reason = output.finish_reason;
    --num_unfinished;
    if (output.error && !error) error = output.error;
  }
}

std::vector<std::pair<int32_t, RequestOutput>> Generation::poll(milliseconds timeout) {
  std::vector<std::pair<int32_t, RequestOutput>> outputs;
  std::vector<int32_t> open;
  for (size_t i = 0; i < streams.size(); ++i)
    if (!results[i].finished) open.push_back(static_cast<int32_t>(i));
  if (open.size() == 1) {
    if (auto output = streams[open[0]]->next(timeout)) outputs.emplace_back(open[0], std::move(*output));
    return outputs;
  }
  const auto deadline = Clock::now() + timeout;
  do {
    for (int32_t index : open)
      while (auto output = streams[index]->next(milliseconds(0))) {
        const bool finished = output->finished;
        outputs.emplace_back(index, std::move(*output));
        if (finished) break;
      }
    if (!outputs.empty()) break;
    std::this_thread::sleep_for(milliseconds(2));
  } while (Clock::now() < deadline);
  return outputs;
}

void Generation::cancel_all() {
  for (auto& stream : streams) stream->cancel();
}

std::shared_ptr<Generation> submit_generation(Engine& engine, const Tokenizer& tokenizer, ParsedRequest parsed,
                                              std::string id, const std::string& system_fingerprint) {
  auto generation = std::make_shared<Generation>();
  generation->request = std::move(parsed);
  const int32_t num_choices = generation->request.num_choices();
  generation->builder = std::make_unique<ResponseBuilder>(generation->request, tokenizer, std::move(id),
                                                         std::time(nullptr), system_fingerprint);
  generation->results.resize(static_cast<size_t>(num_choices));
  generation->num_unfinished = num_choices;
  const ReasoningSetup& reasoning = generation->request.reasoning;
  if (reasoning.active())
    generation->reasoning_trackers.assign(static_cast<size_t>(num_choices),
                                          reasoning::ReasoningSplitter(reasoning.kind, reasoning.starts_in_answer));
  std::vector<EngineRequest> requests;
  requests.reserve(static_cast<size_t>(num_choices));
  for (int32_t index = 0; index < num_choices; ++index) requests.push_back(generation->request.engine_request(index));
  try {
    generation->streams = engine.submit_all(std::move(requests));  // all or none
  } catch (const Error& error) {
    throw api_error_from(error, error.kind() == ErrorKind::kNotFound ? "model" : "");
  }
  return generation;
}

bool left_before_handling(const HttpRequest& request, bool log_requests) {
  if (!request.client_gone()) return false;
  if (log_requests) spdlog::info("request {} {} status=abandoned: the client left before it was handled", request.method,
                                 request.path);
  return true;
}

bool wait_for_generation(Generation& generation, const std::atomic<bool>& ending, const HttpRequest& request,
                         bool log_requests) {
  while (generation.num_unfinished > 0) {
    auto outputs = generation.poll(milliseconds(100));
    for (auto& [index, output] : outputs) generation.record(index, output);
    if (ending.load()) {
      generation.cancel_all();
      log_finished(log_requests, generation, "503");
      throw shutting_down_error();
    }
    if (request.client_gone()) {
      spdlog::debug("client left request {}: cancelling", generation.builder->id());
      generation.cancel_all();
      log_finished(log_requests, generation, "cancelled");
      return false;
    }
  }
  if (generation.error) {
    const ApiError error = api_error_from(*generation.error);
    log_finished(log_requests, generation, std::to_string(error.status()));
    throw error;
  }
  log_finished(log_requests, generation, "200");
  return true;
}

void log_finished(bool enabled, const Generation& generation, std::string_view status) {
  if (!enabled) return;
  const Usage usage = generation.usage();
  std::string finish;
  for (const ChoiceResult& result : generation.results) {
    if (!finish.empty()) finish += ',';
    finish += result.finished ? finish_reason_name(result.finish_reason) : "-";
  }
  const auto seconds = [&](Generation::Clock::time_point at) {
    return std::chrono::duration<double>(at - generation.started).count();
  };
  spdlog::info("request {} model={} adapter={} status={} finish={} prompt={} cached={} output={} ttft={} total={:.3f}s{}",
               generation.builder->id(), generation.request.model,
               generation.request.adapter.empty() ? "-" : generation.request.adapter, status, finish,
               usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens,
               generation.first_token_at ? fmt::format("{:.3f}s", seconds(*generation.first_token_at)) : "-",
               seconds(Generation::Clock::now()),
               generation.error ? fmt::format(" error=\"{}\"", generation.error->what()) : "");
}

ApiError shutting_down_error() {
  return ApiError(503, "the server is shutting down", "server_error", "", "server_shutting_down");
}

std::string note_unenforced_keywords(const std::vector<std::string>& keywords) {
  static std::mutex mutex;
  static std::set<std::string> logged;
  std::string list;
  std::lock_guard lock(mutex);
  for (const std::string& keyword : keywords) {
    list += (list.empty() ? "" : ", ") + keyword;
    if (logged.insert(keyword).second)
      spdlog::warn("JSON schema keyword '{}' is served unenforced (no grammar here can enforce it; the request "
                   "did not say \"strict\": true); such responses carry the header {}",
                   keyword, kSchemaUnenforcedHeader);
  }
  return list;
}

}  // namespace loom::server
