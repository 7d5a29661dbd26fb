// Pre-tokenizer splits against the reference splits HF `tokenizers` produced (Split(Regex, Isolated))
// for every corpus text, plus the smollm digit split, GGUF name mapping and malformed patterns.
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "infer/tokenizer/pretokenizer.hpp"
#include "support/fixtures.hpp"

using infer::PreTokenizer;
using infer::PreTokenizerKind;
using Catch::Matchers::Contains;

namespace {
nlohmann::json load(const std::string& rel) {
  std::ifstream in(infer::test::fixture(rel));
  REQUIRE(in);
  return nlohmann::json::parse(in);
}
using Pieces = std::vector<std::string>;
}  // namespace

TEST_CASE("named kinds carry the reference patterns", "[pretokenizer]") {
  const auto ref = load("tokenizer/pretokenize_reference.json");
  CHECK(PreTokenizer::kind_patterns(PreTokenizerKind::gpt2) == Pieces{ref["gpt2"]["pattern"].get<std::string>()});
  CHECK(PreTokenizer::kind_patterns(PreTokenizerKind::llama3) == Pieces{ref["llama3"]["pattern"].get<std::string>()});
  CHECK(PreTokenizer::kind_patterns(PreTokenizerKind::qwen2) == Pieces{ref["qwen2"]["pattern"].get<std::string>()});
}

TEST_CASE("splits equal HF tokenizers' for every corpus text", "[pretokenizer]") {
  const auto ref = load("tokenizer/pretokenize_reference.json");
  const auto corpus = load("tokenizer/corpus.json");
  for (const char* name : {"gpt2", "llama3", "qwen2"}) {
    const auto& entry = ref[name];
    // Compiled from the fixture's own pattern, which from_patterns must recognise as the named kind.
    const PreTokenizer pre = PreTokenizer::from_patterns({entry["pattern"].get<std::string>()});
    CHECK(infer::to_string(pre.kind()) == name);
    REQUIRE(entry["cases"].size() == corpus.size());
    for (const auto& c : entry["cases"]) {
      const auto text = c["text"].get<std::string>();
      INFO(name << ": " << text);
      CHECK(pre.split(text) == c["pieces"].get<Pieces>());
    }
  }
}

TEST_CASE("smollm isolates every numeric character, then applies the GPT-2 split", "[pretokenizer]") {
  const auto pre = PreTokenizer::from_gguf_name("smollm");
  CHECK(pre.kind() == PreTokenizerKind::smollm);
  CHECK(pre.split("in 2024, 3.14") == Pieces{"in", " ", "2", "0", "2", "4", ",", " ", "3", ".", "1", "4"});
  CHECK(pre.split("x²+½") == Pieces{"x", "²", "+", "½"});
  // The GPT-2 split alone keeps digit runs together, with their leading space.
  CHECK(PreTokenizer::from_kind(PreTokenizerKind::gpt2).split("in 2024") == Pieces{"in", " 2024"});
  CHECK(PreTokenizer::from_kind(PreTokenizerKind::llama3).split("1234567") == Pieces{"123", "456", "7"});
  CHECK(PreTokenizer::from_kind(PreTokenizerKind::qwen2).split("123") == Pieces{"1", "2", "3"});
}

TEST_CASE("pieces cover the text exactly, including edge cases", "[pretokenizer]") {
  const auto pre = PreTokenizer::from_kind(PreTokenizerKind::gpt2);
  CHECK(pre.split("").empty());
  CHECK(pre.split(" ") == Pieces{" "});
  CHECK(pre.split("a  b") == Pieces{"a", " ", " b"});
  // A long run of spaces must neither overflow the JIT stack nor go quadratic.
  const std::string spaces(200000, ' ');
  const auto pieces = pre.split(spaces + "x");
  REQUIRE(pieces.size() == 2);
  CHECK(pieces[0].size() == spaces.size() - 1);
  CHECK(pieces[1] == " x");
}

TEST_CASE("gaps between matches of a custom pattern are pieces too", "[pretokenizer]") {
  const auto pre = PreTokenizer::from_patterns({"[0-9]+"});
  CHECK(pre.kind() == PreTokenizerKind::custom);
  CHECK(pre.split("ab12cd345") == Pieces{"ab", "12", "cd", "345"});
  // A pattern that can match empty advances instead of looping forever.
  CHECK(PreTokenizer::from_patterns({"x*"}).split("axxb") == Pieces{"a", "xx", "b"});
  // No steps: the whole text is one piece (ByteLevel with use_regex=false).
  CHECK(PreTokenizer::from_patterns({}).split("a b") == Pieces{"a b"});
}

TEST_CASE("GGUF pre-tokenizer names map onto kinds, unknown names are refused", "[pretokenizer]") {
  CHECK(PreTokenizer::from_gguf_name("llama-bpe").kind() == PreTokenizerKind::llama3);
  CHECK(PreTokenizer::from_gguf_name("llama3").kind() == PreTokenizerKind::llama3);
  CHECK(PreTokenizer::from_gguf_name("qwen2").kind() == PreTokenizerKind::qwen2);
  CHECK(PreTokenizer::from_gguf_name("gpt2").kind() == PreTokenizerKind::gpt2);
  CHECK(PreTokenizer::from_gguf_name("default").kind() == PreTokenizerKind::gpt2);
  CHECK_THROWS_AS(PreTokenizer::from_gguf_name("deepseek-llm"), infer::TokenizerError);
  CHECK_THROWS_WITH(PreTokenizer::from_gguf_name("deepseek-llm"),
                    Contains("deepseek-llm") && Contains("smollm") && Contains("llama-bpe") && Contains("qwen2"));
}

TEST_CASE("bad patterns and invalid UTF-8 give typed errors", "[pretokenizer]") {
  CHECK_THROWS_AS(PreTokenizer::from_patterns({"(unclosed"}), infer::TokenizerError);
  CHECK_THROWS_WITH(PreTokenizer::from_patterns({"(unclosed"}), Contains("(unclosed") && Contains("offset"));
  const auto pre = PreTokenizer::from_kind(PreTokenizerKind::gpt2);
  CHECK_THROWS_AS(pre.split("ok \xff bad"), infer::TokenizerError);
  CHECK_THROWS_WITH(pre.split("ok \xff bad"), Contains("UTF-8") && Contains("offset 3") && Contains("0xff"));
}
