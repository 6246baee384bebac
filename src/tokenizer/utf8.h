// UTF-8 helpers shared by the tokenizer: decoding with Rust's lossy rules
// (what Hugging Face `tokenizers` uses), completeness checks for streaming, and
// Unicode normalization (utf8proc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom::utf8 {

// Appends the UTF-8 encoding of `code_point` (must be a valid scalar value).
void append_code_point(std::string& out, uint32_t code_point);

// Decodes one code point at `text[pos]`. Returns its length in bytes and sets
// `code_point`; precondition: `text` is valid UTF-8 and pos < text.size().
size_t decode_code_point(std::string_view text, size_t pos, uint32_t& code_point);

// Replaces every maximal invalid subsequence with U+FFFD, exactly as Rust's
// String::from_utf8_lossy does (so decode() matches HF byte for byte).
std::string to_valid_lossy(std::string_view bytes);

// Length of the longest prefix of `bytes` that does not end inside a possibly
// still-completing character: the tail held back is a valid but truncated
// sequence (at most 3 bytes). Invalid bytes are not held back.
size_t complete_prefix_length(std::string_view bytes);

bool is_valid(std::string_view bytes);

// Unicode categories as HF's Rust code tests them.
bool is_numeric(uint32_t code_point);     // char::is_numeric: Nd, Nl, No
bool is_whitespace(uint32_t code_point);  // char::is_whitespace: White_Space
bool is_word_char(uint32_t code_point);   // regex \w: alphanumeric, marks, Pc, joiners

enum class NormalizationForm { kNFC, kNFD, kNFKC, kNFKD };
// Precondition: `text` is valid UTF-8.
std::string normalize(std::string_view text, NormalizationForm form);

}  // namespace loom::utf8
