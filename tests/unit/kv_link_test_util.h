// Helpers shared by the KV link's tests (kv_transfer_test, kv_link_auth_test).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>

#include <gtest/gtest.h>

#include "kvtransfer/kv_link_protocol.h"

namespace loom::test {

// A raw client socket to a link server on loopback (for peers that misbehave);
// with timeout_seconds > 0 its sends and receives give up after that long
// (0: they wait, so a read that must see the server close cannot pass by timing out).
inline int connect_raw(int port, double timeout_seconds = 0.0) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  if (timeout_seconds > 0.0) kvlink::set_timeouts(fd, timeout_seconds);
  return fd;
}

}  // namespace loom::test
