// libFuzzer target: /v1/completions and /v1/chat/completions bodies
// (server::parse_openai_request), each input on both endpoints, with a small
// synthetic ChatML tokenizer. As the HTTP server does, the nesting guard runs
// first. A rejection must be an ApiError below 500 whose body serialises.
#include <cstdio>
#include <memory>
#include <string_view>

#include "chat/chat_renderer.h"
#include "fuzz_util.h"
#include "server/api_error.h"
#include "server/openai_request.h"
#include "synthetic/synthetic_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "util/json_nesting.h"

namespace {

std::shared_ptr<const loom::Tokenizer>& tokenizer() {
  static std::shared_ptr<const loom::Tokenizer> instance;
  return instance;
}

std::unique_ptr<const loom::ChatRenderer>& chat_renderer() {
  static std::unique_ptr<const loom::ChatRenderer> instance;
  return instance;
}

void parse(loom::server::Endpoint endpoint, std::string_view body) {
  loom::server::ParseContext context;
  context.tokenizer = tokenizer().get();
  context.chat_renderer = chat_renderer().get();
  context.base_model_names = {"tiny", "/models/tiny"};
  context.has_adapter = [](const std::string& name) { return name == "agent0" || name == "agent1"; };
  context.max_context_tokens = 256;
  try {
    loom::check_json_nesting(body, "the body");
    const loom::server::ParsedRequest parsed = loom::server::parse_openai_request(endpoint, body, context);
    for (int32_t choice = 0; choice < parsed.num_choices(); ++choice) (void)parsed.engine_request(choice);
  } catch (const loom::server::ApiError& error) {
    const std::string response = error.body();
    if (error.status() >= 500) {
      std::fprintf(stderr, "status %d from a client's body: %s\n", error.status(), response.c_str());
      std::abort();
    }
  } catch (const loom::Error& error) {
    loom::fuzz::check_clean(error);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  loom::fuzz::quiet_logs();
  const loom::SyntheticTokenizer synthetic =
      loom::make_synthetic_tokenizer(512, loom::SyntheticPreTokenizer::kSmolLM);
  const std::string tokenizer_path = loom::fuzz::write_scratch_file("tokenizer.json", synthetic.tokenizer_json);
  const std::string config_path =
      loom::fuzz::write_scratch_file("tokenizer_config.json", synthetic.tokenizer_config_json);
  tokenizer() = loom::Tokenizer::from_hf_json_file(tokenizer_path, config_path);
  chat_renderer() = std::make_unique<const loom::ChatRenderer>(tokenizer()->model_chat_templates());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  parse(loom::server::Endpoint::kCompletions, body);
  parse(loom::server::Endpoint::kChatCompletions, body);
  return 0;
}
