#include "engine/adapter_registry.h"

#include <algorithm>

#include "engine/request_kv.h"
#include "lora/adapter.h"
#include "util/error.h"

namespace loom {

AdapterRegistry::AdapterRegistry(int32_t num_slots) : slot_used_(static_cast<size_t>(std::max(num_slots, 0)), false) {}

bool AdapterRegistry::contains(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.count(name) > 0;
}

int32_t AdapterRegistry::reserve(const std::string& name, const std::string& path,
                                 std::shared_ptr<const LoraAdapter> adapter, KvSharing sharing) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (entries_.count(name)) fail(ErrorKind::kInvalidArgument, "adapter '{}' is already loaded", name);
  int32_t slot = -1;
  for (size_t i = 0; i < slot_used_.size() && slot < 0; ++i)
    if (!slot_used_[i]) slot = static_cast<int32_t>(i);
  if (slot < 0)
    throw Error(ErrorKind::kCapacity, fmt::format("all {} adapter slots are in use", slot_used_.size()),
                "unload an adapter first");
  slot_used_[static_cast<size_t>(slot)] = true;
  entries_[name] = Entry{path, std::move(adapter), slot, 0, false, sharing};
  return slot;
}

void AdapterRegistry::cancel_reservation(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return;
  slot_used_[static_cast<size_t>(it->second.slot)] = false;
  entries_.erase(it);
}

void AdapterRegistry::mark_ready(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_[name].ready = true;
}

int32_t AdapterRegistry::begin_unload(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(name);
  if (it == entries_.end() || !it->second.ready)
    throw Error(ErrorKind::kNotFound, fmt::format("adapter '{}' is not loaded", name));
  if (it->second.num_running_requests > 0)
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("adapter '{}' is in use by {} requests", name, it->second.num_running_requests),
                "retry when they finish");
  const int32_t slot = it->second.slot;
  entries_.erase(it);
  return slot;
}

void AdapterRegistry::release_slot(int32_t slot) {
  std::lock_guard<std::mutex> lock(mutex_);
  slot_used_[static_cast<size_t>(slot)] = false;
}

std::optional<AdapterRegistry::ReadyAdapter> AdapterRegistry::find_ready(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(name);
  if (it == entries_.end() || !it->second.ready) return std::nullopt;
  return ReadyAdapter{it->second.adapter, it->second.slot, it->second.sharing};
}

bool AdapterRegistry::acquire_for_request(const std::string& name, const ReadyAdapter& found) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(name);
  if (it == entries_.end() || !it->second.ready || it->second.adapter != found.adapter) return false;
  ++it->second.num_running_requests;
  return true;
}

void AdapterRegistry::release_request(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(name);
  if (it != entries_.end()) --it->second.num_running_requests;
}

std::vector<AdapterInfo> AdapterRegistry::infos() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<AdapterInfo> infos;
  for (const auto& [name, entry] : entries_)
    if (entry.ready)
      infos.push_back({name, entry.path, entry.adapter->max_rank(), entry.num_running_requests, entry.sharing});
  return infos;
}

std::vector<std::string> AdapterRegistry::names() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> names;
  for (const auto& [name, entry] : entries_) names.push_back(name);
  return names;
}

int32_t AdapterRegistry::max_kv_lora_rank() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int32_t max_rank = 0;
  for (const auto& [name, entry] : entries_) max_rank = std::max(max_rank, entry.adapter->max_kv_rank());
  return max_rank;
}

}  // namespace loom
