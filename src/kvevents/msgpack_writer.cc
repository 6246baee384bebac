#include "kvevents/msgpack_writer.h"

#include <bit>

#include <msgpack.hpp>

namespace loom {

namespace {

// What msgpack::packer writes to: the writer's byte string.
struct StringStream {
  std::string& out;
  void write(const char* data, size_t size) { out.append(data, size); }
};

}  // namespace

// msgpack-c picks the smallest encoding of each value (fixint / uint8.. for
// non-negative integers, fixstr / str8.., fixarray / array16..), as msgspec does.
void MsgpackWriter::array(uint32_t size) {
  StringStream stream{out_};
  msgpack::packer<StringStream>(stream).pack_array(size);
}

void MsgpackWriter::nil() {
  StringStream stream{out_};
  msgpack::packer<StringStream>(stream).pack_nil();
}

void MsgpackWriter::unsigned_integer(uint64_t value) {
  StringStream stream{out_};
  msgpack::packer<StringStream>(stream).pack_uint64(value);
}

void MsgpackWriter::integer(int64_t value) {
  StringStream stream{out_};
  msgpack::packer<StringStream>(stream).pack_int64(value);
}

void MsgpackWriter::float64(double value) {
  // Not packer::pack_double: it writes an integral double (a timestamp of
  // 0.0 in tests) as an integer, and vLLM's `ts` is a float64 on the wire.
  out_.push_back(static_cast<char>(0xcb));
  const auto bits = std::bit_cast<uint64_t>(value);
  for (int shift = 56; shift >= 0; shift -= 8) out_.push_back(static_cast<char>((bits >> shift) & 0xff));
}

void MsgpackWriter::string(std::string_view text) {
  StringStream stream{out_};
  msgpack::packer<StringStream> packer(stream);
  packer.pack_str(static_cast<uint32_t>(text.size()));
  packer.pack_str_body(text.data(), static_cast<uint32_t>(text.size()));
}

}  // namespace loom
