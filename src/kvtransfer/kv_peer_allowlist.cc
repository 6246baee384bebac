#include "kvtransfer/kv_peer_allowlist.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "kvtransfer/kv_link_protocol.h"
#include "util/error.h"

namespace loom {

namespace {

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

bool loopback_host(const std::string& host) {
  if (lower(host) == "localhost") return true;
  in_addr ipv4{};
  if (::inet_pton(AF_INET, host.c_str(), &ipv4) == 1) return (ntohl(ipv4.s_addr) >> 24) == 127;
  in6_addr ipv6{};
  return ::inet_pton(AF_INET6, host.c_str(), &ipv6) == 1 && IN6_IS_ADDR_LOOPBACK(&ipv6);
}

}  // namespace

KvPeerAllowlist KvPeerAllowlist::parse(const std::string& list) {
  KvPeerAllowlist allowlist;
  std::string entry;
  auto add = [&] {
    std::erase_if(entry, [](unsigned char c) { return std::isspace(c); });
    if (entry.empty()) return;
    const size_t colon = entry.rfind(':');
    if (colon != std::string::npos && colon > 0 && entry.substr(colon + 1) == "*") {
      allowlist.entries_.emplace_back(lower(entry.substr(0, colon)), 0);
    } else {
      try {
        const auto [host, port] = kvlink::split_address(entry);
        allowlist.entries_.emplace_back(lower(host), port);
      } catch (const Error&) {
        throw Error(ErrorKind::kInvalidArgument, fmt::format("--kv-transfer-peers: '{}' is not HOST:PORT", entry),
                    "list the peers' KV link addresses as HOST:PORT (or HOST:* for any port), comma-separated");
      }
    }
    entry.clear();
  };
  for (char c : list) {
    if (c == ',') {
      add();
    } else {
      entry.push_back(c);
    }
  }
  add();
  return allowlist;
}

bool KvPeerAllowlist::allows(const std::string& address) const {
  std::pair<std::string, int> target;
  try {
    target = kvlink::split_address(address);
  } catch (const Error&) {
    return false;
  }
  if (entries_.empty()) return loopback_host(target.first);
  const std::string host = lower(target.first);
  return std::any_of(entries_.begin(), entries_.end(), [&](const std::pair<std::string, int>& entry) {
    return entry.first == host && (entry.second == 0 || entry.second == target.second);
  });
}

std::string KvPeerAllowlist::describe() const {
  if (entries_.empty()) return "loopback addresses only (no --kv-transfer-peers)";
  std::string text = "--kv-transfer-peers ";
  for (size_t i = 0; i < entries_.size(); ++i)
    text += fmt::format("{}{}:{}", i == 0 ? "" : ",", entries_[i].first,
                        entries_[i].second == 0 ? std::string("*") : std::to_string(entries_[i].second));
  return text;
}

}  // namespace loom
