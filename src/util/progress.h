// A progress line for long steps on a terminal (loading a model onto the GPU,
// writing a synthetic model, converting): "what: 42% (6.3 / 15.0 GiB, 1.2 GiB/s)"
// redrawn in place on stderr, shown only when stderr is a terminal and the
// step has taken more than a second (a quick step prints nothing, and logs
// and pipes never get carriage returns); finished with a newline.
//
// Thread: one Progress per thread; nested ones print independently.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace loom {

class Progress {
 public:
  using Clock = std::chrono::steady_clock;
  // `total` units (bytes when `bytes`, else items).
  Progress(std::string what, int64_t total, bool bytes = true);
  // For tests: where lines go (each a full redraw, without "\r"), and the clock.
  Progress(std::string what, int64_t total, bool bytes, std::function<void(const std::string&)> sink,
           std::function<Clock::time_point()> now);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void advance(int64_t units);
  // The line as it would be drawn now.
  std::string line() const;

 private:
  void draw(bool last);

  std::string what_;
  int64_t total_, done_ = 0;
  bool bytes_;
  std::function<void(const std::string&)> sink_;  // empty: not a terminal, draw nothing
  std::function<Clock::time_point()> now_;
  Clock::time_point start_, last_draw_;
  bool drawn_ = false;
};

}  // namespace loom
