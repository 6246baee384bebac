// One KV block's bytes as the engine buffer (buffered_kv_store.h) and the KV
// link (kvtransfer/) hold them: a page-mapped allocation of its own.
//
// Why not std::vector: blocks are large (2 MiB for an 8B model's block of 16
// tokens) and are allocated on the link's connection threads but freed on the
// engine's reader thread. Through malloc, glibc serves such sizes from
// per-thread arenas once its dynamic mmap threshold has risen, and an arena
// keeps what its threads once held: the buffer's cap held, yet a decode engine
// grew to 76 GB of RSS with an 8 GB buffer on the H100. mmap / munmap give the
// memory back the moment a block leaves the buffer.
#pragma once

#include <cstddef>
#include <memory>
#include <span>

namespace loom {

class KvPayload {
 public:
  // `size` bytes (uninitialized; zero bytes allocates nothing). Throws std::bad_alloc.
  static std::shared_ptr<KvPayload> allocate(size_t size);
  static std::shared_ptr<KvPayload> copy_of(std::span<const std::byte> bytes);
  ~KvPayload();
  KvPayload(const KvPayload&) = delete;
  KvPayload& operator=(const KvPayload&) = delete;

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<std::byte> bytes() { return {data_, size_}; }
  std::span<const std::byte> bytes() const { return {data_, size_}; }

 private:
  KvPayload(std::byte* data, size_t size, size_t mapped) : data_(data), size_(size), mapped_(mapped) {}
  std::byte* data_;
  size_t size_;
  size_t mapped_;
};

}  // namespace loom
