// The GGUF reader on the default model (SmolLM2-135M-Instruct Q4_1), checked against facts of the file
// and against gguf-py's dequantization of some of its tensors (tests/fixtures/smollm2/dequant_reference.json).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "infer/io/gguf.hpp"
#include "support/fixtures.hpp"

using namespace infer;

namespace {
const gguf::File& model() {
  static const gguf::File f = gguf::File::open(test::default_model());
  return f;
}
}  // namespace

TEST_CASE("default model: header, counts and tensor types", "[io][gguf][model]") {
  const auto& f = model();
  CHECK(f.version() == 3);
  CHECK(f.alignment() == 32);
  CHECK(f.metadata().size() == 33);
  REQUIRE(f.tensors().size() == 272);
  std::map<DType, int> counts;
  for (const auto& t : f.tensors()) ++counts[t.type];
  CHECK(counts[DType::q4_1] == 210);
  CHECK(counts[DType::f32] == 61);
  CHECK(counts[DType::q8_0] == 1);
  CHECK(counts.size() == 3);
  // Tensors do not overlap, and the last one ends within 32 bytes of the end of the file.
  std::vector<const gguf::TensorInfo*> by_offset;
  for (const auto& t : f.tensors()) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  CHECK(by_offset.front()->offset == 0);
  for (std::size_t i = 0; i + 1 < by_offset.size(); ++i) {
    INFO(by_offset[i]->name);
    CHECK(by_offset[i]->offset + by_offset[i]->bytes <= by_offset[i + 1]->offset);
  }
  const auto end = f.data_offset() + by_offset.back()->offset + by_offset.back()->bytes;
  const auto size = std::filesystem::file_size(test::default_model());
  CHECK(end <= size);
  CHECK(size - end < 32);
}

TEST_CASE("default model: shapes of named tensors", "[io][gguf][model]") {
  const auto& f = model();
  const auto& emb = f.tensor("token_embd.weight");
  CHECK(emb.type == DType::q8_0);
  CHECK(emb.shape == std::vector<std::uint64_t>{576, 49152});
  CHECK(emb.elements() == 576ull * 49152);
  CHECK(emb.bytes == 576ull / 32 * 34 * 49152);
  CHECK(f.tensor("blk.0.attn_q.weight").shape == std::vector<std::uint64_t>{576, 576});
  CHECK(f.tensor("blk.0.attn_k.weight").shape == std::vector<std::uint64_t>{576, 192});  // 3 KV heads of 64
  CHECK(f.tensor("blk.0.ffn_up.weight").shape == std::vector<std::uint64_t>{576, 1536});
  CHECK(f.tensor("blk.29.ffn_down.weight").shape == std::vector<std::uint64_t>{1536, 576});
  CHECK(f.tensor("blk.29.ffn_down.weight").type == DType::q4_1);
  CHECK(f.tensor("output_norm.weight").shape == std::vector<std::uint64_t>{576});
  CHECK(f.tensor("output_norm.weight").type == DType::f32);
  CHECK(f.find_tensor("output.weight") == nullptr);  // tied embeddings
  CHECK(f.find_tensor("blk.30.attn_q.weight") == nullptr);
}

TEST_CASE("default model: metadata", "[io][gguf][model]") {
  const auto& f = model();
  CHECK(f.architecture() == "llama");
  CHECK(f.get<std::uint32_t>("llama.block_count") == 30);
  CHECK(f.get<std::uint32_t>("llama.embedding_length") == 576);
  CHECK(f.get<std::uint32_t>("llama.attention.head_count") == 9);
  CHECK(f.get<std::uint32_t>("llama.attention.head_count_kv") == 3);
  CHECK(f.get<int>("llama.feed_forward_length") == 1536);
  CHECK(f.get<float>("llama.attention.layer_norm_rms_epsilon") > 0.0f);
  CHECK(f.get<std::string>("tokenizer.ggml.model") == "gpt2");
  const auto tokens = f.get_strings("tokenizer.ggml.tokens");
  CHECK(tokens.size() == 49152);
  CHECK(f.get_ints("tokenizer.ggml.token_type").size() == 49152);
  CHECK(f.at("tokenizer.ggml.tokens").to_display(2).find("(49152 items)") != std::string::npos);
  CHECK(f.get_optional<std::string>("tokenizer.chat_template").has_value());
}

TEST_CASE("default model: dequantized values match gguf-py", "[io][gguf][model]") {
  std::ifstream in(test::fixture("smollm2/dequant_reference.json"));
  REQUIRE(in);
  const auto j = nlohmann::json::parse(in);
  const auto& f = model();
  int n = 0;
  for (const auto& ref : j.at("tensors")) {
    const std::string name = ref.at("name");
    INFO("tensor " << name);
    const auto& t = f.tensor(name);
    CHECK(t.shape == ref.at("shape").get<std::vector<std::uint64_t>>());
    const auto v = f.dequantize(t);
    REQUIRE(v.size() == t.elements());
    auto close = [](double got, double want) { return std::fabs(got - want) <= 1e-6 * std::fabs(want); };
    const auto head = ref.at("head").get<std::vector<double>>();
    for (std::size_t i = 0; i < head.size(); ++i) CHECK(close(v[i], head[i]));
    const auto idx = ref.at("indices").get<std::vector<std::size_t>>();
    const auto vals = ref.at("values").get<std::vector<double>>();
    REQUIRE(idx.size() == vals.size());
    for (std::size_t i = 0; i < idx.size(); ++i) {
      INFO("index " << idx[i]);
      CHECK(close(v[idx[i]], vals[i]));
    }
    double sum = 0, sum_abs = 0;
    for (float x : v) {
      sum += x;
      sum_abs += std::fabs(x);
    }
    const double want_sum = ref.at("sum"), want_abs = ref.at("sum_abs");
    CHECK(std::fabs(sum - want_sum) <= 1e-6 * want_abs);  // sum cancels: bound it by the magnitude
    CHECK(std::fabs(sum_abs - want_abs) <= 1e-9 * want_abs);
    ++n;
  }
  CHECK(n == 5);
}
