// Tokenizer::from_gguf: the default model's vocabulary against HF's ids, and small GGUF files built in
// the test (tests/support/gguf_writer.hpp) with malformed tokenizer metadata giving typed errors.
#include <nlohmann/json.hpp>

#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "infer/tokenizer/gguf_vocab.hpp"
#include "support/fixtures.hpp"
#include "support/gguf_writer.hpp"

using infer::Tokenizer;
using infer::gguf::ValueType;
using Catch::Matchers::Contains;
using Ids = std::vector<std::int32_t>;

namespace {
nlohmann::json load(const std::string& rel) {
  std::ifstream in(infer::test::fixture(rel));
  REQUIRE(in);
  return nlohmann::json::parse(in);
}

const Tokenizer& smollm2_gguf() {
  static const Tokenizer tok = Tokenizer::from_gguf(infer::gguf::File::open(infer::test::default_model()));
  return tok;
}

/// The metadata of a tiny byte-level vocab: ids 0-255 the byte characters, 256 "he", 257 "<s>"
/// (control), 258 "<u>" (user-defined); one merge "h e".
struct Meta {
  std::string model = "gpt2";
  std::vector<std::string> tokens;
  std::vector<std::int64_t> types;
  std::vector<std::string> merges{"h e"};
  std::optional<std::string> pre = "gpt2";
  std::optional<std::uint32_t> bos = 257, eos = 257;
  std::optional<bool> add_bos = true;

  Meta() {
    for (unsigned b = 0; b < 256; ++b) {
      std::string ch;
      infer::utf8::append(ch, infer::byte_level::to_code_point(static_cast<std::uint8_t>(b)));
      tokens.push_back(ch);
    }
    tokens.insert(tokens.end(), {"he", "<s>", "<u>"});
    types.assign(tokens.size(), 1);
    types[257] = 3;
    types[258] = 4;
  }

  [[nodiscard]] Tokenizer load() const {
    using infer::test::arr;
    using infer::test::str;
    infer::test::GgufWriter w;
    w.add("tokenizer.ggml.model", str(model));
    std::vector<infer::gguf::Value> t, ty, m;
    for (const auto& s : tokens) t.push_back(str(s));
    for (auto x : types) ty.push_back(infer::gguf::Value{static_cast<std::int32_t>(x)});
    for (const auto& s : merges) m.push_back(str(s));
    w.add("tokenizer.ggml.tokens", arr(ValueType::string, t));
    w.add("tokenizer.ggml.token_type", arr(ValueType::i32, ty));
    w.add("tokenizer.ggml.merges", arr(ValueType::string, m));
    if (pre) w.add("tokenizer.ggml.pre", str(*pre));
    if (bos) w.add("tokenizer.ggml.bos_token_id", infer::gguf::Value{*bos});
    if (eos) w.add("tokenizer.ggml.eos_token_id", infer::gguf::Value{*eos});
    if (add_bos) w.add("tokenizer.ggml.add_bos_token", infer::gguf::Value{*add_bos});
    w.add("tokenizer.chat_template", str("{{ '<|im_start|>' }}"));
    return Tokenizer::from_gguf(infer::gguf::File::from_bytes(w.build()));
  }
};
}  // namespace

TEST_CASE("the default model's GGUF vocabulary", "[tokenizer][gguf]") {
  const Tokenizer& tok = smollm2_gguf();
  CHECK(tok.vocab_size() == 49152);
  CHECK(tok.pre_tokenizer().kind() == infer::PreTokenizerKind::smollm);
  CHECK(tok.bos_id() == 1);
  CHECK(tok.eos_id() == 2);
  CHECK(tok.unknown_id() == 0);
  CHECK(tok.padding_id() == 2);
  CHECK_FALSE(tok.add_bos_default());
  CHECK(tok.added_tokens().size() == 17);
  CHECK(tok.is_special(16));
  CHECK_FALSE(tok.is_special(17));
  CHECK(tok.chat_template_source() == load("smollm2/chat_reference.json")["template"].get<std::string>());
}

TEST_CASE("GGUF ids equal HF tokenizers' for every corpus text, and round-trip", "[tokenizer][gguf]") {
  const auto ref = load("smollm2/encode_reference.json");
  for (const auto& c : ref["cases"]) {
    const auto text = c["text"].get<std::string>();
    INFO(text);
    const Ids ids = smollm2_gguf().encode(text);  // add_bos_token is false in this file
    CHECK(ids == c["ids"].get<Ids>());
    CHECK(smollm2_gguf().decode(ids) == text);
  }
}

TEST_CASE("a small GGUF vocabulary: control and user-defined tokens, BOS", "[tokenizer][gguf]") {
  const Tokenizer tok = Meta().load();
  CHECK(tok.vocab_size() == 259);
  CHECK(tok.add_bos_default());
  CHECK(tok.encode("he") == Ids{257, 256});
  CHECK(tok.encode("<s>he<u>", {.add_bos = false}) == Ids{257, 256, 258});
  // Control tokens are special; user-defined ones are matched even when specials are not parsed.
  CHECK(tok.encode("<s><u>", {.add_bos = false, .parse_special = false}) ==
        Ids{tok.find("<").value(), tok.find("s").value(), tok.find(">").value(), 258});
  CHECK(tok.is_special(257));
  CHECK_FALSE(tok.is_special(258));
  CHECK(tok.decode(Ids{257, 256, 258}, true) == "he<u>");
  CHECK(tok.chat_template_source() == "{{ '<|im_start|>' }}");
  Meta no_pre;
  no_pre.pre.reset();  // absent = "default" = gpt2
  CHECK(no_pre.load().pre_tokenizer().kind() == infer::PreTokenizerKind::gpt2);
}

TEST_CASE("malformed GGUF tokenizer metadata gives typed errors", "[tokenizer][gguf]") {
  SECTION("SentencePiece and other models are unsupported") {
    Meta m;
    m.model = "llama";
    CHECK_THROWS_AS(m.load(), infer::UnsupportedError);
    CHECK_THROWS_WITH(m.load(), Contains("'llama'") && Contains("SentencePiece") && Contains("gpt2"));
  }
  SECTION("unknown pre-tokenizer") {
    Meta m;
    m.pre = "tekken";
    CHECK_THROWS_AS(m.load(), infer::TokenizerError);
    CHECK_THROWS_WITH(m.load(), Contains("tekken") && Contains("smollm"));
  }
  SECTION("merge naming an unknown token") {
    Meta m;
    m.merges.push_back("he zz");
    CHECK_THROWS_AS(m.load(), infer::TokenizerError);
    CHECK_THROWS_WITH(m.load(), Contains("merge #1") && Contains("'zz'"));
  }
  SECTION("merge without a separator") {
    Meta m;
    m.merges.push_back("hello");
    CHECK_THROWS_WITH(m.load(), Contains("tokenizer.ggml.merges[1]") && Contains("'hello'"));
  }
  SECTION("duplicate token") {
    Meta m;
    m.tokens.push_back("he");
    m.types.push_back(1);
    CHECK_THROWS_AS(m.load(), infer::TokenizerError);
    CHECK_THROWS_WITH(m.load(), Contains("duplicate token 'he'") && Contains("256") && Contains("259"));
  }
  SECTION("ids out of range") {
    Meta m;
    m.bos = 259;
    CHECK_THROWS_AS(m.load(), infer::TokenizerError);
    CHECK_THROWS_WITH(m.load(), Contains("bos_token_id = 259") && Contains("259 tokens"));
  }
  SECTION("token types") {
    Meta m;
    m.types.pop_back();
    CHECK_THROWS_WITH(m.load(), Contains("token_type has 258 entries") && Contains("259"));
    Meta bad;
    bad.types[7] = 9;
    CHECK_THROWS_WITH(bad.load(), Contains("token_type[7] = 9"));
  }
  SECTION("add_bos without a BOS id") {
    Meta m;
    m.bos.reset();
    CHECK_THROWS_WITH(m.load(), Contains("add_bos_token"));
  }
}
