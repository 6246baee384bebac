#include "util/progress.h"

#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>

namespace loom {

namespace {

constexpr auto kQuietFor = std::chrono::seconds(1);
constexpr auto kRedrawEvery = std::chrono::milliseconds(100);

std::string amount(double value, bool bytes) {
  if (!bytes) return fmt::format("{:.0f}", value);
  if (value >= double(1 << 30)) return fmt::format("{:.1f} GiB", value / double(1 << 30));
  return fmt::format("{:.1f} MiB", value / double(1 << 20));
}

}  // namespace

Progress::Progress(std::string what, int64_t total, bool bytes)
    : Progress(std::move(what), total, bytes,
               ::isatty(STDERR_FILENO) != 0
                   ? std::function<void(const std::string&)>([](const std::string& text) {
                       std::fprintf(stderr, "\r%s\033[K", text.c_str());
                       std::fflush(stderr);
                     })
                   : nullptr,
               [] { return Clock::now(); }) {}

Progress::Progress(std::string what, int64_t total, bool bytes, std::function<void(const std::string&)> sink,
                   std::function<Clock::time_point()> now)
    : what_(std::move(what)), total_(total), bytes_(bytes), sink_(std::move(sink)), now_(std::move(now)) {
  start_ = last_draw_ = now_();
}

Progress::~Progress() {
  if (drawn_) {
    draw(true);
    if (sink_) sink_("\n");
  }
}

void Progress::advance(int64_t units) {
  done_ += units;
  if (!sink_) return;
  const Clock::time_point now = now_();
  if (now - start_ < kQuietFor || (drawn_ && now - last_draw_ < kRedrawEvery)) return;
  draw(false);
}

std::string Progress::line() const {
  const double seconds = std::chrono::duration<double>(now_() - start_).count();
  const double percent = total_ > 0 ? 100.0 * double(done_) / double(total_) : 100.0;
  return fmt::format("{}: {:.0f}% ({} / {}{})", what_, percent, amount(double(done_), bytes_),
                     amount(double(total_), bytes_),
                     seconds > 0 ? ", " + amount(double(done_) / seconds, bytes_) + (bytes_ ? "/s" : " a second") : "");
}

void Progress::draw(bool last) {
  if (!sink_) return;
  if (!last || drawn_) sink_(line());
  drawn_ = true;
  last_draw_ = now_();
}

}  // namespace loom
