// infer::Tokenizer from HF tokenizer.json: SmolLM2 ids against HF's, round trips, special tokens, BOS,
// decoding, and malformed tokenizer.json variants giving typed errors.
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "infer/tokenizer/tokenizer.hpp"
#include "support/fixtures.hpp"

using infer::EncodeOptions;
using infer::Tokenizer;
using Catch::Matchers::Contains;
using Ids = std::vector<std::int32_t>;
using nlohmann::json;

namespace {
json load(const std::string& rel) {
  std::ifstream in(infer::test::fixture(rel));
  REQUIRE(in);
  return json::parse(in);
}

const Tokenizer& smollm2() {
  static const Tokenizer tok = Tokenizer::from_hf_json(infer::test::fixture("smollm2/tokenizer.json"));
  return tok;
}

/// A tiny valid byte-level tokenizer.json: the 256 byte characters, merges "h e" → "he", "he y" → "hey",
/// and two added tokens, as a base the malformed variants edit.
json tiny() {
  json vocab = json::object();
  std::int32_t next = 0;
  vocab["<s>"] = next++;
  for (unsigned b = 0; b < 256; ++b) {
    std::string ch;
    infer::utf8::append(ch, infer::byte_level::to_code_point(static_cast<std::uint8_t>(b)));
    vocab[ch] = next++;
  }
  vocab["he"] = next++;
  vocab["hey"] = next++;
  vocab["<tool>"] = next++;
  return json{{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"h e", json::array({"he", "y"})})}}},
              {"added_tokens", json::array({{{"id", 0}, {"content", "<s>"}, {"special", true}},
                                            {{"id", next - 1}, {"content", "<tool>"}, {"special", false}}})},
              {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}}};
}

Tokenizer tiny_tok(const json& j) { return Tokenizer::from_hf_json_string(j.dump()); }
}  // namespace

TEST_CASE("SmolLM2 tokenizer.json loads with the expected shape", "[tokenizer]") {
  const Tokenizer& tok = smollm2();
  CHECK(tok.vocab_size() == 49152);
  CHECK(tok.pre_tokenizer().kind() == infer::PreTokenizerKind::gpt2);
  CHECK(tok.find("<|im_start|>") == 1);
  CHECK(tok.find("Ġworld") == 905);
  CHECK_FALSE(tok.find("no such token").has_value());
  CHECK(tok.token(905) == "Ġworld");
  CHECK(tok.token_bytes(905) == " world");
  CHECK(tok.is_special(0));
  CHECK(tok.is_special(2));
  CHECK_FALSE(tok.is_special(905));
  CHECK_FALSE(tok.is_special(-1));
  CHECK(tok.unknown_id() == 0);
  // The converted file's post_processor puts <|im_start|> first: that is its BOS, added by default.
  CHECK(tok.bos_id() == 1);
  CHECK(tok.add_bos_default());
  CHECK_FALSE(tok.eos_id().has_value());
}

TEST_CASE("SmolLM2 ids equal HF tokenizers' for every corpus text", "[tokenizer]") {
  const auto ref = load("smollm2/encode_reference.json");
  REQUIRE(ref["cases"].size() == 30);
  for (const auto& c : ref["cases"]) {
    const auto text = c["text"].get<std::string>();
    INFO(text);
    CHECK(smollm2().encode(text, {.add_bos = false}) == c["ids"].get<Ids>());
  }
}

TEST_CASE("decode(encode(text)) == text for the whole corpus", "[tokenizer]") {
  for (const auto& t : load("tokenizer/corpus.json")) {
    const auto text = t.get<std::string>();
    INFO(text);
    CHECK(smollm2().decode(smollm2().encode(text, {.add_bos = false})) == text);
    // parse_special=false spells special tokens out, and still round-trips.
    CHECK(smollm2().decode(smollm2().encode(text, {.add_bos = false, .parse_special = false})) == text);
  }
}

TEST_CASE("special tokens are split out first, longest match, unless parse_special is off", "[tokenizer]") {
  const Tokenizer& tok = smollm2();
  const Ids ids = tok.encode("<|im_start|>user<|im_end|>", {.add_bos = false});
  REQUIRE(ids.size() == 3);
  CHECK(ids[0] == 1);
  CHECK(ids[2] == 2);
  CHECK(tok.decode(ids) == "<|im_start|>user<|im_end|>");
  CHECK(tok.decode(ids, /*skip_special=*/true) == "user");

  const Ids plain = tok.encode("<|im_start|>user<|im_end|>", {.add_bos = false, .parse_special = false});
  CHECK(plain.size() > 3);
  for (auto id : plain) CHECK_FALSE(tok.is_special(id));
  CHECK(tok.decode(plain) == "<|im_start|>user<|im_end|>");

  // "<reponame>" and "<repo_name>" are both special: each text matches its own token.
  CHECK(tok.encode("<repo_name><reponame>", {.add_bos = false}) == Ids{3, 4});
  // A special token glued to text splits the text around it.
  CHECK(tok.encode("a<|endoftext|>b", {.add_bos = false}) ==
        Ids{tok.find("a").value(), 0, tok.find("b").value()});
}

TEST_CASE("non-special added tokens match even with parse_special off, longest wins", "[tokenizer]") {
  json j = tiny();
  const auto tool = j["model"]["vocab"]["<tool>"].get<std::int32_t>();
  const Tokenizer tok = tiny_tok(j);
  CHECK(tok.encode("<tool>", {.parse_special = false}) == Ids{tool});
  CHECK(tok.encode("<s><tool>") == Ids{0, tool});
  CHECK(tok.encode("<s>", {.parse_special = false}).size() == 3);
  CHECK_FALSE(tok.is_special(tool));
  CHECK(tok.is_special(0));
  CHECK(tok.decode(Ids{0, tool}, true) == "<tool>");
}

TEST_CASE("BPE merges by rank: h e → he, he y → hey", "[tokenizer]") {
  const json j = tiny();
  const Tokenizer tok = tiny_tok(j);
  const auto he = j["model"]["vocab"]["he"].get<std::int32_t>();
  const auto hey = j["model"]["vocab"]["hey"].get<std::int32_t>();
  CHECK(tok.encode("hey") == Ids{hey});
  CHECK(tok.encode("he") == Ids{he});
  CHECK(tok.encode("hhe").size() == 2);
  CHECK(tok.encode("hhe")[1] == he);
  CHECK(tok.encode("eh") == Ids{tok.find("e").value(), tok.find("h").value()});
  CHECK(tok.encode("").empty());
}

TEST_CASE("BOS and EOS handling", "[tokenizer]") {
  const Tokenizer& tok = smollm2();
  CHECK(tok.encode("Hello world!") == Ids{1, 19556, 905, 17});  // default: add BOS
  CHECK(tok.encode("Hello world!", {.add_bos = false}) == Ids{19556, 905, 17});
  CHECK(tok.encode("", {.add_bos = true}) == Ids{1});
  CHECK_THROWS_AS(tok.encode("x", {.add_eos = true}), infer::InvalidArgument);
  CHECK_THROWS_WITH(tok.encode("x", {.add_eos = true}), Contains("EOS"));

  const Tokenizer no_bos = tiny_tok(tiny());
  CHECK_FALSE(no_bos.add_bos_default());
  CHECK_FALSE(no_bos.bos_id().has_value());
  CHECK_THROWS_AS(no_bos.encode("x", {.add_bos = true}), infer::InvalidArgument);

  const Tokenizer configured = Tokenizer::from_hf_json_string(
      tiny().dump(), R"({"bos_token": "<s>", "eos_token": {"content": "<s>"}, "add_bos_token": true,
                         "chat_template": "{{ bos_token }}"})");
  CHECK(configured.bos_id() == 0);
  CHECK(configured.eos_id() == 0);
  CHECK(configured.encode("he") == Ids{0, 257});  // ids: <s> 0, bytes 1-256, he 257
  CHECK(configured.encode("he", {.add_eos = true}).back() == 0);
  CHECK(configured.encode("he").front() == 0);
  CHECK(configured.chat_template_source() == "{{ bos_token }}");
}

TEST_CASE("decode rejects out-of-range ids and repairs broken UTF-8", "[tokenizer]") {
  const Tokenizer& tok = smollm2();
  CHECK_THROWS_AS(tok.decode(Ids{19556, 49152}), infer::InvalidArgument);
  CHECK_THROWS_WITH(tok.decode(Ids{19556, 49152}), Contains("49152") && Contains("position 1"));
  CHECK_THROWS_AS(tok.decode(Ids{-1}), infer::InvalidArgument);
  CHECK_THROWS_AS(tok.token(49152), infer::InvalidArgument);
  CHECK_THROWS_AS(tok.token_bytes(-5), infer::InvalidArgument);
  // The first byte of "你" alone is an incomplete sequence: it decodes to U+FFFD.
  const Ids ni = tok.encode("你", {.add_bos = false});
  REQUIRE(ni.size() >= 2);
  CHECK(tok.decode(Ids{ni[0]}) == "\xEF\xBF\xBD");
}

TEST_CASE("invalid UTF-8 input is a TokenizerError naming the offset", "[tokenizer]") {
  const Tokenizer& tok = smollm2();
  CHECK_THROWS_AS(tok.encode("abc\xc3"), infer::TokenizerError);
  CHECK_THROWS_WITH(tok.encode("abc\xc3"), Contains("UTF-8") && Contains("offset 3"));
  CHECK_THROWS_WITH(tok.encode("\xed\xa0\x80"), Contains("offset 0"));  // a surrogate
  CHECK_THROWS_AS(tok.encode("\xc0\xaf"), infer::TokenizerError);      // overlong
}

TEST_CASE("encoding from many threads gives the same ids", "[tokenizer]") {
  const auto ref = load("smollm2/encode_reference.json");
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  const Tokenizer copy = smollm2();  // copies share tables and cache
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round) {
        for (const auto& c : ref["cases"]) {
          if (copy.encode(c["text"].get<std::string>(), {.add_bos = false}) != c["ids"].get<Ids>()) ++mismatches[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(mismatches == std::vector<int>(4, 0));
}

TEST_CASE("malformed tokenizer.json variants give typed errors", "[tokenizer]") {
  CHECK_THROWS_AS(Tokenizer::from_hf_json_string("{not json"), infer::FormatError);
  CHECK_THROWS_WITH(Tokenizer::from_hf_json_string("{not json"), Contains("not valid JSON"));
  CHECK_THROWS_AS(Tokenizer::from_hf_json_string("[]"), infer::FormatError);
  CHECK_THROWS_WITH(Tokenizer::from_hf_json_string("{}"), Contains("'model'"));
  CHECK_THROWS_AS(Tokenizer::from_hf_json(infer::test::fixture("no/such/tokenizer.json")), infer::IoError);

  SECTION("merge naming an unknown token") {
    json j = tiny();
    j["model"]["merges"].push_back("q zz");
    CHECK_THROWS_AS(tiny_tok(j), infer::TokenizerError);
    CHECK_THROWS_WITH(tiny_tok(j), Contains("merge #2") && Contains("'zz'"));
  }
  SECTION("merge whose result is not in the vocabulary") {
    json j = tiny();
    j["model"]["merges"].push_back("a b");
    CHECK_THROWS_WITH(tiny_tok(j), Contains("produces 'ab'"));
  }
  SECTION("merge that is not two tokens") {
    json j = tiny();
    j["model"]["merges"].push_back("abc");
    CHECK_THROWS_AS(tiny_tok(j), infer::TokenizerError);
    j["model"]["merges"].back() = 42;
    CHECK_THROWS_AS(tiny_tok(j), infer::FormatError);
  }
  SECTION("two tokens with one id") {
    json j = tiny();
    j["model"]["vocab"]["extra"] = 5;
    CHECK_THROWS_AS(tiny_tok(j), infer::TokenizerError);
    CHECK_THROWS_WITH(tiny_tok(j), Contains("'extra'") && Contains("id 5") && Contains("already taken"));
  }
  SECTION("a gap in the ids") {
    json j = tiny();
    j["model"]["vocab"]["far"] = 1000;
    CHECK_THROWS_WITH(tiny_tok(j), Contains("no token has id 260"));
  }
  SECTION("negative id and non-integer id") {
    json j = tiny();
    j["model"]["vocab"]["neg"] = -3;
    CHECK_THROWS_WITH(tiny_tok(j), Contains("'neg'") && Contains("-3"));
    j["model"]["vocab"]["neg"] = "x";
    CHECK_THROWS_AS(tiny_tok(j), infer::FormatError);
  }
  SECTION("added token whose id holds another token") {
    json j = tiny();
    j["added_tokens"].push_back({{"id", 5}, {"content", "<x>"}, {"special", true}});
    CHECK_THROWS_WITH(tiny_tok(j), Contains("'<x>'") && Contains("already taken"));
  }
  SECTION("model types and pre-tokenizers that are not byte-level BPE") {
    json j = tiny();
    j["model"]["type"] = "Unigram";
    CHECK_THROWS_AS(tiny_tok(j), infer::UnsupportedError);
    CHECK_THROWS_WITH(tiny_tok(j), Contains("Unigram"));
    j = tiny();
    j["pre_tokenizer"] = {{"type", "Metaspace"}};
    CHECK_THROWS_AS(tiny_tok(j), infer::TokenizerError);
    CHECK_THROWS_WITH(tiny_tok(j), Contains("Metaspace") && Contains("ByteLevel"));
    j["pre_tokenizer"] = nullptr;
    CHECK_THROWS_WITH(tiny_tok(j), Contains("no ByteLevel"));
    j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(bad"}}}, {"behavior", "Isolated"}};
    CHECK_THROWS_AS(tiny_tok(j), infer::TokenizerError);
    j = tiny();
    j["normalizer"] = {{"type", "Lowercase"}};
    CHECK_THROWS_AS(tiny_tok(j), infer::UnsupportedError);
  }
  SECTION("special token names that are not in the vocabulary") {
    CHECK_THROWS_AS(Tokenizer::from_hf_json_string(tiny().dump(), R"({"eos_token": "</s>"})"), infer::TokenizerError);
    CHECK_THROWS_WITH(Tokenizer::from_hf_json_string(tiny().dump(), R"({"eos_token": "</s>"})"),
                      Contains("eos_token") && Contains("</s>"));
  }
}

TEST_CASE("Llama-3 and SmolLM style pre-tokenizer sequences are recognised", "[tokenizer]") {
  json j = tiny();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", json::array({{{"type", "Digits"}, {"individual_digits", true}},
                                                       {{"type", "ByteLevel"}, {"use_regex", true}}})}};
  CHECK(tiny_tok(j).pre_tokenizer().kind() == infer::PreTokenizerKind::smollm);
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"},
                     {"pattern", {{"Regex", std::string(infer::pretokenizer_patterns::llama3)}}},
                     {"behavior", "Isolated"},
                     {"invert", false}},
                    {{"type", "ByteLevel"}, {"use_regex", false}}})}};
  CHECK(tiny_tok(j).pre_tokenizer().kind() == infer::PreTokenizerKind::llama3);
}
