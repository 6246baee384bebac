// The `loom` binary as users run it: make-model, generate (--json), and clear
// errors with exit status 2 for bad input.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace loom {
namespace {

using test::CommandResult;

CommandResult run(const std::string& arguments) { return test::run_command(test::loom_binary() + " " + arguments); }

// The JSON object `loom generate --json` prints (the log line follows it).
nlohmann::json parse_json_output(const std::string& output) {
  const size_t begin = output.find('{');
  const size_t end = output.rfind("\n}");
  EXPECT_NE(begin, std::string::npos) << output;
  EXPECT_NE(end, std::string::npos) << output;
  return nlohmann::json::parse(output.substr(begin, end + 2 - begin));
}

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = new test::TempDir();
    CommandResult made = run("make-model --arch qwen2 --preset tiny --adapters 2 --rank 4 --out " + model());
    ASSERT_EQ(made.exit_code, 0) << made.output;
  }
  static void TearDownTestSuite() {
    delete directory_;
    directory_ = nullptr;
  }
  static std::string model() { return directory_->str() + "/model"; }
  static test::TempDir* directory_;
};
test::TempDir* CliTest::directory_ = nullptr;

TEST_F(CliTest, GenerateJsonIsDeterministicAndAdaptersChangeTheOutput) {
  const std::string common = "generate --model " + model() + " --raw --prompt 'the loom weaves' --max-tokens 6 --ignore-eos --json";
  CommandResult base = run(common);
  ASSERT_EQ(base.exit_code, 0) << base.output;
  nlohmann::json base_json = parse_json_output(base.output);
  ASSERT_EQ(base_json["tokens"].size(), 6u);
  ASSERT_EQ(base_json["logprobs"].size(), 6u);
  EXPECT_EQ(base_json["finish_reason"], "length");
  for (const auto& logprob : base_json["logprobs"]) EXPECT_LE(logprob.get<double>(), 0.0);

  CommandResult again = run(common);
  EXPECT_EQ(parse_json_output(again.output)["tokens"], base_json["tokens"]);

  CommandResult adapted = run(common + " --lora coder=" + model() + "/adapters/adapter0 --adapter coder");
  ASSERT_EQ(adapted.exit_code, 0) << adapted.output;
  EXPECT_NE(parse_json_output(adapted.output)["tokens"], base_json["tokens"]);
}

TEST_F(CliTest, GenerateHonoursTheKvSharingModeOfLora) {
  const std::string common = "generate --model " + model() +
                             " --raw --prompt 'the loom weaves a cloth of many threads' --max-tokens 6 --ignore-eos "
                             "--json --lora coder=" + model() + "/adapters/adapter0";
  auto tokens_of = [&](const std::string& arguments) {
    CommandResult result = run(arguments);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return result.exit_code == 0 ? parse_json_output(result.output)["tokens"] : nlohmann::json();
  };
  const nlohmann::json isolated = tokens_of(common + ":isolated");
  EXPECT_EQ(tokens_of(common), isolated);              // the adapter's own choice: isolated
  EXPECT_EQ(tokens_of(common + ":forked"), isolated);  // one agent alone: the same math
  const nlohmann::json base_model =
      tokens_of("generate --model " + model() +
                " --raw --prompt 'the loom weaves a cloth of many threads' --max-tokens 6 --ignore-eos --json");
  const nlohmann::json base_mode = tokens_of(common + ":base");
  EXPECT_NE(base_mode, base_model);  // the decoder row is the adapter's

  CommandResult activated = run(common + ":activated");  // no alora_invocation_tokens in its config
  EXPECT_EQ(activated.exit_code, 2);
  EXPECT_NE(activated.output.find("alora_invocation_tokens"), std::string::npos) << activated.output;
  CommandResult bogus = run(common + ":shared");
  EXPECT_EQ(bogus.exit_code, 2);
  EXPECT_NE(bogus.output.find("isolated, activated, base, forked"), std::string::npos) << bogus.output;
  CommandResult bad_size = run("serve --model " + model() + " --residual-kv-cache-memory 12Q");
  EXPECT_EQ(bad_size.exit_code, 2);
  EXPECT_NE(bad_size.output.find("--residual-kv-cache-memory"), std::string::npos) << bad_size.output;
  CommandResult bad_host_size = run("serve --model " + model() + " --host-residual-kv-memory 1X");
  EXPECT_EQ(bad_host_size.exit_code, 2);
  EXPECT_NE(bad_host_size.output.find("--host-residual-kv-memory"), std::string::npos) << bad_host_size.output;
}

TEST_F(CliTest, SampledGenerationDependsOnTheSeed) {
  const std::string common = "generate --model " + model() +
                             " --raw --prompt 'x' --max-tokens 12 --ignore-eos --json --temperature 1.5 --seed ";
  nlohmann::json first = parse_json_output(run(common + "1").output);
  nlohmann::json repeat = parse_json_output(run(common + "1").output);
  nlohmann::json other = parse_json_output(run(common + "2").output);
  EXPECT_EQ(first["tokens"], repeat["tokens"]);
  EXPECT_NE(first["tokens"], other["tokens"]);
}

TEST_F(CliTest, BadInputGivesAClearErrorAndStatus2) {
  CommandResult missing = run("generate --model " + directory_->str() + "/nothing --prompt hi");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.output.find("nothing"), std::string::npos) << missing.output;

  CommandResult unknown_adapter = run("generate --model " + model() + " --adapter nobody --prompt hi");
  EXPECT_EQ(unknown_adapter.exit_code, 2);
  EXPECT_NE(unknown_adapter.output.find("nobody"), std::string::npos) << unknown_adapter.output;

  CommandResult too_long = run("generate --model " + model() + " --raw --prompt hi --max-tokens 100000000");
  EXPECT_EQ(too_long.exit_code, 2);
  EXPECT_NE(too_long.output.find("context"), std::string::npos) << too_long.output;

  CommandResult bad_messages = run("generate --model " + model() + " --messages '[{\"role\": 1}]'");
  EXPECT_EQ(bad_messages.exit_code, 2);
  EXPECT_NE(bad_messages.output.find("role"), std::string::npos) << bad_messages.output;
}

}  // namespace
}  // namespace loom
