// The few MessagePack values KV events use (arrays, nil, ints, float64,
// strings), written by msgpack-c (Debian's libmsgpack-dev) into a byte string,
// smallest encoding first as msgspec writes them. Never fails.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace loom {

class MsgpackWriter {
 public:
  // An array header; the next `size` values are its elements.
  void array(uint32_t size);
  void nil();
  void unsigned_integer(uint64_t value);
  void integer(int64_t value);
  void float64(double value);
  void string(std::string_view text);  // UTF-8 (str family)

  const std::string& bytes() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

}  // namespace loom
