#pragma once
/// \file
/// The GPT-2 byte ↔ unicode mapping used by byte-level BPE (GPT-2, SmolLM2, Llama-3, Qwen2). BPE
/// vocabularies are stored as text, and raw bytes such as a space, a newline or the halves of a
/// multi-byte character are not printable; GPT-2 therefore maps each of the 256 byte values to a
/// printable code point: the printable Latin-1 bytes (33-126, 161-172, 174-255) map to themselves, and
/// the others (0-32, 127-160, 173) to U+0100 onwards in order — so a space is 'Ġ' (U+0120) and a newline
/// 'Ċ' (U+010A). Vocab entries and merges are strings in this alphabet.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "infer/tokenizer/utf8.hpp"

namespace infer::byte_level {

namespace detail {

constexpr bool maps_to_itself(unsigned b) noexcept {
  return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

constexpr std::array<char32_t, 256> make_byte_to_cp() noexcept {
  std::array<char32_t, 256> table{};
  char32_t next = 256;
  for (unsigned b = 0; b < 256; ++b) table[b] = maps_to_itself(b) ? char32_t(b) : next++;
  return table;
}

inline constexpr std::array<char32_t, 256> byte_to_cp = make_byte_to_cp();

/// The image of the mapping is U+0021..U+0143; a table over that range inverts it (-1: not an image).
constexpr std::array<std::int16_t, 0x144> make_cp_to_byte() noexcept {
  std::array<std::int16_t, 0x144> table{};
  for (auto& v : table) v = -1;
  for (unsigned b = 0; b < 256; ++b) table[byte_to_cp[b]] = static_cast<std::int16_t>(b);
  return table;
}

inline constexpr std::array<std::int16_t, 0x144> cp_to_byte_table = make_cp_to_byte();

}  // namespace detail

/// The code point byte `b` stands for.
constexpr char32_t to_code_point(std::uint8_t b) noexcept { return detail::byte_to_cp[b]; }

/// The byte code point `cp` stands for, or nullopt when `cp` is not in the mapping's image.
constexpr std::optional<std::uint8_t> to_byte(char32_t cp) noexcept {
  if (cp >= detail::cp_to_byte_table.size()) return std::nullopt;
  const auto b = detail::cp_to_byte_table[cp];
  if (b < 0) return std::nullopt;
  return static_cast<std::uint8_t>(b);
}

/// Raw bytes → their byte-level text (what vocab entries are written in).
inline std::string encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) utf8::append(out, to_code_point(static_cast<std::uint8_t>(c)));
  return out;
}

/// Byte-level text → raw bytes, appended to `out`. Code points outside the mapping (a vocab entry that
/// is not byte-level text) are kept as their own UTF-8 rather than dropped, and invalid UTF-8 bytes are
/// copied through: decoding never loses or invents input.
inline void decode_append(std::string_view text, std::string& out) {
  std::size_t pos = 0;
  while (pos < text.size()) {
    const auto cp = utf8::decode(text, pos);
    if (!cp) {
      out.push_back(text[pos]);
      ++pos;
      continue;
    }
    if (const auto b = to_byte(cp->value)) {
      out.push_back(static_cast<char>(*b));
    } else {
      out.append(text.substr(pos, cp->length));
    }
    pos += cp->length;
  }
}

inline std::string decode(std::string_view text) {
  std::string out;
  decode_append(text, out);
  return out;
}

}  // namespace infer::byte_level
