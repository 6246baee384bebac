#include "kvstore/kv_payload.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <new>

namespace loom {

std::shared_ptr<KvPayload> KvPayload::allocate(size_t size) {
  if (size == 0) return std::shared_ptr<KvPayload>(new KvPayload(nullptr, 0, 0));
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t mapped = (size + page - 1) / page * page;
  // Populated up front: every byte is written right after (a copy or a receive), and one
  // populate costs less than a fault per page on the copying thread.
  void* memory = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (memory == MAP_FAILED) throw std::bad_alloc();
  return std::shared_ptr<KvPayload>(new KvPayload(static_cast<std::byte*>(memory), size, mapped));
}

std::shared_ptr<KvPayload> KvPayload::copy_of(std::span<const std::byte> bytes) {
  std::shared_ptr<KvPayload> payload = allocate(bytes.size());
  if (!bytes.empty()) std::memcpy(payload->data(), bytes.data(), bytes.size());
  return payload;
}

KvPayload::~KvPayload() {
  if (data_ != nullptr) ::munmap(data_, mapped_);
}

}  // namespace loom
