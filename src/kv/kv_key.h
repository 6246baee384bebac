// Which radix-tree namespace each block of a request's KV is cached under.
//
// Most requests keep all their blocks in one namespace. An activated (aLoRA)
// request branches: blocks wholly before the invocation start hold base-model
// K/V and live in "base"; from the block containing the start on, they hold
// adapter K/V and live in a namespace of their own that hangs off the last
// base node:
//
//   invocation start S = 37, block_size 16 -> branch_block = 2
//   blocks:   [0..15] [16..31] | [32..47] [48..63] ...
//   ns:        base    base    | alora/NAME@37 ...
//
// The start is part of the branch namespace because tokens in [32, 37) are
// computed as base tokens inside an adapter block: two requests whose starts
// fall in the same block at different offsets must not share it.
//
// Namespaces (the only spellings; kv/ and engine/ build them through these):
//   "base"            the base model, and base-mode (ICaRus) adapters
//   "lora/NAME"       an isolated adapter
//   "alora/NAME@S"    an activated adapter's blocks from its invocation start S
//   "fork"            forked (ForkKV) adapters' shared bCache
//   "resid/NAME"      a forked adapter's rCache (in the residual cache manager)
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

namespace loom {

inline constexpr const char* kBaseKvNamespace = "base";
inline constexpr const char* kForkedBaseKvNamespace = "fork";

struct KvKey {
  std::string kv_namespace = kBaseKvNamespace;  // blocks [0, branch_block)
  std::string branch_namespace;                 // blocks [branch_block, ...); "" = no branch
  int32_t branch_block = std::numeric_limits<int32_t>::max();

  static KvKey single(std::string kv_namespace) { return KvKey{std::move(kv_namespace), "", std::numeric_limits<int32_t>::max()}; }
  const std::string& namespace_of_block(int32_t block_index) const {
    return branch_namespace.empty() || block_index < branch_block ? kv_namespace : branch_namespace;
  }
  bool operator==(const KvKey&) const = default;
};

std::string isolated_kv_namespace(const std::string& adapter_name);   // "lora/NAME"
std::string residual_kv_namespace(const std::string& adapter_name);   // "resid/NAME"
// {"base", "alora/NAME@S", S / block_size}.
KvKey activated_kv_key(const std::string& adapter_name, int32_t invocation_start, int32_t block_size);
// Whether `kv_namespace` holds K/V of adapter NAME (its lora/, alora/...@, resid/ namespaces).
bool kv_namespace_belongs_to_adapter(const std::string& kv_namespace, const std::string& adapter_name);
// The adapter NAME whose namespace `kv_namespace` is, or nullopt (base, fork):
// for every NAME, kv_namespace_belongs_to_adapter(ns, NAME) == (adapter_of_kv_namespace(ns) == NAME).
std::optional<std::string> adapter_of_kv_namespace(std::string_view kv_namespace);

}  // namespace loom
