// SIGINT/SIGTERM for the long-running commands (`loom serve`, `loom router`),
// whichever thread receives them (libraries such as OpenBLAS start threads
// before main, with signals unblocked): the first one writes its number to a
// pipe that a watcher thread reads; a second one exits at once. SIGPIPE is
// ignored (a vanished peer is a failed write, not a crash).
#pragma once

#include <functional>
#include <thread>

namespace loom::cli {

// Once, before anything else: a signal that comes while the command is still
// starting waits in the pipe (the watcher then acts on it at once).
void install_stop_signals();

// Runs `on_signal(number)` on its own thread when the first signal comes.
// finish() (or the destructor) wakes it if none came, and joins it.
class StopSignalWatcher {
 public:
  explicit StopSignalWatcher(std::function<void(int signal_number)> on_signal);
  ~StopSignalWatcher() { finish(); }
  StopSignalWatcher(const StopSignalWatcher&) = delete;
  StopSignalWatcher& operator=(const StopSignalWatcher&) = delete;
  void finish();

 private:
  std::thread thread_;
};

}  // namespace loom::cli
