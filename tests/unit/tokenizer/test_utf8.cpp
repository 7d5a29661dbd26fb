// UTF-8 validation, decoding and repair, and the GPT-2 byte-level mapping.
#include <string>

#include "infer/tokenizer/byte_level.hpp"
#include "infer/tokenizer/utf8.hpp"
#include "support/fixtures.hpp"

namespace utf8 = infer::utf8;
namespace bl = infer::byte_level;
static const std::string R = "\xEF\xBF\xBD";  // U+FFFD

TEST_CASE("valid prefix length stops at the first bad or unfinished sequence", "[utf8]") {
  CHECK(utf8::valid_prefix_length("") == 0);
  CHECK(utf8::valid_prefix_length("héllo") == 6);
  CHECK(utf8::valid_prefix_length("ab\xe4\xbd") == 2);           // unfinished 你
  CHECK(utf8::valid_prefix_length("ab\x80") == 2);               // lone continuation
  CHECK(utf8::valid_prefix_length("\xc0\x80") == 0);             // overlong NUL
  CHECK(utf8::valid_prefix_length("\xe0\x80\x80") == 0);         // overlong 3-byte
  CHECK(utf8::valid_prefix_length("\xed\xa0\x80") == 0);         // surrogate D800
  CHECK(utf8::valid_prefix_length("\xf4\x90\x80\x80") == 0);     // > U+10FFFF
  CHECK(utf8::valid_prefix_length("\xf4\x8f\xbf\xbf") == 4);     // U+10FFFF
  CHECK(utf8::valid_prefix_length("\xff") == 0);
  CHECK(utf8::is_valid("🎉 你好"));
  CHECK_FALSE(utf8::is_valid("\xf0\x9f\x8e"));
}

TEST_CASE("decode and append round-trip code points", "[utf8]") {
  for (char32_t cp : {U'A', U'\u00e9', U'\u4f60', U'\U0001F389', U'\U0010FFFF', U'\u0000'}) {
    std::string s;
    utf8::append(s, cp);
    const auto d = utf8::decode(s, 0);
    REQUIRE(d);
    CHECK(d->value == cp);
    CHECK(d->length == s.size());
  }
  std::string s;
  utf8::append(s, 0xD800);
  CHECK(s == R);
  CHECK_FALSE(utf8::decode("\xe4\xbd", 0).has_value());
  CHECK_FALSE(utf8::decode("abc", 3).has_value());
}

TEST_CASE("sanitize replaces maximal subparts, as from_utf8_lossy does", "[utf8]") {
  CHECK(utf8::sanitize("ok") == "ok");
  CHECK(utf8::sanitize("a\xe4\xbd" "b") == "a" + R + "b");       // one U+FFFD for the unfinished 2 bytes
  CHECK(utf8::sanitize("\xe4\xbd") == R);
  CHECK(utf8::sanitize("\x80\x80") == R + R);                       // each stray continuation byte
  CHECK(utf8::sanitize("\xed\xa0\x80") == R + R + R);               // surrogate: lead, then 2 strays
  CHECK(utf8::sanitize("\xf0\x9f\x8e\xe4\xbd\xa0") == R + "你");
}

TEST_CASE("the streaming sanitizer gives the same text for any chunking", "[utf8]") {
  const std::string bytes = "x\xf0\x9f\x8e\x89y\xe4\xbd\xa0\xe4\xbd\xff\xc3";
  const std::string whole = utf8::sanitize(bytes);
  for (std::size_t cut1 = 0; cut1 <= bytes.size(); ++cut1) {
    for (std::size_t cut2 = cut1; cut2 <= bytes.size(); ++cut2) {
      utf8::Utf8Sanitizer s;
      std::string out;
      s.feed(std::string_view(bytes).substr(0, cut1), out);
      CHECK(utf8::is_valid(out));
      s.feed(std::string_view(bytes).substr(cut1, cut2 - cut1), out);
      s.feed(std::string_view(bytes).substr(cut2), out);
      s.finish(out);
      CHECK(out == whole);
    }
  }
  CHECK(whole == "x🎉y你" + R + R + R);  // unfinished 2 bytes, 0xff, unfinished 0xc3
}

TEST_CASE("GPT-2 byte-level mapping", "[byte_level]") {
  CHECK(bl::to_code_point(' ') == U'\u0120');   // Ġ
  CHECK(bl::to_code_point('\n') == U'\u010A');  // Ċ
  CHECK(bl::to_code_point('A') == U'A');
  CHECK(bl::to_code_point(0xAD) == U'\u0143');  // the last remapped byte
  CHECK(bl::to_code_point(0xFF) == U'\u00FF');
  for (unsigned b = 0; b < 256; ++b) CHECK(bl::to_byte(bl::to_code_point(static_cast<std::uint8_t>(b))) == b);
  CHECK_FALSE(bl::to_byte(U'\u0144').has_value());
  CHECK(bl::encode(" world\n") == "Ġworld\xC4\x8A");
  CHECK(bl::decode("Ġworld\xC4\x8A") == " world\n");
  std::string all;
  for (unsigned b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  CHECK(bl::decode(bl::encode(all)) == all);
  CHECK(bl::decode("▁x") == "▁x");  // outside the mapping: kept as it is
}
