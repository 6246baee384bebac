// The `loom` binary as users run it: make-model, generate (--json), and clear
// errors with exit status 2 for bad input.
#include <gtest/gtest.h>

#include <fstream>

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
  // stdout is the JSON alone (logs go to stderr): it pipes into a JSON tool.
  CommandResult piped = run(common + " 2>/dev/null | python3 -m json.tool");
  EXPECT_EQ(piped.exit_code, 0) << piped.output;
  EXPECT_EQ(nlohmann::json::parse(piped.output)["tokens"], base_json["tokens"]);
  CommandResult logs_only = test::run_command("{ " + test::loom_binary() + " " + common + " 2>&1 >/dev/null; }");
  EXPECT_NE(logs_only.output.find("[info]"), std::string::npos) << logs_only.output;
  EXPECT_EQ(logs_only.output.find("\"tokens\""), std::string::npos) << logs_only.output;
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

// -tp N on the CPU: ranks on threads, the same greedy tokens as one rank, with an adapter too.
TEST_F(CliTest, TensorParallelGenerateGivesTheSameTokens) {
  const std::string common = "generate --model " + model() +
                             " --raw --prompt 'the loom weaves a cloth of many threads' --max-tokens 8 --ignore-eos "
                             "--json --lora coder=" + model() + "/adapters/adapter0:forked --adapter coder";
  CommandResult whole = run(common);
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  // The model has 6 heads and 2 kv heads: one kv head per rank.
  CommandResult sharded = run(common + " --tensor-parallel-size 2");
  ASSERT_EQ(sharded.exit_code, 0) << sharded.output;
  EXPECT_EQ(parse_json_output(sharded.output)["tokens"], parse_json_output(whole.output)["tokens"]);
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

// `loom serve --dry-run`: the effective configuration as JSON.
nlohmann::json dry_run(const std::string& model, const std::string& flags) {
  CommandResult result = run("serve --model " + model + " --dry-run " + flags);
  EXPECT_EQ(result.exit_code, 0) << flags << "\n" << result.output;
  return result.exit_code == 0 ? parse_json_output(result.output) : nlohmann::json();
}

TEST_F(CliTest, ServeBlockSizeIsFourOnTheCpuUnlessGiven) {
  // Small blocks keep a warm prompt's recomputed tail short (device_backend.h).
  EXPECT_EQ(dry_run(model(), "")["block_size"], 4);
  EXPECT_EQ(dry_run(model(), "--block-size 16")["block_size"], 16);
  EXPECT_NE(run("serve --model " + model() + " --dry-run --block-size 0").exit_code, 0);
}

TEST_F(CliTest, VllmServeFlagsMapToTheSameConfigAsLoomsSpellings) {
  const std::string adapter = model() + "/adapters/adapter0";
  const nlohmann::json loom = dry_run(model(), "--max-running-requests 7 --max-batch-tokens 512 --max-context-tokens 1024 "
                                               "--max-loras-per-batch 3 --lora a=" + adapter + " --lora b=" + adapter +
                                               " --kv-cache-bytes 67108864");
  const nlohmann::json vllm = dry_run(
      model(), "--max-num-seqs 7 --max-num-batched-tokens 512 --max-model-len 1024 --max-loras 3 --lora-modules a=" +
                   adapter + " '{\"name\": \"b\", \"path\": \"" + adapter + "\"}' --kv-cache-bytes 64M " +
                   "--enable-prefix-caching --enable-lora --trust-remote-code --dtype auto -tp 1 " +
                   "--disable-log-requests --kv-cache-dtype auto");
  EXPECT_EQ(loom, vllm);
  EXPECT_EQ(vllm["max_running_requests"], 7);
  EXPECT_EQ(vllm["max_context_tokens"], 1024);
  EXPECT_EQ(vllm["kv_cache_bytes"], 64 << 20);
  EXPECT_EQ(vllm["adapters"].size(), 2u);
  // Several served names; the first is canonical. Sizes read the same everywhere.
  const nlohmann::json names = dry_run(model(), "--served-model-name one two --kv-cache-bytes 1G --seed 9 -v");
  EXPECT_EQ(names["served_model_names"], nlohmann::json::parse(R"(["one", "two"])"));
  EXPECT_EQ(names["kv_cache_bytes"], int64_t{1} << 30);
  EXPECT_EQ(names["seed"], 9);
  const nlohmann::json disk = dry_run(model(), "--host-kv-memory 1M --disk-kv-path /tmp/loom-cli-disk --disk-kv-bytes 2G "
                                               "--disk-kv-warm-start --disk-kv-read-bandwidth 100M");
  EXPECT_EQ(disk["disk_kv_path"], "/tmp/loom-cli-disk");
  EXPECT_EQ(disk["disk_kv_bytes"], int64_t{2} << 30);
  EXPECT_EQ(disk["disk_kv_warm_start"], true);
  EXPECT_EQ(disk["disk_kv_read_bandwidth"], 100 << 20);
  EXPECT_EQ(names["disk_kv_path"], nullptr);
  // The KV pool's size: 1 GiB on the CPU; on a GPU vLLM's 0.9 of the card unless a size is given.
  EXPECT_EQ(names["gpu_memory_fraction"], 0.0);
  const nlohmann::json on_gpu = dry_run(model(), "--device cuda");
  EXPECT_EQ(on_gpu["gpu_memory_fraction"], 0.9);
  EXPECT_TRUE(on_gpu["kv_cache_bytes"].is_null());  // sized from the fraction at start
  EXPECT_EQ(dry_run(model(), "--device cuda --gpu-memory-utilization 0.5")["gpu_memory_fraction"], 0.5);
  const nlohmann::json sized = dry_run(model(), "--device cuda --kv-cache-bytes 2G");
  EXPECT_EQ(sized["gpu_memory_fraction"], 0.0);
  EXPECT_EQ(sized["kv_cache_bytes"], int64_t{2} << 30);
  // --generation-config: auto (the model directory's file, if any), vllm (OpenAI's), or a directory.
  test::TempDir generation;
  std::ofstream(generation.path() / "generation_config.json") << R"({"temperature": 0.25, "top_k": 7})";
  const nlohmann::json from_dir = dry_run(model(), "--generation-config " + generation.str());
  EXPECT_EQ(from_dir["sampling_defaults"]["temperature"], 0.25);
  EXPECT_EQ(from_dir["sampling_defaults"]["top_k"], 7);
  EXPECT_EQ(dry_run(model(), "--generation-config vllm")["generation_config"], nullptr);
  EXPECT_EQ(dry_run(model(), "--generation-config vllm")["sampling_defaults"]["temperature"], 1.0);
}

TEST_F(CliTest, VllmFlagsLoomLacksAndBadDeploymentsFailNamingWhatToDo) {
  const std::string adapter = model() + "/adapters/adapter0";
  struct Case {
    std::string flags, expected;
  };
  for (const Case& c : std::vector<Case>{
           {"--max-model-len 100000", "max_position_embeddings"},
           {"--max-context-tokens 100000", "max_position_embeddings"},
           {"--swap-space 4", "--host-kv-memory"},
           {"--speculative-config '{}'", "speculative"},
           {"--no-enable-prefix-caching", "prefix cache"},
           {"-tp 3", "power of two"},
           {"-tp 4", "6 attention heads"},
           {"-pp 2", "--tensor-parallel-size"},
           {"--dtype float16", "float32"},
           {"--gpu-memory-utilization 0.9", "--kv-cache-bytes"},
           {"--kv-cache-bytes 1Q", "512K"},
           {"--served-model-name base --lora base=" + adapter, "given twice"},
           {"--lora x=" + adapter + " --lora-modules x=" + adapter, "given twice"},
           {"--lora-modules '{\"name\": \"x\"}'", "--lora-modules"},
           {"--disk-kv-path /tmp/loom-cli-disk", "--host-kv-memory"},
           {"--disk-kv-path /tmp/loom-cli-disk --host-kv-memory 1M", "--disk-kv-bytes"},
           {"--kv-transfer-config '{}'", "--disk-kv-path"},
           {"--calculate-kv-scales", "kv_cache_scheme"},
           {"--generation-config /nonexistent-loom-dir", "not a directory"},
       }) {
    CommandResult result = run("serve --model " + model() + " --dry-run " + c.flags);
    EXPECT_EQ(result.exit_code, 2) << c.flags << "\n" << result.output;
    EXPECT_NE(result.output.find(c.expected), std::string::npos) << c.flags << "\n" << result.output;
  }
  CommandResult version = run("--version");
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_NE(version.output.find('.'), std::string::npos) << version.output;
  CommandResult help = run("serve --help");
  EXPECT_NE(help.output.find("=8000"), std::string::npos) << "defaults in --help";
}

TEST_F(CliTest, KvEventsConfigTakesVllmsJson) {
  EXPECT_TRUE(dry_run(model(), "")["kv_events"].is_null());
  const nlohmann::json on = dry_run(
      model(), R"(--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", )"
               R"("topic": "kv-events", "hwm": 1000, "buffer_steps": 10, "max_queue_size": 5, "replay_endpoint": null}')");
  EXPECT_EQ(on["kv_events"], nlohmann::json::parse(R"({"endpoint": "tcp://*:5557", "topic": "kv-events", "hwm": 1000})"));
  const nlohmann::json replay = dry_run(
      model(), R"(--kv-events-config '{"enable_kv_cache_events": true, "replay_endpoint": "tcp://*:5558", )"
               R"("buffer_steps": 64}')");
  EXPECT_EQ(replay["kv_events"]["replay_endpoint"], "tcp://*:5558");
  EXPECT_EQ(replay["kv_events"]["buffer_steps"], 64);
  // vLLM's defaults: the zmq publisher once enabled (endpoint tcp://*:5557, topic ""); nothing unless enabled.
  EXPECT_EQ(dry_run(model(), R"(--kv-events-config '{"enable_kv_cache_events": true}')")["kv_events"]["endpoint"],
            "tcp://*:5557");
  EXPECT_TRUE(dry_run(model(), R"(--kv-events-config '{"publisher": "zmq"}')")["kv_events"].is_null());
  EXPECT_TRUE(dry_run(model(), R"(--kv-events-config '{"enable_kv_cache_events": true, "publisher": "null"}')")
                  ["kv_events"].is_null());
  struct Case {
    std::string json, expected;
  };
  for (const Case& c : std::vector<Case>{
           {"not json", "not a JSON object"},
           {R"({"enable_kv_cache_events": true, "publisher": "kafka"})", "unknown publisher"},
           {R"({"enable_kv_cache_events": true, "replay_endpoint": 5558})", "\"replay_endpoint\" must be a ZMQ address"},
           {R"({"enable_kv_cache_events": true, "buffer_steps": 0})", "\"buffer_steps\""},
           {R"({"enable_kv_cache_events": true, "endpoint": 5557})", "\"endpoint\" must be a string"},
           {R"({"enable_kv_cache_events": true, "hwm": -1})", "\"hwm\""},
           {R"({"enable_kv_cache_events": true, "topics": "x"})", "unknown key \"topics\""},
       }) {
    CommandResult result = run("serve --model " + model() + " --dry-run --kv-events-config '" + c.json + "'");
    EXPECT_EQ(result.exit_code, 2) << c.json << "\n" << result.output;
    EXPECT_NE(result.output.find(c.expected), std::string::npos) << c.json << "\n" << result.output;
  }
}

}  // namespace
}  // namespace loom
