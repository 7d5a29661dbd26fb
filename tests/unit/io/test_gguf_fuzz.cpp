// Randomized corruption of valid GGUF files: every outcome must be a parsed File or an infer::Error.
// Anything else (another exception, a crash, an out-of-bounds read under ASan, a hang) fails.
// Seeded and bounded (about 20k cases) so a run takes a few seconds even with sanitizers.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "infer/io/gguf.hpp"
#include "support/gguf_writer.hpp"

using namespace infer;
using gguf::Value;
using gguf::ValueType;
using test::arr;
using test::GgufLayout;
using test::GgufWriter;
using test::str;

namespace {

struct Outcome {
  int parsed = 0;
  int errors = 0;
};

/// Parses and, when that succeeds, touches everything a user would: metadata display, getters,
/// every tensor's data through dequantize.
void exercise(const std::vector<std::byte>& bytes, Outcome& out) {
  try {
    const auto f = gguf::File::from_bytes(bytes);
    std::size_t sink = 0;
    for (const auto& [key, v] : f.metadata()) {
      sink += v.to_display(4).size();
      sink += v.as_int().has_value() + v.as_float().has_value() + (v.as_string() != nullptr);
      sink += f.at(key).type() == v.type();
    }
    for (const auto& t : f.tensors()) {
      const auto v = f.dequantize(t);
      sink += v.size();
      REQUIRE(t.data.size() == t.bytes);
    }
    (void)sink;
    ++out.parsed;
  } catch (const Error&) {
    ++out.errors;
  }
}

std::vector<std::byte> q_block(std::size_t bytes, std::uint8_t seed) {
  std::vector<std::byte> b(bytes);
  for (std::size_t i = 0; i < bytes; ++i) b[i] = static_cast<std::byte>((i * 37 + seed) & 0xff);
  return b;
}

/// A few valid files covering every value type, nesting, tensors of every supported type, v2 and v3.
std::vector<std::pair<std::vector<std::byte>, GgufLayout>> corpus() {
  std::vector<std::pair<std::vector<std::byte>, GgufLayout>> out;
  {
    GgufWriter w(3);
    w.add("general.architecture", str("llama"))
        .add("a.u8", Value{std::uint8_t{1}})
        .add("a.i16", Value{std::int16_t{-2}})
        .add("a.bool", Value{true})
        .add("a.f64", Value{2.5})
        .add("a.strs", arr(ValueType::string, {str("x"), str("yy"), str("")}))
        .add("a.nested", arr(ValueType::array, {arr(ValueType::i32, {Value{std::int32_t{5}}}), arr(ValueType::u8, {})}))
        .add("a.u64", Value{std::uint64_t{7}});
    w.tensor_f32("f", {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
    w.tensor("q8", 8, {32, 2}, q_block(68, 1));
    w.tensor("q4k", 12, {256}, q_block(144, 2));
    w.tensor("q6k", 14, {256}, q_block(210, 3));
    w.tensor("h", 1, {3}, q_block(6, 4));
    GgufLayout l;
    auto b = w.build(&l);
    out.emplace_back(std::move(b), std::move(l));
  }
  {
    GgufWriter w(2);
    w.alignment(64);
    w.add("b.name", str("two")).add("b.floats", arr(ValueType::f32, {Value{1.0f}, Value{2.0f}}));
    w.tensor("q41", 3, {64}, q_block(40, 5));
    w.tensor("q5k", 13, {256}, q_block(176, 6));
    w.tensor("bf", 30, {2, 2}, q_block(8, 7));
    GgufLayout l;
    auto b = w.build(&l);
    out.emplace_back(std::move(b), std::move(l));
  }
  {
    GgufWriter w(3);
    w.add("c.deep", arr(ValueType::array, {arr(ValueType::array, {arr(ValueType::string, {str("deep")})})}));
    w.tensor("q40", 2, {32}, q_block(18, 8));
    w.tensor("q50", 6, {32}, q_block(22, 9));
    w.tensor("q51", 7, {32}, q_block(24, 10));
    w.tensor("iq4nl", 20, {32}, q_block(18, 11));
    w.tensor("iq4xs", 23, {256}, q_block(136, 12));
    GgufLayout l;
    auto b = w.build(&l);
    out.emplace_back(std::move(b), std::move(l));
  }
  return out;
}

/// Offsets of every count, length, dimension, type and offset field of a file.
std::vector<std::size_t> fields(const GgufLayout& l, std::vector<std::size_t>& u32_fields) {
  std::vector<std::size_t> u64 = {GgufLayout::tensor_count_at, GgufLayout::kv_count_at};
  u32_fields = {GgufLayout::version_at};
  for (const auto& k : l.kvs) {
    u64.push_back(k.key_len_at);
    u32_fields.push_back(k.type_at);
    u64.push_back(k.value_at);      // a string length, or an array's (type, count) start
    u64.push_back(k.value_at + 4);  // an array's count
    u32_fields.push_back(k.value_at);
  }
  for (const auto& t : l.tensors) {
    u64.push_back(t.name_len_at);
    u32_fields.push_back(t.n_dims_at);
    u64.push_back(t.dims_at);
    u32_fields.push_back(t.type_at);
    u64.push_back(t.offset_at);
  }
  return u64;
}

}  // namespace

TEST_CASE("the corpus itself parses", "[io][gguf][fuzz]") {
  for (const auto& [bytes, layout] : corpus()) {
    CHECK_NOTHROW(gguf::File::from_bytes(bytes));
    Outcome o;
    exercise(bytes, o);
    CHECK(o.parsed == 1);
  }
}

TEST_CASE("truncation at every length", "[io][gguf][fuzz]") {
  Outcome o;
  for (const auto& [bytes, layout] : corpus()) {
    for (std::size_t n = 0; n < bytes.size(); ++n) {
      const std::vector<std::byte> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
      exercise(cut, o);
    }
  }
  // Cutting into metadata or tensor infos must fail; only trailing padding may go.
  CHECK(o.errors > 1000);
  CHECK(o.parsed + o.errors > 1500);
}

TEST_CASE("random byte flips", "[io][gguf][fuzz]") {
  std::mt19937_64 rng(20240601);
  const auto files = corpus();
  Outcome o;
  for (int i = 0; i < 12000; ++i) {
    const auto& src = files[static_cast<std::size_t>(i) % files.size()].first;
    auto b = src;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      const std::size_t at = rng() % b.size();
      if (rng() % 2) b[at] ^= static_cast<std::byte>(1u << (rng() % 8));
      else b[at] = static_cast<std::byte>(rng() & 0xff);
    }
    exercise(b, o);
  }
  CHECK(o.parsed + o.errors == 12000);
  CHECK(o.errors > 0);
  CHECK(o.parsed > 0);  // flips inside tensor data still parse
}

TEST_CASE("counts, lengths and offsets overwritten with huge or edge values", "[io][gguf][fuzz]") {
  const std::uint64_t values64[] = {0,
                                    1,
                                    2,
                                    31,
                                    32,
                                    255,
                                    0xffffffffull,
                                    0x100000000ull,
                                    std::uint64_t{1} << 40,
                                    (std::uint64_t{1} << 62) + 1,
                                    std::uint64_t{1} << 63,
                                    ~std::uint64_t{0} - 31,
                                    ~std::uint64_t{0}};
  const std::uint32_t values32[] = {0, 1, 4, 5, 6, 7, 8, 9, 12, 13, 14, 15, 20, 23, 30, 31, 0x7fffffffu, 0xffffffffu};
  Outcome o;
  int cases = 0;
  for (const auto& [bytes, layout] : corpus()) {
    std::vector<std::size_t> u32_at;
    const auto u64_at = fields(layout, u32_at);
    for (std::size_t at : u64_at) {
      if (at + 8 > bytes.size()) continue;
      for (std::uint64_t v : values64) {
        auto b = bytes;
        GgufWriter::put(b, at, v);
        exercise(b, o);
        ++cases;
      }
    }
    for (std::size_t at : u32_at) {
      if (at + 4 > bytes.size()) continue;
      for (std::uint32_t v : values32) {
        auto b = bytes;
        GgufWriter::put(b, at, v);
        exercise(b, o);
        ++cases;
      }
    }
  }
  CHECK(o.parsed + o.errors == cases);
  CHECK(o.errors > cases / 2);
}

TEST_CASE("random 8-byte overwrites anywhere", "[io][gguf][fuzz]") {
  std::mt19937_64 rng(7);
  const auto files = corpus();
  Outcome o;
  for (int i = 0; i < 4000; ++i) {
    auto b = files[static_cast<std::size_t>(i) % files.size()].first;
    const std::size_t at = rng() % (b.size() - 8);
    const std::uint64_t choices[] = {rng(), rng() >> (rng() % 64), ~std::uint64_t{0}, std::uint64_t{1} << (rng() % 64)};
    GgufWriter::put(b, at, choices[rng() % 4]);
    if (rng() % 4 == 0) b.resize(rng() % b.size());  // and sometimes truncate too
    exercise(b, o);
  }
  CHECK(o.parsed + o.errors == 4000);
}
