// The engine's loaded LoRA adapters: name -> adapter, its backend slot, its KV
// sharing mode and how many requests use it.
//
// Lifecycle of an entry (Engine::load_adapter / unload_adapter):
//   reserve()        a free slot is taken, the entry exists but is not ready;
//                    submit() refuses the adapter (kNotFound) until...
//   mark_ready()     ...the engine thread has bound it in the backend.
//   cancel_reservation()  load failed: the entry and its slot go.
//   begin_unload()   no request may use it: the entry goes (submit() refuses it
//                    from now on) and its slot stays taken until...
//   release_slot()   ...the engine thread has unbound it.
// Requests count against an entry from submit() (acquire_for_request) to their
// end on the engine thread (release_request), so an adapter in use cannot be
// unloaded.
//
// Thread: every method is safe from any thread (one internal mutex): submit()
// and load/unload run on caller threads, request ends on the engine thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "lora/kv_sharing.h"

namespace loom {

struct LoraAdapter;

class AdapterRegistry {
 public:
  // What submit() needs of a ready adapter to key and lay out a request.
  struct ReadyAdapter {
    std::shared_ptr<const LoraAdapter> adapter;
    int32_t slot = 0;
    KvSharing sharing = KvSharing::kIsolated;
  };

  // `num_slots`: backend adapter slots the registry may hand out.
  explicit AdapterRegistry(int32_t num_slots);

  bool contains(const std::string& name) const;
  // Takes a free slot for a new, not yet ready entry. Throws
  // Error(kInvalidArgument) when `name` is loaded, Error(kCapacity) when every
  // slot is taken. Returns the slot.
  int32_t reserve(const std::string& name, const std::string& path, std::shared_ptr<const LoraAdapter> adapter,
                  KvSharing sharing);
  void cancel_reservation(const std::string& name);
  void mark_ready(const std::string& name);
  // Removes the ready entry and returns its slot (still taken: release_slot).
  // Throws Error(kNotFound) when it is not loaded, Error(kInvalidArgument)
  // while requests use it.
  int32_t begin_unload(const std::string& name);
  void release_slot(int32_t slot);

  // The ready adapter called `name`, or nullopt.
  std::optional<ReadyAdapter> find_ready(const std::string& name) const;
  // Counts one more request against the ready adapter `name` that find_ready
  // returned as `found`; false (nothing counted) when it is no longer loaded,
  // or was unloaded and loaded again since (another slot, maybe another mode).
  bool acquire_for_request(const std::string& name, const ReadyAdapter& found);
  // Ends what acquire_for_request counted (no-op for an entry unloaded since).
  void release_request(const std::string& name);

  // Ready adapters, by name.
  std::vector<AdapterInfo> infos() const;
  // Every entry's name (ready or being loaded), sorted.
  std::vector<std::string> names() const;
  // The largest k/v LoRA rank among every entry (ready or being loaded); 0 without one.
  int32_t max_kv_lora_rank() const;

 private:
  struct Entry {
    std::string path;
    std::shared_ptr<const LoraAdapter> adapter;
    int32_t slot = 0;
    int32_t num_running_requests = 0;
    bool ready = false;  // bound in the backend
    KvSharing sharing = KvSharing::kIsolated;
  };

  mutable std::mutex mutex_;
  std::map<std::string, Entry> entries_;
  std::vector<bool> slot_used_;
};

}  // namespace loom
