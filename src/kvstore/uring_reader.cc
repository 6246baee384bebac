#include "kvstore/uring_reader.h"

#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>

#include <spdlog/spdlog.h>

namespace loom {

namespace {

constexpr int kMaxQueueDepth = 4096;
std::atomic<bool> g_logged_uring_failure{false};

void log_uring_failure_once(const char* what, int error) {
  if (!g_logged_uring_failure.exchange(true)) {
    spdlog::warn("disk KV tier: io_uring {} failed ({}): reading with pread instead (logged once)", what,
                 std::strerror(error));
  }
}

bool is_done(const FileRead& read) { return read.error != 0 || read.bytes_read >= read.length; }

void read_with_pread(FileRead& read) {
  while (!is_done(read)) {
    const ssize_t count = ::pread(read.fd, read.buffer + read.bytes_read, read.length - read.bytes_read,
                                  read.offset + static_cast<int64_t>(read.bytes_read));
    if (count < 0 && errno == EINTR) continue;
    if (count < 0) read.error = errno;
    if (count <= 0) return;
    read.bytes_read += static_cast<size_t>(count);
  }
}

// Applies one completion; returns whether the read needs another submission.
bool complete(FileRead& read, int result) {
  if (result == -EINTR || result == -EAGAIN) return true;
  if (result < 0) {
    read.error = -result;
    return false;
  }
  read.bytes_read += static_cast<size_t>(result);
  return result > 0 && read.bytes_read < read.length;  // 0: end of file
}

// Returns false when the ring broke down; the reads not done then go to pread.
bool read_with_uring(io_uring& ring, std::span<FileRead* const> reads, unsigned queue_depth) {
  std::deque<FileRead*> pending;
  for (FileRead* read : reads) {
    if (!is_done(*read)) pending.push_back(read);
  }
  unsigned num_in_flight = 0;
  while (!pending.empty() || num_in_flight > 0) {
    while (!pending.empty() && num_in_flight < queue_depth) {
      io_uring_sqe* entry = io_uring_get_sqe(&ring);
      if (entry == nullptr) break;
      FileRead* read = pending.front();
      pending.pop_front();
      io_uring_prep_read(entry, read->fd, read->buffer + read->bytes_read,
                         static_cast<unsigned>(std::min<size_t>(read->length - read->bytes_read, 1u << 30)),
                         static_cast<uint64_t>(read->offset) + read->bytes_read);
      io_uring_sqe_set_data(entry, read);
      ++num_in_flight;
    }
    const int submitted = io_uring_submit_and_wait(&ring, 1);
    if (submitted < 0 && submitted != -EINTR && submitted != -EAGAIN && submitted != -EBUSY) {
      log_uring_failure_once("submit", -submitted);
      // Reap every read the kernel has, however long it takes, before the
      // caller's buffers go to pread (and, after we return, to other uses): a
      // read still in flight would write into them later.
      while (num_in_flight > 0) {
        io_uring_cqe* completion = nullptr;
        const int waited = io_uring_wait_cqe(&ring, &completion);
        if (waited == -EINTR) continue;
        if (waited != 0) break;
        complete(*static_cast<FileRead*>(io_uring_cqe_get_data(completion)), completion->res);
        io_uring_cqe_seen(&ring, completion);
        --num_in_flight;
      }
      return false;
    }
    unsigned head = 0;
    unsigned num_seen = 0;
    io_uring_cqe* completion = nullptr;
    io_uring_for_each_cqe(&ring, head, completion) {
      FileRead* read = static_cast<FileRead*>(io_uring_cqe_get_data(completion));
      if (complete(*read, completion->res)) pending.push_back(read);
      ++num_seen;
    }
    io_uring_cq_advance(&ring, num_seen);
    num_in_flight -= num_seen;
  }
  return true;
}

}  // namespace

void read_files(std::span<FileRead* const> reads, int max_in_flight) {
  if (reads.empty()) return;
  const auto queue_depth = static_cast<unsigned>(
      std::clamp<int64_t>(std::min<int64_t>(max_in_flight, static_cast<int64_t>(reads.size())), 1, kMaxQueueDepth));
  io_uring ring;
  const int error = io_uring_queue_init(queue_depth, &ring, 0);
  if (error == 0) {
    const bool finished = read_with_uring(ring, reads, queue_depth);
    io_uring_queue_exit(&ring);
    if (finished) return;
  } else {
    log_uring_failure_once("setup", -error);
  }
  for (FileRead* read : reads) read_with_pread(*read);
}

}  // namespace loom
