// StopChecker: EOS, stop ids, stop strings spanning SmolLM2 tokens, streaming hold-back (never
// retracting text), include_stop_str_in_output, min_tokens, max_tokens, ignore_eos, flush, and the
// invariant that the emitted pieces add up to text() on a varied corpus.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "infer/sampling/stop_checker.hpp"
#include "support/fixtures.hpp"

using infer::FinishReason;
using infer::IncrementalDecoder;
using infer::InvalidArgument;
using infer::SamplingParams;
using infer::StopChecker;
using infer::StopResult;
using infer::Tokenizer;
using Catch::Matchers::Contains;
using Ids = std::vector<std::int32_t>;

namespace {
const Tokenizer& smollm2() {
  static const Tokenizer tok = Tokenizer::from_hf_json(infer::test::fixture("smollm2/tokenizer.json"));
  return tok;
}
constexpr std::int32_t im_end = 2;  // SmolLM2-Instruct's EOS, "<|im_end|>"

Ids encode(const std::string& text) { return smollm2().encode(text, {.add_bos = false}); }

/// Streams `ids` until the checker finishes; records every emitted piece.
struct Run {
  std::vector<std::string> pieces;
  std::vector<std::size_t> held;  ///< held_back() after each push
  std::string streamed;           ///< concatenation of every emit and the flush
  FinishReason reason = FinishReason::none;
  std::size_t pushed = 0;
};

Run stream(StopChecker& checker, const Ids& ids, bool skip_special = false) {
  IncrementalDecoder dec(smollm2(), skip_special);
  Run r;
  for (auto id : ids) {
    const StopResult res = checker.push(id, dec);
    ++r.pushed;
    r.pieces.push_back(res.emit);
    r.held.push_back(checker.held_back());
    r.streamed += res.emit;
    if (res.reason != FinishReason::none) {
      r.reason = res.reason;
      break;
    }
  }
  r.streamed += checker.flush(dec);
  if (r.reason == FinishReason::none) r.reason = checker.reason();
  return r;
}

SamplingParams params(std::vector<std::string> stop = {}, std::int32_t max_tokens = 1000) {
  SamplingParams p;
  p.stop = std::move(stop);
  p.max_tokens = max_tokens;
  return p;
}

const std::string kText = "The capital of France is Paris. The capital of Germany is Berlin.";
}  // namespace

TEST_CASE("a stop string spanning several tokens cuts the text before it", "[stop]") {
  const Ids ids = encode(kText);
  const std::string stop = "of Germ";
  // The stop string really spans tokens: no single token's text contains it.
  for (auto id : ids) REQUIRE(smollm2().token_bytes(id).find(stop) == std::string::npos);

  StopChecker checker(params({"x!", stop}), im_end);
  const Run r = stream(checker, ids);
  CHECK(r.reason == FinishReason::stop);
  CHECK(checker.stop_string_index() == std::optional<std::size_t>(1));
  CHECK_FALSE(checker.stop_token().has_value());
  CHECK(checker.text() == "The capital of France is Paris. The capital ");
  CHECK(r.streamed == checker.text());
  // It finished on the token that completed "Germ", before "is Berlin." was pushed.
  const std::string upto = smollm2().decode(std::span<const std::int32_t>(ids).first(r.pushed));
  CHECK(upto.find(stop) != std::string::npos);
  CHECK(upto.find(stop) + stop.size() > smollm2().decode(std::span<const std::int32_t>(ids).first(r.pushed - 1)).size());
  CHECK(r.pushed < ids.size());
}

TEST_CASE("include_stop_str_in_output keeps the stop string, not the rest of its token", "[stop]") {
  const Ids ids = encode(kText);
  SamplingParams p = params({"of Germ"});
  p.include_stop_str_in_output = true;
  StopChecker checker(p, im_end);
  const Run r = stream(checker, ids);
  CHECK(r.reason == FinishReason::stop);
  CHECK(checker.text() == "The capital of France is Paris. The capital of Germ");  // "any" is dropped
  CHECK(r.streamed == checker.text());
  // Nothing needs holding back when the stop string is output anyway.
  for (auto h : r.held) CHECK(h == 0);
}

TEST_CASE("streaming holds back a possible stop-string prefix, then releases it", "[stop][stream]") {
  // "of Germ": after "The capital of", the tail "of" might start it; " France" shows it does not.
  const Ids ids = encode(kText);
  StopChecker checker(params({"of Germ"}), im_end);
  IncrementalDecoder dec(smollm2());
  std::string text;
  std::string emitted;
  bool saw_hold = false;
  for (auto id : ids) {
    const std::string piece = smollm2().token_bytes(id);
    const StopResult res = checker.push(id, dec);
    text += piece;
    emitted += res.emit;
    CHECK(checker.text() == text.substr(0, checker.text().size()));
    CHECK(emitted.size() + checker.held_back() == checker.text().size());
    if (text == "The capital of") {
      CHECK(emitted == "The capital ");
      CHECK(checker.held_back() == 2);
      saw_hold = true;
    }
    if (text == "The capital of France") CHECK(emitted == text);
    if (res.reason != FinishReason::none) break;
  }
  CHECK(saw_hold);
  CHECK(emitted == "The capital of France is Paris. The capital ");
  CHECK(checker.flush(dec).empty());
}

TEST_CASE("hold-back uses the longest suffix that may start any stop string", "[stop][stream]") {
  StopChecker checker(params({"Paris!", "is X", "xyz"}), std::nullopt);
  CHECK(checker.push(10, "It is").emit == "It ");   // "is" may start "is X"
  CHECK(checker.held_back() == 2);
  CHECK(checker.push(11, " Par").emit == "is ");    // "is P" rules out "is X"; "Par" may start "Paris!"
  CHECK(checker.held_back() == 3);
  CHECK(checker.push(12, "is").emit.empty());       // "Paris" still may become "Paris!"
  CHECK(checker.held_back() == 5);
  const StopResult r = checker.push(13, ".");
  CHECK(r.reason == FinishReason::none);
  CHECK(r.emit == "Paris.");                        // not a stop string after all: released
  CHECK(checker.held_back() == 0);
  CHECK(checker.text() == "It is Paris.");
}

TEST_CASE("flush at the end of a stream releases held text", "[stop][stream]") {
  StopChecker checker(params({"Paris!"}), std::nullopt);
  CHECK(checker.push(1, "Par").emit.empty());
  CHECK(checker.push(2, "is").emit.empty());
  CHECK(checker.flush() == "Paris");
  CHECK(checker.reason() == FinishReason::none);  // the caller decides (abort, context full)
  CHECK(checker.flush().empty());
  CHECK_THROWS_AS(checker.push(3, "!"), InvalidArgument);
}

TEST_CASE("when several stop strings complete in one token, the one ending first wins", "[stop]") {
  StopChecker checker(params({"abcy", "bc", "zz"}), std::nullopt);
  const StopResult r = checker.push(1, "xabcyz");
  CHECK(r.reason == FinishReason::stop);
  CHECK(r.emit == "xa");
  CHECK(checker.stop_string_index() == std::optional<std::size_t>(1));

  SamplingParams p = params({"ab", "abc"});
  p.include_stop_str_in_output = true;
  StopChecker tie(p, std::nullopt);
  CHECK(tie.push(1, "zabcd").emit == "zab");
  CHECK(tie.stop_string_index() == std::optional<std::size_t>(0));

  // Both end at the same byte: the longer (earlier-starting) one wins.
  StopChecker same_end(params({"bc", "abc"}), std::nullopt);
  CHECK(same_end.push(1, "xabcd").emit == "x");
  CHECK(same_end.stop_string_index() == std::optional<std::size_t>(1));
}

TEST_CASE("EOS stops, its text is dropped unless include_stop_str_in_output", "[stop][eos]") {
  Ids ids = encode("Hello world");
  ids.push_back(im_end);
  ids.push_back(encode(" more")[0]);
  {
    StopChecker checker(params(), im_end);
    const Run r = stream(checker, ids);  // the decoder does not skip specials: "<|im_end|>" reaches the checker
    CHECK(r.reason == FinishReason::stop);
    CHECK(checker.stop_token() == std::optional<std::int32_t>(im_end));
    CHECK(checker.text() == "Hello world");
    CHECK(r.streamed == "Hello world");
    CHECK(r.pushed == ids.size() - 1);
  }
  {
    SamplingParams p = params();
    p.include_stop_str_in_output = true;
    StopChecker checker(p, im_end);
    const Run r = stream(checker, ids);
    CHECK(checker.text() == "Hello world<|im_end|>");
    CHECK(r.streamed == checker.text());
  }
  {
    StopChecker no_eos(params(), std::nullopt);  // a tokenizer without EOS: nothing to stop on
    const Run r = stream(no_eos, ids);
    CHECK(r.reason == FinishReason::none);
    CHECK(no_eos.text() == "Hello world<|im_end|> more");
  }
}

TEST_CASE("ignore_eos generates past EOS up to max_tokens, stop ids still stop", "[stop][eos]") {
  Ids ids = encode("Hello world");
  ids.push_back(im_end);
  const Ids more = encode(" again.");
  ids.insert(ids.end(), more.begin(), more.end());
  SamplingParams p = params({}, static_cast<std::int32_t>(ids.size()));
  p.ignore_eos = true;
  {
    StopChecker checker(p, im_end);
    const Run r = stream(checker, ids, /*skip_special=*/true);
    CHECK(r.reason == FinishReason::length);
    CHECK(r.pushed == ids.size());
    CHECK(checker.text() == "Hello world again.");
  }
  {
    const std::int32_t period = encode(".")[0];
    REQUIRE(ids.back() == period);
    p.stop_token_ids = {period};
    StopChecker checker(p, im_end);
    const Run r = stream(checker, ids, true);
    CHECK(r.reason == FinishReason::stop);
    CHECK(checker.stop_token() == std::optional<std::int32_t>(period));
    CHECK(checker.text() == "Hello world again");  // the stop token's text is dropped
  }
}

TEST_CASE("max_tokens ends with length and releases held-back text", "[stop][length]") {
  const Ids ids = encode(kText);
  StopChecker checker(params({"Paris!!"}, 6), im_end);  // "The capital of France is Paris" is 6 tokens
  REQUIRE(smollm2().decode(std::span<const std::int32_t>(ids).first(6)) == "The capital of France is Paris");
  const Run r = stream(checker, ids);
  CHECK(r.reason == FinishReason::length);
  CHECK(r.pushed == 6);
  CHECK(r.held[4] == 0);
  CHECK(r.pieces.back() == " Paris");  // would have been held, but no token follows
  CHECK(checker.text() == "The capital of France is Paris");
  CHECK(r.streamed == checker.text());
  CHECK_THROWS_AS(checker.push(ids[6], "."), InvalidArgument);
  CHECK_THROWS_WITH(checker.push(ids[6], "."), Contains("already ended") && Contains("length"));
}

TEST_CASE("a stop string on the last allowed token is a stop, not length", "[stop][length]") {
  StopChecker checker(params({"end"}, 2), std::nullopt);
  const StopResult first = checker.push(1, "the e");
  CHECK(first.reason == FinishReason::none);
  CHECK(first.emit == "the ");  // "e" held: it may start "end"
  const StopResult r = checker.push(2, "nd");
  CHECK(r.reason == FinishReason::stop);
  CHECK(r.emit.empty());
  CHECK(checker.text() == "the ");
}

TEST_CASE("max_tokens inside a character: the decoder's tail is flushed", "[stop][length]") {
  const Ids ids = encode("🎉");
  REQUIRE(ids.size() >= 2);
  StopChecker checker(params({}, 1), im_end);
  IncrementalDecoder dec(smollm2());
  const StopResult r = checker.push(ids[0], dec);
  CHECK(r.reason == FinishReason::length);
  CHECK(r.emit.empty());
  CHECK(checker.flush(dec) == "\xEF\xBF\xBD");
  CHECK(checker.text() == "\xEF\xBF\xBD");
}

TEST_CASE("min_tokens: EOS, stop ids and stop strings cannot end the first min_tokens tokens", "[stop][min_tokens]") {
  SamplingParams p = params({"ab"}, 10);
  p.min_tokens = 2;
  p.stop_token_ids = {7};
  {
    StopChecker c(p, im_end);
    CHECK(c.push(im_end, "").reason == FinishReason::none);  // token 1
    CHECK(c.push(7, "").reason == FinishReason::none);       // token 2
    CHECK(c.push(im_end, "").reason == FinishReason::stop);  // token 3
    CHECK(c.stop_token() == std::optional<std::int32_t>(im_end));
  }
  {
    StopChecker c(p, im_end);
    CHECK(c.push(5, "ab").emit == "ab");                     // a match inside the first 2 tokens is ignored
    CHECK(c.push(5, "a").reason == FinishReason::none);      // held: may start "ab"
    const StopResult r = c.push(5, "b");                     // token 3 completes "ab", straddling tokens
    CHECK(r.reason == FinishReason::stop);
    CHECK(c.text() == "ab");
  }
  {
    StopChecker c(p, im_end);
    CHECK(c.push(5, "xa").reason == FinishReason::none);
    const StopResult second = c.push(5, "b");                // completes on token 2: ignored
    CHECK(second.reason == FinishReason::none);
    CHECK(second.emit == "ab");
    CHECK(c.push(5, "c").emit == "c");
    CHECK(c.push(5, "ab").reason == FinishReason::stop);
    CHECK(c.text() == "xabc");
  }
}

TEST_CASE("the constructor validates the params", "[stop]") {
  SamplingParams p;
  p.max_tokens = 0;
  CHECK_THROWS_AS(StopChecker(p, std::nullopt), InvalidArgument);
  p = SamplingParams{};
  p.stop = {""};
  CHECK_THROWS_WITH(StopChecker(p, std::nullopt), Contains("stop[0] is empty"));
}

TEST_CASE("on the corpus, every stop string cuts at its first occurrence and pieces add up", "[stop][corpus]") {
  std::ifstream in(infer::test::fixture("tokenizer/corpus.json"));
  REQUIRE(in);
  const auto corpus = nlohmann::json::parse(in);
  int cases = 0;
  int spanning = 0;  // stop strings that needed more than one token
  for (const auto& t : corpus) {
    const auto full = t.get<std::string>();
    if (full.size() < 4) continue;
    const Ids ids = encode(full);
    for (std::size_t start : {std::size_t{1}, full.size() / 3, full.size() / 2}) {
      for (std::size_t len : {1, 3, 7}) {
        if (start + len > full.size()) continue;
        const std::string stop = full.substr(start, len);
        if (!infer::utf8::is_valid(stop)) continue;
        for (bool include : {false, true}) {
          INFO(full << " | stop '" << stop << "' include " << include);
          SamplingParams p = params({stop});
          p.include_stop_str_in_output = include;
          StopChecker checker(p, std::nullopt);
          const Run r = stream(checker, ids);
          const std::size_t at = full.find(stop);
          CHECK(r.reason == FinishReason::stop);
          CHECK(checker.text() == full.substr(0, include ? at + stop.size() : at));
          CHECK(r.streamed == checker.text());
          for (const auto& piece : r.pieces) CHECK(infer::utf8::is_valid(piece));
          for (auto h : r.held) CHECK(h < stop.size());
          if (r.pushed > 1 && smollm2().token_bytes(ids[r.pushed - 1]).find(stop) == std::string::npos) ++spanning;
          ++cases;
        }
      }
    }
  }
  CHECK(cases > 100);
  CHECK(spanning > 20);
}
