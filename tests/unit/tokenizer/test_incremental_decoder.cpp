// Streaming detokenization: pieces are always valid UTF-8, characters split across tokens are held
// until complete, and the concatenation equals decode() of all ids.
#include <nlohmann/json.hpp>

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "infer/tokenizer/incremental_decoder.hpp"
#include "support/fixtures.hpp"

using infer::IncrementalDecoder;
using infer::Tokenizer;
using Ids = std::vector<std::int32_t>;

namespace {
const Tokenizer& smollm2() {
  static const Tokenizer tok = Tokenizer::from_hf_json(infer::test::fixture("smollm2/tokenizer.json"));
  return tok;
}
}  // namespace

TEST_CASE("streaming the corpus: valid pieces whose concatenation is decode(ids)", "[incremental]") {
  std::ifstream in(infer::test::fixture("tokenizer/corpus.json"));
  REQUIRE(in);
  const auto corpus = nlohmann::json::parse(in);
  int held = 0;  // how often a token ended inside a character
  for (const auto& t : corpus) {
    const auto text = t.get<std::string>();
    INFO(text);
    const Ids ids = smollm2().encode(text, {.add_bos = false});
    IncrementalDecoder dec(smollm2());
    std::string streamed;
    for (auto id : ids) {
      const std::string piece = dec.push(id);
      CHECK(infer::utf8::is_valid(piece));
      if (dec.has_pending()) ++held;
      streamed += piece;
    }
    CHECK_FALSE(dec.has_pending());
    streamed += dec.flush();
    CHECK(streamed == smollm2().decode(ids));
    CHECK(streamed == text);
  }
  // The corpus' CJK and emoji texts do split characters across tokens.
  CHECK(held > 10);
}

TEST_CASE("an emoji split across tokens is emitted once complete", "[incremental]") {
  const Ids ids = smollm2().encode("🎉", {.add_bos = false});
  REQUIRE(ids.size() >= 2);
  IncrementalDecoder dec(smollm2());
  for (std::size_t i = 0; i + 1 < ids.size(); ++i) CHECK(dec.push(ids[i]).empty());
  CHECK(dec.has_pending());
  CHECK(dec.push(ids.back()) == "🎉");
  CHECK(dec.flush().empty());
}

TEST_CASE("leftovers flush as U+FFFD, broken sequences mid-stream too", "[incremental]") {
  const Ids emoji = smollm2().encode("🚀", {.add_bos = false});
  REQUIRE(emoji.size() >= 2);
  const Ids a = smollm2().encode("a", {.add_bos = false});
  IncrementalDecoder dec(smollm2());
  CHECK(dec.push(emoji[0]).empty());
  // A plain ASCII token after an unfinished sequence: the held bytes are invalid now.
  CHECK(dec.push(a[0]) == "\xEF\xBF\xBD" "a");
  CHECK(dec.push(emoji[0]).empty());
  CHECK(dec.flush() == "\xEF\xBF\xBD");
  CHECK(dec.flush().empty());
  // Same as decode() on those ids.
  CHECK(smollm2().decode(Ids{emoji[0], a[0], emoji[0]}) == "\xEF\xBF\xBD" "a" "\xEF\xBF\xBD");
}

TEST_CASE("special tokens, skip_special, reset and bad ids", "[incremental]") {
  IncrementalDecoder keep(smollm2());
  CHECK(keep.push(1) == "<|im_start|>");
  IncrementalDecoder skip(smollm2(), /*skip_special=*/true);
  CHECK(skip.push(1).empty());
  CHECK(skip.push(19556) == "Hello");
  CHECK_THROWS_AS(skip.push(49152), infer::InvalidArgument);
  CHECK_THROWS_AS(skip.push(-1), infer::InvalidArgument);
  CHECK(skip.push(905) == " world");  // still usable after the error

  const Ids emoji = smollm2().encode("👍", {.add_bos = false});
  CHECK(skip.push(emoji[0]).empty());
  skip.reset();
  CHECK_FALSE(skip.has_pending());
  CHECK(skip.flush().empty());
}

TEST_CASE("random id streams: every piece valid, concatenation equals decode", "[incremental]") {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<std::int32_t> any(0, static_cast<std::int32_t>(smollm2().vocab_size()) - 1);
  for (int round = 0; round < 200; ++round) {
    Ids ids(20);
    for (auto& id : ids) id = any(rng);
    IncrementalDecoder dec(smollm2());
    std::string streamed;
    for (auto id : ids) {
      const std::string piece = dec.push(id);
      REQUIRE(infer::utf8::is_valid(piece));
      streamed += piece;
    }
    streamed += dec.flush();
    REQUIRE(streamed == smollm2().decode(ids));
    // Whatever decode produced is valid text, and encoding it again must not throw.
    CHECK_NOTHROW(smollm2().encode(streamed));
  }
}
