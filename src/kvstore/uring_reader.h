// Batched positional file reads for the disk KV tier: many in flight through
// io_uring (liburing), or one after another with pread where io_uring cannot
// be set up (an old kernel, a container whose seccomp profile forbids it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace loom {

struct FileRead {
  int fd = -1;
  std::byte* buffer = nullptr;  // `length` bytes; aligned as the fd's O_DIRECT requires, if set
  size_t length = 0;
  int64_t offset = 0;
  size_t bytes_read = 0;  // out: less than `length` when the file ended first (or on error)
  int error = 0;          // out: errno of a failed read, 0 if none
};

// Runs every read until it has its `length` bytes, reaches the end of its file
// or fails, with at most `max_in_flight` at once; a short read continues where
// it stopped. Thread-safe (each call sets up its own ring).
void read_files(std::span<FileRead* const> reads, int max_in_flight);

}  // namespace loom
