#include "kvevents/msgpack_writer.h"

#include <bit>
#include <limits>

namespace loom {

void MsgpackWriter::big_endian(uint64_t value, int num_bytes) {
  for (int i = num_bytes - 1; i >= 0; --i) out_.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

void MsgpackWriter::array(uint32_t size) {
  if (size < 16) {
    out_.push_back(static_cast<char>(0x90 | size));
  } else if (size <= std::numeric_limits<uint16_t>::max()) {
    out_.push_back(static_cast<char>(0xdc));
    big_endian(size, 2);
  } else {
    out_.push_back(static_cast<char>(0xdd));
    big_endian(size, 4);
  }
}

void MsgpackWriter::nil() { out_.push_back(static_cast<char>(0xc0)); }

void MsgpackWriter::unsigned_integer(uint64_t value) {
  if (value < 128) {
    out_.push_back(static_cast<char>(value));
  } else if (value <= std::numeric_limits<uint8_t>::max()) {
    out_.push_back(static_cast<char>(0xcc));
    big_endian(value, 1);
  } else if (value <= std::numeric_limits<uint16_t>::max()) {
    out_.push_back(static_cast<char>(0xcd));
    big_endian(value, 2);
  } else if (value <= std::numeric_limits<uint32_t>::max()) {
    out_.push_back(static_cast<char>(0xce));
    big_endian(value, 4);
  } else {
    out_.push_back(static_cast<char>(0xcf));
    big_endian(value, 8);
  }
}

void MsgpackWriter::integer(int64_t value) {
  if (value >= 0) {
    unsigned_integer(static_cast<uint64_t>(value));
  } else if (value >= -32) {
    out_.push_back(static_cast<char>(value));  // negative fixint: 111xxxxx
  } else if (value >= std::numeric_limits<int8_t>::min()) {
    out_.push_back(static_cast<char>(0xd0));
    big_endian(static_cast<uint64_t>(value), 1);
  } else if (value >= std::numeric_limits<int16_t>::min()) {
    out_.push_back(static_cast<char>(0xd1));
    big_endian(static_cast<uint64_t>(value), 2);
  } else if (value >= std::numeric_limits<int32_t>::min()) {
    out_.push_back(static_cast<char>(0xd2));
    big_endian(static_cast<uint64_t>(value), 4);
  } else {
    out_.push_back(static_cast<char>(0xd3));
    big_endian(static_cast<uint64_t>(value), 8);
  }
}

void MsgpackWriter::float64(double value) {
  out_.push_back(static_cast<char>(0xcb));
  big_endian(std::bit_cast<uint64_t>(value), 8);
}

void MsgpackWriter::string(std::string_view text) {
  const size_t size = text.size();
  if (size < 32) {
    out_.push_back(static_cast<char>(0xa0 | size));
  } else if (size <= std::numeric_limits<uint8_t>::max()) {
    out_.push_back(static_cast<char>(0xd9));
    big_endian(size, 1);
  } else if (size <= std::numeric_limits<uint16_t>::max()) {
    out_.push_back(static_cast<char>(0xda));
    big_endian(size, 2);
  } else {
    out_.push_back(static_cast<char>(0xdb));
    big_endian(size, 4);
  }
  out_.append(text);
}

}  // namespace loom
