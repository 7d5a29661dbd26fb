#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "infer/attention/paged_attention.hpp"
#include "infer/core/half.hpp"
#include "infer/io/safetensors.hpp"
#include "infer/model/llama.hpp"
#include "infer/model/model_source.hpp"
#include "infer/quant/f32.hpp"
#include "support/fixtures.hpp"

using namespace infer;
using safetensors::File;
using Catch::Contains;

namespace {

using Bytes = std::vector<std::byte>;

void put_u64(Bytes& b, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xff));
}
template <class T>
void put(Bytes& b, T v) {
  std::byte tmp[sizeof(T)];
  std::memcpy(tmp, &v, sizeof(T));
  b.insert(b.end(), tmp, tmp + sizeof(T));
}

/// A safetensors file: length prefix (the header's real size unless overridden), header, data.
Bytes make_file(const std::string& header, const Bytes& data = {}, std::optional<std::uint64_t> n = std::nullopt) {
  Bytes b;
  put_u64(b, n.value_or(header.size()));
  for (char c : header) b.push_back(static_cast<std::byte>(c));
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

/// One-tensor header with the given fields, for the malformed cases.
std::string one(const std::string& fields) { return R"({"w":{)" + fields + "}}"; }

File load(const std::string& header, std::size_t data_bytes = 0) {
  return File::from_bytes(make_file(header, Bytes(data_bytes)), "test.safetensors");
}

/// A valid file: f32 [2,3], f16 [4], bf16 scalar, an empty f32 [0,5], and metadata.
Bytes sample_file(std::size_t pad = 0) {
  Bytes data;
  for (float v : {1.0f, -2.0f, 0.5f, 3.25f, 1e-3f, -0.0f}) put(data, v);  // [0, 24)
  for (int h : {0x3c00, 0xc000, 0x3800, 0x7bff}) put(data, static_cast<std::uint16_t>(h));  // [24, 32): 1, -2, 0.5, 65504
  put(data, std::uint16_t{0x4049});                                       // [32, 34): bf16 3.140625
  nlohmann::json h;
  h["a.weight"] = {{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0, 24}}};
  h["b.half"] = {{"dtype", "F16"}, {"shape", {4}}, {"data_offsets", {24, 32}}};
  h["c.scalar"] = {{"dtype", "BF16"}, {"shape", nlohmann::json::array()}, {"data_offsets", {32, 34}}};
  h["d.empty"] = {{"dtype", "F32"}, {"shape", {0, 5}}, {"data_offsets", {34, 34}}};
  h["__metadata__"] = {{"format", "pt"}, {"note", "made by a test"}};
  return make_file(h.dump() + std::string(pad, ' '), data);
}

/// A fresh empty directory, removed with everything in it at scope exit.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           ("infer_st_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  void write(const std::string& name, const Bytes& b) const {
    std::ofstream(path / name, std::ios::binary).write(reinterpret_cast<const char*>(b.data()),
                                                       static_cast<std::streamsize>(b.size()));
  }
  void write(const std::string& name, const std::string& s) const {
    std::ofstream(path / name, std::ios::binary) << s;
  }
};

/// A shard holding f32 tensors of 2 elements each, valued {base, base + 1}.
Bytes shard(const std::vector<std::string>& names, float base) {
  nlohmann::json h;
  Bytes data;
  std::uint64_t off = 0;
  for (const auto& n : names) {
    h[n] = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {off, off + 8}}};
    put(data, base);
    put(data, base + 1);
    base += 10;
    off += 8;
  }
  return make_file(h.dump(), data);
}

}  // namespace

TEST_CASE("safetensors: a valid file's tensors, shapes, spans and metadata", "[io][safetensors]") {
  const auto bytes = sample_file();
  const auto f = File::from_bytes(bytes, "sample.safetensors");
  REQUIRE(f.tensors().size() == 4);
  CHECK(f.tensors()[0].name == "a.weight");
  CHECK(f.tensors()[3].name == "d.empty");
  CHECK(f.path() == "sample.safetensors");
  CHECK(f.data_bytes() == 34);
  CHECK(f.header_bytes() == bytes.size() - 8 - 34);

  const auto& a = f.at("a.weight");
  CHECK(a.dtype == DType::f32);
  CHECK(a.shape == std::vector<std::uint64_t>{2, 3});
  CHECK(a.elements() == 6);
  CHECK(a.begin == 0);
  CHECK(a.data.size() == 24);
  CHECK(a.data.data() == f.tensors()[0].data.data());
  CHECK(safetensors::to_f32(a) == std::vector<float>{1.0f, -2.0f, 0.5f, 3.25f, 1e-3f, -0.0f});

  const auto& b = f.at("b.half");
  CHECK(b.dtype == DType::f16);
  CHECK(b.begin == 24);
  CHECK(safetensors::to_f32(b) == std::vector<float>{1.0f, -2.0f, 0.5f, 65504.0f});

  const auto& c = f.at("c.scalar");
  CHECK(c.dtype == DType::bf16);
  CHECK(c.shape.empty());
  CHECK(c.elements() == 1);
  CHECK(safetensors::to_f32(c) == std::vector<float>{3.140625f});

  const auto& d = f.at("d.empty");
  CHECK(d.elements() == 0);
  CHECK(d.data.empty());
  CHECK(safetensors::to_f32(d).empty());

  CHECK(f.metadata().size() == 2);
  CHECK(f.metadata().at("format") == "pt");
  CHECK(f.find("__metadata__") == nullptr);
  CHECK(f.find("missing") == nullptr);
  CHECK_THROWS_AS(f.at("missing"), NotFoundError);
  CHECK_THROWS_WITH(f.at("missing"), Contains("'missing'") && Contains("sample.safetensors"));

  std::vector<float> small(3);
  CHECK_THROWS_AS(safetensors::copy_f32(a, small), InvalidArgument);
}

TEST_CASE("safetensors: header padding, moves, and opening from disk", "[io][safetensors]") {
  const auto padded = File::from_bytes(sample_file(5));  // HF pads the header with spaces to align data
  CHECK(safetensors::to_f32(padded.at("b.half"))[3] == 65504.0f);

  auto f = File::from_bytes(sample_file());
  const auto* before = f.at("a.weight").data.data();
  File moved = std::move(f);
  CHECK(moved.at("a.weight").data.data() == before);  // spans survive a move
  CHECK(safetensors::to_f32(moved.at("a.weight"))[1] == -2.0f);

  TempDir dir;
  dir.write("m.safetensors", sample_file());
  const auto disk = File::open(dir.path / "m.safetensors");
  CHECK(disk.tensors().size() == 4);
  CHECK(safetensors::to_f32(disk.at("c.scalar")) == std::vector<float>{3.140625f});
  CHECK_THROWS_AS(File::open(dir.path / "absent.safetensors"), IoError);
  CHECK_THROWS_WITH(File::open(dir.path / "absent.safetensors"), Contains("absent.safetensors"));

  // An empty header object is a valid file with no tensors.
  CHECK(load("{}").tensors().empty());
  CHECK(load("{\"__metadata__\":{}}").tensors().empty());
}

TEST_CASE("safetensors: truncated files and absurd header lengths", "[io][safetensors]") {
  CHECK_THROWS_AS(File::from_bytes({}), FormatError);
  CHECK_THROWS_WITH(File::from_bytes(Bytes(7), "t.st"), Contains("t.st") && Contains("7 bytes"));

  const std::string h = "{}";
  // N exactly reaching the end is fine; one past is not.
  CHECK_NOTHROW(File::from_bytes(make_file(h, {}, 2)));
  CHECK_THROWS_AS(File::from_bytes(make_file(h, {}, 3)), FormatError);
  CHECK_THROWS_WITH(File::from_bytes(make_file(h, {}, 3)), Contains("header length 3") && Contains("past the end"));
  // Over 100 MB is rejected before anything is read, even when the bytes claimed do not exist.
  CHECK_THROWS_WITH(File::from_bytes(make_file(h, {}, 100ull * 1024 * 1024 + 1)), Contains("limit"));
  CHECK_THROWS_AS(File::from_bytes(make_file(h, {}, ~0ull)), FormatError);
}

TEST_CASE("safetensors: the header must be a JSON object of well-formed entries", "[io][safetensors]") {
  CHECK_THROWS_AS(load("{\"w\":"), FormatError);
  CHECK_THROWS_WITH(load("{\"w\":"), Contains("not valid JSON"));
  CHECK_THROWS_WITH(load("[1,2]"), Contains("must be a JSON object") && Contains("array"));
  CHECK_THROWS_WITH(load(R"({"w": 5})"), Contains("'w'") && Contains("must be an object"));
  CHECK_THROWS_WITH(load(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4), Contains("'w'") && Contains("\"dtype\""));
  CHECK_THROWS_WITH(load(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", 4), Contains("\"shape\""));
  CHECK_THROWS_WITH(load(R"({"w":{"dtype":"F32","shape":[1]}})", 4), Contains("\"data_offsets\""));
  CHECK_THROWS_WITH(load(one(R"("dtype":7,"shape":[1],"data_offsets":[0,4])"), 4), Contains("dtype must be a string"));
  CHECK_THROWS_WITH(load(one(R"("dtype":"F32","shape":4,"data_offsets":[0,4])"), 4), Contains("shape must be an array"));
  CHECK_THROWS_WITH(load(one(R"("dtype":"F32","shape":[-1],"data_offsets":[0,4])"), 4), Contains("non-negative integers"));
  CHECK_THROWS_AS(load(one(R"("dtype":"F32","shape":[1.5],"data_offsets":[0,4])"), 4), FormatError);
  CHECK_THROWS_AS(load(one(R"("dtype":"F32","shape":["1"],"data_offsets":[0,4])"), 4), FormatError);
  CHECK_THROWS_WITH(load(one(R"("dtype":"F32","shape":[1],"data_offsets":[0])"), 4), Contains("[begin, end]"));
  CHECK_THROWS_AS(load(one(R"("dtype":"F32","shape":[1],"data_offsets":[0,4,8])"), 8), FormatError);
  CHECK_THROWS_AS(load(one(R"("dtype":"F32","shape":[1],"data_offsets":{"a":0})"), 4), FormatError);
  CHECK_THROWS_AS(load(one(R"("dtype":"F32","shape":[1],"data_offsets":[-4,0])"), 4), FormatError);
  // A name given twice would be ambiguous; nlohmann alone would silently keep the last one.
  CHECK_THROWS_WITH(load(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                         R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
                    Contains("'w' twice"));
  CHECK_THROWS_WITH(load(R"({"__metadata__":[1]})"), Contains("__metadata__ must be an object"));
  CHECK_THROWS_WITH(load(R"({"__metadata__":{"k":1}})"), Contains("'k'") && Contains("must be a string"));
}

TEST_CASE("safetensors: dtypes other than F32/F16/BF16/I8/F8_E4M3/I32 are unsupported, naming tensor and dtype",
          "[io][safetensors]") {
  CHECK(load(R"({"layer.w":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}})", 1).find("layer.w")->dtype == DType::int8);
  CHECK(load(R"({"layer.w":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})", 1).find("layer.w")->dtype ==
        DType::fp8_e4m3);
  CHECK(load(R"({"layer.w":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})", 4).find("layer.w")->dtype == DType::int32);
  for (const char* dt : {"U8", "I64", "F64", "BOOL", "F8_E5M2", "Q4"}) {
    const auto h = R"({"layer.w":{"dtype":")" + std::string(dt) + R"(","shape":[1],"data_offsets":[0,1]}})";
    CHECK_THROWS_AS(load(h, 1), UnsupportedError);
    CHECK_THROWS_WITH(load(h, 1), Contains("'layer.w'") && Contains(dt));
  }
}

TEST_CASE("safetensors: offsets must lie in the data section, match the shape and not overlap", "[io][safetensors]") {
  const auto f32 = [](std::uint64_t b, std::uint64_t e, const std::string& shape = "[1]") {
    return R"("dtype":"F32","shape":)" + shape + R"(,"data_offsets":[)" + std::to_string(b) + "," +
           std::to_string(e) + "]";
  };
  CHECK_THROWS_WITH(load(one(f32(8, 4)), 8), Contains("begin 8 is after end 4"));
  // end == data size is the last valid position; one byte more is out of bounds.
  CHECK_NOTHROW(load(one(f32(4, 8)), 8));
  CHECK_THROWS_AS(load(one(f32(5, 9)), 8), FormatError);
  CHECK_THROWS_WITH(load(one(f32(5, 9)), 8), Contains("'w'") && Contains("past the end") && Contains("8 bytes"));
  CHECK_THROWS_WITH(load(one(f32(0, 8)), 8), Contains("hold 8 bytes") && Contains("needs 4"));
  CHECK_THROWS_WITH(load(one(f32(0, 12, "[2,2]")), 16), Contains("needs 16"));
  // Huge offsets cannot wrap around the bounds check.
  CHECK_THROWS_AS(load(one(f32(18446744073709551612ull, 18446744073709551615ull)), 8), FormatError);

  // Shapes whose element count or byte count overflows 64 bits.
  CHECK_THROWS_WITH(load(one(f32(0, 4, "[4294967296,4294967296]")), 4), Contains("64 bits"));
  CHECK_THROWS_WITH(load(one(f32(0, 4, "[4611686018427387904,2]")), 4), Contains("bytes than fit in 64 bits"));
  // A zero dimension makes the product 0 even after a huge one.
  CHECK_NOTHROW(load(one(f32(0, 0, "[18446744073709551615,0]")), 4));

  const std::string two_a = R"({"a":{)" + f32(0, 8, "[2]") + R"(},"b":{)";
  CHECK_THROWS_AS(load(two_a + f32(4, 12, "[2]") + "}}", 12), FormatError);
  CHECK_THROWS_WITH(load(two_a + f32(4, 12, "[2]") + "}}", 12), Contains("'a'") && Contains("'b'") && Contains("overlap"));
  CHECK_THROWS_WITH(load(two_a + f32(0, 8, "[2]") + "}}", 8), Contains("overlap"));  // identical ranges
  CHECK_NOTHROW(load(two_a + f32(8, 16, "[2]") + "}}", 16));                         // adjacent is fine
  CHECK_NOTHROW(load(two_a + f32(4, 4, "[0]") + "}}", 8));                           // empty inside another
}

TEST_CASE("safetensors: a sharded checkpoint through its index", "[io][safetensors]") {
  TempDir dir;
  dir.write("model-00001-of-00002.safetensors", shard({"embed", "layer0"}, 1.0f));
  dir.write("model-00002-of-00002.safetensors", shard({"layer1", "lm_head"}, 100.0f));
  nlohmann::json index;
  index["metadata"] = {{"total_size", 32}};
  index["weight_map"] = {{"embed", "model-00001-of-00002.safetensors"},
                         {"layer0", "model-00001-of-00002.safetensors"},
                         {"layer1", "model-00002-of-00002.safetensors"},
                         {"lm_head", "model-00002-of-00002.safetensors"}};
  dir.write("model.safetensors.index.json", index.dump());
  dir.write("model.safetensors", shard({"decoy"}, 0.0f));  // the index wins over a single file

  const auto c = safetensors::Checkpoint::open(dir.path);
  CHECK(c.shards().size() == 2);  // each shard opened once
  CHECK(c.size() == 4);
  CHECK(c.names() == std::vector<std::string>{"embed", "layer0", "layer1", "lm_head"});
  CHECK(safetensors::to_f32(c.at("layer0")) == std::vector<float>{11.0f, 12.0f});
  CHECK(safetensors::to_f32(c.at("lm_head")) == std::vector<float>{110.0f, 111.0f});
  CHECK(c.shard_of("layer1").path().find("model-00002-of-00002") != std::string::npos);
  CHECK(c.find("decoy") == nullptr);
  CHECK_THROWS_AS(c.at("nope"), NotFoundError);
  CHECK_THROWS_WITH(c.at("nope"), Contains("'nope'") && Contains("model-00001-of-00002.safetensors") &&
                                      Contains("model-00002-of-00002.safetensors"));

  // The index file itself can be given.
  CHECK(safetensors::Checkpoint::open(dir.path / "model.safetensors.index.json").size() == 4);
}

TEST_CASE("safetensors: single-file checkpoints and a missing one", "[io][safetensors]") {
  TempDir dir;
  CHECK_THROWS_AS(safetensors::Checkpoint::open(dir.path), NotFoundError);
  CHECK_THROWS_WITH(safetensors::Checkpoint::open(dir.path),
                    Contains("model.safetensors") && Contains("model.safetensors.index.json"));
  dir.write("model.safetensors", shard({"x", "y"}, 5.0f));
  const auto c = safetensors::Checkpoint::open(dir.path);
  CHECK(c.shards().size() == 1);
  CHECK(safetensors::to_f32(c.at("y")) == std::vector<float>{15.0f, 16.0f});
  CHECK(safetensors::Checkpoint::open(dir.path / "model.safetensors").size() == 2);
}

TEST_CASE("safetensors: inconsistent sharded checkpoints", "[io][safetensors]") {
  TempDir dir;
  dir.write("s1.safetensors", shard({"a", "both"}, 1.0f));
  dir.write("s2.safetensors", shard({"b", "both"}, 2.0f));
  auto write_index = [&](const nlohmann::json& wm) {
    dir.write("model.safetensors.index.json", nlohmann::json{{"weight_map", wm}}.dump());
  };

  write_index({{"a", "s1.safetensors"}, {"b", "s2.safetensors"}});
  CHECK_THROWS_AS(safetensors::Checkpoint::open(dir.path), FormatError);
  CHECK_THROWS_WITH(safetensors::Checkpoint::open(dir.path),
                    Contains("'both'") && Contains("s1.safetensors") && Contains("s2.safetensors"));

  dir.write("s2.safetensors", shard({"b"}, 2.0f));
  write_index({{"a", "s2.safetensors"}, {"b", "s2.safetensors"}});  // 'a' is really in s1
  CHECK_THROWS_WITH(safetensors::Checkpoint::open(dir.path), Contains("'a'") && Contains("does not contain it"));

  write_index({{"a", "s1.safetensors"}, {"c", "s3.safetensors"}});
  CHECK_THROWS_AS(safetensors::Checkpoint::open(dir.path), IoError);
  CHECK_THROWS_WITH(safetensors::Checkpoint::open(dir.path), Contains("s3.safetensors"));

  write_index({{"a", "../s1.safetensors"}});
  CHECK_THROWS_WITH(safetensors::Checkpoint::open(dir.path), Contains("../s1.safetensors") && Contains("relative"));
  write_index({{"a", "/etc/passwd"}});
  CHECK_THROWS_AS(safetensors::Checkpoint::open(dir.path), FormatError);
  write_index({{"a", 3}});
  CHECK_THROWS_WITH(safetensors::Checkpoint::open(dir.path), Contains("'a'") && Contains("must name a file"));

  dir.write("model.safetensors.index.json", std::string(R"({"metadata":{}})"));
  CHECK_THROWS_WITH(safetensors::Checkpoint::open(dir.path), Contains("weight_map"));
  dir.write("model.safetensors.index.json", std::string(R"({"weight_map":[]})"));
  CHECK_THROWS_AS(safetensors::Checkpoint::open(dir.path), FormatError);
  dir.write("model.safetensors.index.json", std::string("{oops"));
  CHECK_THROWS_WITH(safetensors::Checkpoint::open(dir.path), Contains("not valid JSON"));

  // A malformed shard reports the shard's own path.
  dir.write("s1.safetensors", Bytes(3));
  write_index({{"a", "s1.safetensors"}});
  CHECK_THROWS_WITH(safetensors::Checkpoint::open(dir.path), Contains("s1.safetensors") && Contains("3 bytes"));
}

namespace {

using Tokens = std::vector<std::int32_t>;
using TinyModel = LlamaModel<cpu, F32, PagedAttention<>>;

/// The header's name for a dtype File accepts (only these three).
std::string dtype_string(DType t) {
  REQUIRE((t == DType::f32 || t == DType::f16 || t == DType::bf16));
  return t == DType::f32 ? "F32" : t == DType::f16 ? "F16" : "BF16";
}

/// Writes `model_dir`'s model.safetensors into `dir` as `shards` files (its tensors in name order, dealt
/// out in runs; tensors named in `omit` left out) with the model.safetensors.index.json HF writes, and
/// copies config.json. Returns the index, for tests that break it.
nlohmann::json write_sharded(const TempDir& dir, const std::filesystem::path& model_dir, std::size_t shards,
                             const std::set<std::string>& omit = {}) {
  const auto single = File::open(model_dir / "model.safetensors");
  const auto& ts = single.tensors();
  nlohmann::json weight_map = nlohmann::json::object();
  std::uint64_t total = 0;
  for (std::size_t s = 0; s < shards; ++s) {
    const std::string file =
        "model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(shards) + ".safetensors";
    nlohmann::json header;
    header["__metadata__"] = {{"format", "pt"}};
    Bytes data;
    for (std::size_t i = s * ts.size() / shards; i < (s + 1) * ts.size() / shards; ++i) {
      const auto& t = ts[i];
      if (omit.count(t.name)) continue;
      header[t.name] = {{"dtype", dtype_string(t.dtype)}, {"shape", t.shape},
                        {"data_offsets", {data.size(), data.size() + t.data.size()}}};
      data.insert(data.end(), t.data.begin(), t.data.end());
      weight_map[t.name] = file;
    }
    total += data.size();
    dir.write(file, make_file(header.dump(), data));
  }
  const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  dir.write("model.safetensors.index.json", index.dump(2));
  std::filesystem::copy_file(model_dir / "config.json", dir.path / "config.json");
  return index;
}

/// Every logits row of a greedy run: the prompt's last position, then one per generated token.
struct GreedyRun {
  std::vector<float> logits;  ///< steps x vocab
  Tokens tokens;
};

GreedyRun greedy(TinyModel& model, const Tokens& prompt, std::size_t n) {
  const auto& c = model.config();
  KvCache<cpu> cache(static_cast<std::int32_t>(c.num_layers), 8, 16, static_cast<std::int32_t>(c.num_kv_heads),
                     static_cast<std::int32_t>(c.head_dim));
  cache.poison();
  const Tokens table = {3, 0, 7, 1, 5};  // 80 positions, scrambled
  REQUIRE(prompt.size() + n <= 80);
  GreedyRun run;
  std::vector<float> logits;
  const ForwardChunk prefill{prompt, 0, table, true};
  model.forward(std::span(&prefill, 1), cache, logits);
  for (std::size_t i = 0;; ++i) {
    run.logits.insert(run.logits.end(), logits.begin(), logits.end());
    run.tokens.push_back(static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    if (run.tokens.size() == n) return run;
    const Tokens one = {run.tokens.back()};
    const ForwardChunk step{one, static_cast<std::int32_t>(prompt.size() + i), table, true};
    model.forward(std::span(&step, 1), cache, logits);
  }
}

}  // namespace

TEST_CASE("safetensors: tiny_llama split into 3 shards loads as the same model", "[io][safetensors][model]") {
  TempDir dir;
  const auto index = write_sharded(dir, test::fixture("tiny_llama"), 3);
  std::set<std::string> files;
  for (const auto& [tensor, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
  REQUIRE(files.size() == 3);

  const ModelSource single = ModelSource::open(test::fixture("tiny_llama"));
  const ModelSource sharded = ModelSource::open(dir.path);
  CHECK(sharded.config() == single.config());
  CHECK(sharded.file_name("blk.1.ffn_down") == "model.layers.1.mlp.down_proj.weight");
  TinyModel from_single = TinyModel::load(single);
  TinyModel from_shards = TinyModel::load(sharded);

  std::ifstream in(test::fixture("tiny_llama/reference.json"));
  REQUIRE(in);
  const auto ref = nlohmann::json::parse(in);
  REQUIRE(ref["cases"].size() == 3);
  for (const auto& c : ref["cases"]) {
    const auto prompt = c["prompt_ids"].get<Tokens>();
    const auto hf_tokens = c["greedy_ids"].get<Tokens>();
    const auto hf_logits = c["first_logits"].get<std::vector<float>>();
    INFO("prompt of " << prompt.size() << " tokens");
    const GreedyRun a = greedy(from_single, prompt, hf_tokens.size());
    const GreedyRun b = greedy(from_shards, prompt, hf_tokens.size());
    // The same bytes in other files: every logit of every step identical, not merely close.
    CHECK(b.logits == a.logits);
    CHECK(b.tokens == a.tokens);
    // And HF's greedy tokens exactly, its first-step logits to f32 rounding (as test_engine_reference).
    CHECK(b.tokens == hf_tokens);
    REQUIRE(hf_logits.size() <= b.logits.size());
    double max_err = 0, max_ref = 0;
    for (std::size_t v = 0; v < hf_logits.size(); ++v) {
      max_err = std::max(max_err, std::abs(double(b.logits[v]) - hf_logits[v]));
      max_ref = std::max(max_ref, std::abs(double(hf_logits[v])));
    }
    CHECK(max_err <= 1e-4 * std::max(1.0, max_ref));
  }
}

TEST_CASE("safetensors: a model folder whose index and shards disagree is refused, naming file and tensor",
          "[io][safetensors][model]") {
  const std::string down = "model.layers.1.mlp.down_proj.weight";
  SECTION("a shard the index lists is missing") {
    TempDir dir;
    write_sharded(dir, test::fixture("tiny_llama"), 3);
    std::filesystem::remove(dir.path / "model-00002-of-00003.safetensors");
    CHECK_THROWS_AS(ModelSource::open(dir.path), IoError);
    CHECK_THROWS_WITH(ModelSource::open(dir.path), Contains("model.safetensors.index.json") &&
                                                       Contains("model-00002-of-00003.safetensors"));
  }
  SECTION("the index maps a tensor to a shard that does not hold it") {
    TempDir dir;
    auto index = write_sharded(dir, test::fixture("tiny_llama"), 3);
    const std::string holder = index["weight_map"][down].get<std::string>();
    const std::string other = holder == "model-00001-of-00003.safetensors" ? "model-00003-of-00003.safetensors"
                                                                            : "model-00001-of-00003.safetensors";
    index["weight_map"][down] = other;
    dir.write("model.safetensors.index.json", index.dump());
    CHECK_THROWS_AS(ModelSource::open(dir.path), FormatError);
    CHECK_THROWS_WITH(ModelSource::open(dir.path),
                      Contains("'" + down + "'") && Contains(other) && Contains("does not contain it"));
  }
  SECTION("the index names a tensor that no shard holds") {
    TempDir dir;
    write_sharded(dir, test::fixture("tiny_llama"), 2, {down});
    auto index = nlohmann::json::parse(std::ifstream(dir.path / "model.safetensors.index.json"));
    index["weight_map"][down] = "model-00002-of-00002.safetensors";
    dir.write("model.safetensors.index.json", index.dump());
    CHECK_THROWS_AS(ModelSource::open(dir.path), FormatError);
    CHECK_THROWS_WITH(ModelSource::open(dir.path), Contains("'" + down + "'") &&
                                                       Contains("model-00002-of-00002.safetensors"));
  }
  SECTION("a weight the model needs is in neither the index nor a shard") {
    TempDir dir;
    write_sharded(dir, test::fixture("tiny_llama"), 2, {down});
    const ModelSource source = ModelSource::open(dir.path);  // a consistent checkpoint, one tensor short
    CHECK_THROWS_AS(TinyModel::load(source), NotFoundError);
    CHECK_THROWS_WITH(TinyModel::load(source), Contains(down));
  }
}
