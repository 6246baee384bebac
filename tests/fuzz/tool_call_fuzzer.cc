// libFuzzer target: the tool-call parsers (src/toolcall) on model output,
// which is untrusted text. Input: byte 0 picks the convention, byte 1 seeds
// how the rest is cut into streamed pieces; the rest is the output. Checks:
// nothing throws or breaks an invariant; the streamed parse (pieces of 0..15
// bytes) gives exactly the whole-text content and calls, ids included; every
// call has a name and arguments that are a JSON object; the forced-output
// readers (tool_choice required / named) never throw.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "toolcall/forced_calls.h"
#include "toolcall/tool_call_parser.h"
#include "util/prng.h"

namespace {

using namespace loom::toolcall;

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "tool-call parser: %s\n", what);
  std::abort();
}

void check_calls(const std::vector<ToolCall>& calls) {
  for (const ToolCall& call : calls) {
    if (call.name.empty() || call.id.empty()) finding("a call without a name or id");
    const auto arguments = nlohmann::json::parse(call.arguments, nullptr, false);
    if (!arguments.is_object()) finding("arguments that are not a JSON object");
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  loom::fuzz::quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  constexpr ParserKind kKinds[] = {ParserKind::kHermes, ParserKind::kLlama3Json, ParserKind::kMistral,
                                   ParserKind::kNone};
  const ParserKind kind = kKinds[data[0] % 4];
  const std::string_view text(reinterpret_cast<const char*>(data) + 2, size - 2);
  constexpr uint64_t kSeed = 11;

  const ParsedOutput whole = parse_tool_calls(kind, text, kSeed);
  check_calls(whole.tool_calls);

  ToolCallParser parser(kind, kSeed);
  ParsedOutput streamed;
  auto add = [&](const StreamDelta& delta) {
    streamed.content += delta.content;
    for (const ToolCallDelta& piece : delta.tool_calls) {
      if (piece.is_first()) {
        if (piece.index != static_cast<int32_t>(streamed.tool_calls.size())) finding("call index out of order");
        streamed.tool_calls.push_back({piece.id, piece.name, ""});
      } else {
        if (streamed.tool_calls.empty() || piece.index + 1 != static_cast<int32_t>(streamed.tool_calls.size()))
          finding("arguments for a call that was not opened");
        streamed.tool_calls.back().arguments += piece.arguments;
      }
    }
  };
  loom::Prng cuts(data[1]);
  for (size_t position = 0; position < text.size();) {
    const size_t length = std::min<size_t>(cuts.next_below(16), text.size() - position);
    add(parser.feed(text.substr(position, length)));
    position += length;
  }
  add(parser.finish());
  if (streamed.content != whole.content) finding("streamed content differs from the whole-text content");
  if (streamed.tool_calls != whole.tool_calls) finding("streamed calls differ from the whole-text calls");

  CallIdGenerator ids(ParserKind::kNone, kSeed);
  if (auto calls = parse_required_output(text, {"f", "get_weather"}, ids)) check_calls(*calls);
  if (auto call = parse_named_output("f", text, ids)) check_calls({*call});
  return 0;
}
