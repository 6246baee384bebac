// A reasoning model's thinking split from its answer, whole and streamed.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "reasoning/reasoning_parser.h"

namespace loom::reasoning {
namespace {

struct Case {
  std::string text;
  std::string reasoning, content;
};

// The text fed in pieces of `piece` bytes, then finished.
ReasoningDelta streamed(ReasoningKind kind, bool in_answer, const std::string& text, size_t piece) {
  ReasoningSplitter splitter(kind, in_answer);
  ReasoningDelta all;
  for (size_t at = 0; at < text.size(); at += piece) {
    const ReasoningDelta delta = splitter.feed(std::string_view(text).substr(at, piece));
    all.reasoning += delta.reasoning;
    all.content += delta.content;
  }
  const ReasoningDelta last = splitter.finish();
  all.reasoning += last.reasoning;
  all.content += last.content;
  return all;
}

TEST(ReasoningParserTest, SplitsAsVllmsThinkParsers) {
  const std::vector<Case> cases = {
      {"<think>\nplan it\n</think>\n\nThe answer.", "\nplan it\n", "\n\nThe answer."},
      {"  \n<think>a</think>b", "a", "b"},
      {"plan it</think>answer", "plan it", "answer"},      // DeepSeek-R1: <think> was in the prompt
      {"still thinking, cut by max_tokens", "still thinking, cut by max_tokens", ""},
      {"<think>never closed </thin", "never closed </thin", ""},
      {"<think></think>", "", ""},
      {"a</think>b</think>c", "a", "b</think>c"},           // only the first </think> ends it
      {"x<think>y</think>z", "x<think>y", "z"},             // <think> not at the start is reasoning text
      {"<thin", "<thin", ""},
      {"", "", ""},
      {"é</think>ü", "é", "ü"}};
  for (ReasoningKind kind : {ReasoningKind::kQwen3, ReasoningKind::kDeepSeekR1}) {
    for (const Case& c : cases) {
      const ReasoningDelta whole = split_reasoning(kind, false, c.text);
      EXPECT_EQ(whole.reasoning, c.reasoning) << c.text;
      EXPECT_EQ(whole.content, c.content) << c.text;
      for (size_t piece = 1; piece <= c.text.size(); ++piece) {
        const ReasoningDelta pieces = streamed(kind, false, c.text, piece);
        EXPECT_EQ(pieces.reasoning, c.reasoning) << c.text << " in pieces of " << piece;
        EXPECT_EQ(pieces.content, c.content) << c.text << " in pieces of " << piece;
      }
    }
  }
}

TEST(ReasoningParserTest, AnswerOnlyWithoutAParserOrWhenThePromptClosedTheThinking) {
  const std::string text = "<think>a</think>b";
  EXPECT_EQ(split_reasoning(ReasoningKind::kNone, false, text).content, text);
  EXPECT_EQ(split_reasoning(ReasoningKind::kQwen3, true, text).content, text);
  EXPECT_TRUE(split_reasoning(ReasoningKind::kQwen3, true, text).reasoning.empty());

  EXPECT_TRUE(starts_in_answer(ReasoningKind::kNone, "", true));
  EXPECT_TRUE(starts_in_answer(ReasoningKind::kQwen3, "<|im_start|>assistant\n<think>\n\n</think>\n\n", true));
  EXPECT_TRUE(starts_in_answer(ReasoningKind::kQwen3, "<|im_start|>assistant\n", false));  // enable_thinking false
  EXPECT_FALSE(starts_in_answer(ReasoningKind::kQwen3, "<|im_start|>assistant\n", true));
  EXPECT_FALSE(starts_in_answer(ReasoningKind::kDeepSeekR1, "<｜Assistant｜><think>\n", false));
  EXPECT_TRUE(starts_in_answer(ReasoningKind::kDeepSeekR1, "<｜Assistant｜><think>\n</think>", true));
}

TEST(ReasoningParserTest, StreamingHoldsBackOnlyWhatMayBeAMarker) {
  ReasoningSplitter splitter(ReasoningKind::kQwen3, false);
  EXPECT_EQ(splitter.feed("\n<thi").reasoning, "");
  EXPECT_EQ(splitter.feed("nk>plan").reasoning, "plan");
  EXPECT_EQ(splitter.feed(" more</th").reasoning, " more");
  EXPECT_FALSE(splitter.in_answer());
  const ReasoningDelta end = splitter.feed("ink>ans");
  EXPECT_EQ(end.reasoning, "");
  EXPECT_EQ(end.content, "ans");
  EXPECT_TRUE(splitter.in_answer());
  EXPECT_EQ(splitter.feed("</think>").content, "</think>");

  EXPECT_EQ(reasoning_parser_from_name("deepseek_r1"), ReasoningKind::kDeepSeekR1);
  EXPECT_EQ(reasoning_parser_from_name("qwen3"), ReasoningKind::kQwen3);
  EXPECT_EQ(reasoning_parser_from_name("none"), ReasoningKind::kNone);
  EXPECT_EQ(reasoning_parser_from_name("granite"), std::nullopt);
}

}  // namespace
}  // namespace loom::reasoning
