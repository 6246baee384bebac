// util/progress.h: quiet for the first second, then a redrawn line at most
// every 100 ms with the share done, the amounts and the rate, finished by a
// last line and a newline; nothing at all without a terminal.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "util/progress.h"

namespace loom {
namespace {

using namespace std::chrono_literals;

struct Fake {
  std::vector<std::string> lines;
  Progress::Clock::time_point now{};
  Progress make(int64_t total, bool bytes = true) {
    return Progress("loading", total, bytes, [this](const std::string& line) { lines.push_back(line); },
                    [this] { return now; });
  }
};

TEST(ProgressTest, AQuickStepPrintsNothing) {
  Fake fake;
  {
    Progress progress = fake.make(100);
    fake.now += 900ms;
    progress.advance(100);
  }
  EXPECT_TRUE(fake.lines.empty());
}

TEST(ProgressTest, ASlowStepRedrawsAtMostTenTimesASecondAndEndsWithANewline) {
  Fake fake;
  {
    constexpr int64_t kStep = int64_t{100} << 20;
    Progress progress = fake.make(40 * kStep);
    for (int i = 0; i < 40; ++i) {  // 3.9 GiB over 2 s, a step every 50 ms
      fake.now += 50ms;
      progress.advance(kStep);
    }
  }
  ASSERT_GE(fake.lines.size(), 3u);
  // Drawn from the first second on, every other 50 ms step: about 10 + the last line + "\n".
  EXPECT_LE(fake.lines.size(), 14u);
  EXPECT_EQ(fake.lines.back(), "\n");
  EXPECT_EQ(fake.lines.front().rfind("loading: ", 0), 0u) << fake.lines.front();
  const std::string& last = fake.lines[fake.lines.size() - 2];
  EXPECT_NE(last.find("100% (3.9 GiB / 3.9 GiB, 2.0 GiB/s)"), std::string::npos) << last;
}

TEST(ProgressTest, ItemsAreCountedWithoutUnits) {
  Fake fake;
  Progress progress = fake.make(8, /*bytes=*/false);
  fake.now += 2s;
  progress.advance(4);
  EXPECT_EQ(progress.line(), "loading: 50% (4 / 8, 2 a second)");
}

TEST(ProgressTest, WithoutATerminalNothingIsDrawn) {
  Progress progress("loading", 10, true, nullptr, [] { return Progress::Clock::now() + 10s; });
  progress.advance(10);  // no sink: no crash, no output
  EXPECT_NE(progress.line().find("100%"), std::string::npos);
}

}  // namespace
}  // namespace loom
