// A MessagePack encoder for the few types KV events use (arrays, nil, ints,
// float64, strings), smallest encoding first as msgpack-c and msgspec write
// them. Appends to a byte string; never fails.
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
  void big_endian(uint64_t value, int num_bytes);
  std::string out_;
};

}  // namespace loom
