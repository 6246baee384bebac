#include "cli/stop_signals.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>

#include "util/error.h"

namespace loom::cli {
namespace {

int g_signal_pipe[2] = {-1, -1};
std::atomic<int> g_num_signals{0};

void on_stop_signal(int signal_number) {
  if (g_num_signals.fetch_add(1) > 0) _exit(128 + signal_number);
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(signal_number);
  [[maybe_unused]] ssize_t ignored = write(g_signal_pipe[1], &byte, 1);
  errno = saved_errno;
}

}  // namespace

void install_stop_signals() {
  if (pipe2(g_signal_pipe, O_CLOEXEC) != 0) fail(ErrorKind::kInternal, "pipe2 failed: errno {}", errno);
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
}

StopSignalWatcher::StopSignalWatcher(std::function<void(int signal_number)> on_signal)
    : thread_([on_signal = std::move(on_signal)] {
        unsigned char signal_number = 0;
        while (read(g_signal_pipe[0], &signal_number, 1) < 0 && errno == EINTR) {
        }
        if (signal_number != 0) on_signal(signal_number);  // 0: woken by finish()
      }) {}

void StopSignalWatcher::finish() {
  if (!thread_.joinable()) return;
  const unsigned char wake = 0;
  [[maybe_unused]] ssize_t ignored = write(g_signal_pipe[1], &wake, 1);  // the watcher, if no signal came
  thread_.join();
}

}  // namespace loom::cli
