// GGUF reader on files built by tests/support/gguf_writer.hpp: every value type, versions 2 and 3,
// alignment, typed getters, tensors, and each malformed case with its typed error and message.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
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

constexpr std::uint64_t kBigU64 = (std::uint64_t{1} << 63) + 5;

GgufWriter every_type(std::uint32_t version = 3) {
  GgufWriter w(version);
  w.add("general.architecture", str("llama"))
      .add("t.u8", Value{std::uint8_t{200}})
      .add("t.i8", Value{std::int8_t{-100}})
      .add("t.u16", Value{std::uint16_t{60000}})
      .add("t.i16", Value{std::int16_t{-30000}})
      .add("t.u32", Value{std::uint32_t{4000000000u}})
      .add("t.i32", Value{std::int32_t{-2000000000}})
      .add("t.f32", Value{1.5f})
      .add("t.bool", Value{true})
      .add("t.false", Value{false})
      .add("t.string", str("h\xc3\xa9llo"))
      .add("t.empty_string", str(""))
      .add("t.u64", Value{kBigU64})
      .add("t.i64", Value{std::int64_t{-(std::int64_t{1} << 62)}})
      .add("t.f64", Value{3.25})
      .add("t.ints", arr(ValueType::i32, {Value{std::int32_t{1}}, Value{std::int32_t{-2}}, Value{std::int32_t{3}}}))
      .add("t.u16s", arr(ValueType::u16, {Value{std::uint16_t{7}}, Value{std::uint16_t{65535}}}))
      .add("t.floats", arr(ValueType::f32, {Value{0.5f}, Value{-2.0f}}))
      .add("t.strings", arr(ValueType::string, {str("a"), str(""), str("ccc")}))
      .add("t.nested", arr(ValueType::array, {arr(ValueType::u8, {Value{std::uint8_t{1}}, Value{std::uint8_t{2}}}),
                                              arr(ValueType::string, {str("x")}), arr(ValueType::u8, {})}))
      .add("t.empty", arr(ValueType::f64, {}))
      .add("t.big_u64s", arr(ValueType::u64, {Value{std::uint64_t{1}}, Value{kBigU64}}));
  return w;
}

/// A small valid file with tensors; corrupted by the malformed-input tests.
std::vector<std::byte> with_tensors(GgufLayout* layout, std::uint32_t version = 3) {
  GgufWriter w(version);
  w.add("general.architecture", str("llama")).add("general.name", str("tiny"));
  w.tensor_f32("a", {3, 2}, {1, 2, 3, 4, 5, 6});
  std::vector<std::byte> q8(2 * 34, std::byte{0});
  q8[0] = std::byte{0x00};
  q8[1] = std::byte{0x3c};  // d = 1
  for (int i = 0; i < 32; ++i) q8[2 + i] = static_cast<std::byte>(i);
  w.tensor("b.q8", 8, {64}, q8);
  w.tensor_f32("c", {1}, {42});
  return w.build(layout);
}

template <class T>
void put(std::vector<std::byte>& b, std::size_t at, T v) {
  GgufWriter::put(b, at, v);
}

}  // namespace

TEST_CASE("parses every metadata value type, in file order", "[io][gguf]") {
  const auto f = gguf::File::from_bytes(every_type().build());
  CHECK(f.version() == 3);
  CHECK(f.alignment() == 32);
  CHECK(f.tensors().empty());
  REQUIRE(f.metadata().size() == 22);
  CHECK(f.metadata()[0].first == "general.architecture");
  CHECK(f.metadata()[1].first == "t.u8");
  CHECK(f.metadata()[21].first == "t.big_u64s");
  CHECK(f.architecture() == "llama");

  CHECK(f.at("t.u8").type() == ValueType::u8);
  CHECK(std::get<std::uint8_t>(f.at("t.u8").v) == 200);
  CHECK(f.at("t.i8").type() == ValueType::i8);
  CHECK(f.at("t.i8").as_int() == -100);
  CHECK(f.at("t.u16").as_int() == 60000);
  CHECK(f.at("t.i16").as_int() == -30000);
  CHECK(f.at("t.u32").type() == ValueType::u32);
  CHECK(f.at("t.u32").as_int() == 4000000000);
  CHECK(f.at("t.i32").as_int() == -2000000000);
  CHECK(f.at("t.f32").type() == ValueType::f32);
  CHECK(f.at("t.f32").as_float() == 1.5);
  CHECK(f.at("t.f32").as_int() == std::nullopt);
  CHECK(f.at("t.bool").type() == ValueType::boolean);
  CHECK(std::get<bool>(f.at("t.bool").v));
  CHECK_FALSE(std::get<bool>(f.at("t.false").v));
  CHECK(f.at("t.bool").as_int() == std::nullopt);
  REQUIRE(f.at("t.string").as_string());
  CHECK(*f.at("t.string").as_string() == "h\xc3\xa9llo");
  CHECK(*f.at("t.empty_string").as_string() == "");
  CHECK(f.at("t.u64").type() == ValueType::u64);
  CHECK(std::get<std::uint64_t>(f.at("t.u64").v) == kBigU64);
  CHECK(f.at("t.u64").as_int() == std::nullopt);  // above INT64_MAX
  CHECK(f.at("t.u64").as_float() == static_cast<double>(kBigU64));
  CHECK(f.at("t.i64").as_int() == -(std::int64_t{1} << 62));
  CHECK(f.at("t.f64").type() == ValueType::f64);
  CHECK(f.at("t.f64").as_float() == 3.25);
  CHECK(f.at("t.f64").as_string() == nullptr);
  CHECK(f.at("t.f64").as_array() == nullptr);

  const gguf::Array* nested = f.at("t.nested").as_array();
  REQUIRE(nested);
  CHECK(f.at("t.nested").type() == ValueType::array);
  CHECK(nested->elem_type == ValueType::array);
  REQUIRE(nested->items.size() == 3);
  REQUIRE(nested->items[0].as_array());
  CHECK(nested->items[0].as_array()->elem_type == ValueType::u8);
  CHECK(nested->items[0].as_array()->items.size() == 2);
  CHECK(nested->items[0].as_array()->items[1].as_int() == 2);
  CHECK(*nested->items[1].as_array()->items[0].as_string() == "x");
  CHECK(nested->items[2].as_array()->items.empty());
  CHECK(f.at("t.empty").as_array()->elem_type == ValueType::f64);
  CHECK(f.at("t.empty").as_array()->items.empty());

  CHECK(f.find("missing") == nullptr);
  CHECK_THROWS_AS(f.at("missing.key"), NotFoundError);
  CHECK_THROWS_WITH(f.at("missing.key"), Catch::Contains("'missing.key'") && Catch::Contains("not found"));
}

TEST_CASE("version 2 files parse like version 3", "[io][gguf]") {
  const auto f = gguf::File::from_bytes(every_type(2).build());
  CHECK(f.version() == 2);
  CHECK(f.metadata().size() == 22);
  CHECK(f.get<std::int32_t>("t.i32") == -2000000000);
  GgufLayout l;
  const auto t = gguf::File::from_bytes(with_tensors(&l, 2));
  CHECK(t.version() == 2);
  CHECK(t.tensors().size() == 3);
}

TEST_CASE("to_display is short and readable", "[io][gguf]") {
  const auto f = gguf::File::from_bytes(every_type().build());
  CHECK(f.at("t.u8").to_display() == "200");
  CHECK(f.at("t.i8").to_display() == "-100");
  CHECK(f.at("t.bool").to_display() == "true");
  CHECK(f.at("t.f32").to_display() == "1.5");
  CHECK(f.at("t.string").to_display() == "\"h\xc3\xa9llo\"");
  CHECK(f.at("t.ints").to_display() == "[1, -2, 3]");
  CHECK(f.at("t.ints").to_display(2) == "[1, -2, ... (3 items)]");
  CHECK(f.at("t.ints").to_display(0) == "[... (3 items)]");
  CHECK(f.at("t.nested").to_display() == "[[1, 2], [\"x\"], []]");
  CHECK(f.at("t.empty").to_display() == "[]");
  const Value long_string = str(std::string(100, 'z'));
  CHECK(long_string.to_display() == "\"" + std::string(60, 'z') + "...\"");
}

TEST_CASE("typed getters convert with range checks", "[io][gguf]") {
  const auto f = gguf::File::from_bytes(every_type().build());
  CHECK(f.get<std::uint8_t>("t.u8") == 200);
  CHECK(f.get<int>("t.u8") == 200);
  CHECK(f.get<std::uint32_t>("t.u32") == 4000000000u);
  CHECK(f.get<std::int64_t>("t.u32") == 4000000000);
  CHECK(f.get<std::uint64_t>("t.u64") == kBigU64);
  CHECK(f.get<std::int16_t>("t.i16") == -30000);
  CHECK(f.get<float>("t.f32") == 1.5f);
  CHECK(f.get<double>("t.f32") == 1.5);
  CHECK(f.get<float>("t.i32") == -2000000000.0f);  // any numeric
  CHECK(f.get<double>("t.f64") == 3.25);
  CHECK(f.get<bool>("t.bool"));
  CHECK(f.get<std::string>("t.string") == "h\xc3\xa9llo");
  CHECK(f.get_optional<int>("absent") == std::nullopt);
  CHECK(f.get_optional<int>("t.i32") == -2000000000);

  CHECK_THROWS_AS(f.get<std::uint8_t>("t.u16"), FormatError);
  CHECK_THROWS_WITH(f.get<std::uint8_t>("t.u16"),
                    Catch::Contains("'t.u16'") && Catch::Contains("60000") && Catch::Contains("out of range for u8"));
  CHECK_THROWS_WITH(f.get<std::uint32_t>("t.i8"), Catch::Contains("-100") && Catch::Contains("out of range for u32"));
  CHECK_THROWS_WITH(f.get<std::int64_t>("t.u64"), Catch::Contains("out of range for i64"));
  CHECK_THROWS_WITH(f.get<std::int16_t>("t.u32"), Catch::Contains("out of range for i16"));
  CHECK_THROWS_AS(f.get<int>("t.string"), FormatError);
  CHECK_THROWS_WITH(f.get<int>("t.string"),
                    Catch::Contains("'t.string'") && Catch::Contains("has type string") && Catch::Contains("expected i32"));
  CHECK_THROWS_WITH(f.get<int>("t.f32"), Catch::Contains("has type f32, expected i32"));
  CHECK_THROWS_WITH(f.get<bool>("t.u8"), Catch::Contains("has type u8, expected bool"));
  CHECK_THROWS_WITH(f.get<int>("t.bool"), Catch::Contains("has type bool, expected i32"));
  CHECK_THROWS_WITH(f.get<std::string>("t.ints"), Catch::Contains("has type array, expected string"));
  CHECK_THROWS_WITH(f.get<double>("t.string"), Catch::Contains("expected f64"));
  CHECK_THROWS_AS(f.get_optional<int>("t.string"), FormatError);  // present but wrong type
  CHECK_THROWS_AS(f.get<int>("absent.key"), NotFoundError);
  CHECK_THROWS_WITH(f.get<int>("absent.key"), Catch::Contains("'absent.key'"));
}

TEST_CASE("array getters", "[io][gguf]") {
  const auto f = gguf::File::from_bytes(every_type().build());
  CHECK(f.get_strings("t.strings") == std::vector<std::string>{"a", "", "ccc"});
  CHECK(f.get_ints("t.ints") == std::vector<std::int64_t>{1, -2, 3});
  CHECK(f.get_ints("t.u16s") == std::vector<std::int64_t>{7, 65535});
  CHECK(f.get_floats("t.floats") == std::vector<double>{0.5, -2.0});
  CHECK(f.get_floats("t.ints") == std::vector<double>{1, -2, 3});
  CHECK(f.get_floats("t.empty").empty());

  CHECK_THROWS_AS(f.get_strings("t.ints"), FormatError);
  CHECK_THROWS_WITH(f.get_strings("t.ints"), Catch::Contains("'t.ints'") && Catch::Contains("array of i32") &&
                                                 Catch::Contains("expected an array of string"));
  CHECK_THROWS_WITH(f.get_ints("t.floats"), Catch::Contains("array of f32"));
  CHECK_THROWS_WITH(f.get_ints("t.u8"), Catch::Contains("has type u8, expected an array"));
  CHECK_THROWS_WITH(f.get_floats("t.strings"), Catch::Contains("array of string"));
  CHECK_THROWS_WITH(f.get_ints("t.big_u64s"), Catch::Contains("item 1") && Catch::Contains("does not fit in i64"));
  CHECK_THROWS_AS(f.get_strings("absent"), NotFoundError);
}

TEST_CASE("tensors: shapes, offsets, data views and dequantization", "[io][gguf]") {
  GgufLayout l;
  const auto bytes = with_tensors(&l);
  const auto f = gguf::File::from_bytes(bytes);
  REQUIRE(f.tensors().size() == 3);
  CHECK(f.data_offset() == l.data_at);
  CHECK(f.data_offset() % 32 == 0);

  const auto& a = f.tensor("a");
  CHECK(a.type == DType::f32);
  CHECK(a.shape == std::vector<std::uint64_t>{3, 2});
  CHECK(a.elements() == 6);
  CHECK(a.bytes == 24);
  CHECK(a.offset == 0);
  CHECK(a.data.size() == 24);
  CHECK(f.dequantize(a) == std::vector<float>{1, 2, 3, 4, 5, 6});

  const auto& b = f.tensor("b.q8");
  CHECK(b.type == DType::q8_0);
  CHECK(b.shape == std::vector<std::uint64_t>{64});
  CHECK(b.bytes == 68);
  CHECK(b.offset == 32);  // after 24 bytes of "a", aligned to 32
  const auto bv = f.dequantize(b);
  REQUIRE(bv.size() == 64);
  CHECK(bv[0] == 0.0f);
  CHECK(bv[31] == 31.0f);
  CHECK(bv[32] == 0.0f);  // second block has d = 0

  const auto& c = f.tensor("c");
  CHECK(c.offset == 128);  // 32 + 68 -> 128
  CHECK(f.dequantize(c) == std::vector<float>{42});
  CHECK(&f.tensors()[2] == &c);

  CHECK(f.find_tensor("nope") == nullptr);
  CHECK_THROWS_AS(f.tensor("nope"), NotFoundError);
  CHECK_THROWS_WITH(f.tensor("nope"), Catch::Contains("'nope'") && Catch::Contains("3 tensors"));
}

TEST_CASE("data views survive moving the File", "[io][gguf]") {
  auto f = gguf::File::from_bytes(with_tensors(nullptr));
  const auto* p = f.tensor("a").data.data();
  gguf::File g = std::move(f);
  CHECK(g.tensor("a").data.data() == p);
  CHECK(g.dequantize(g.tensor("a"))[5] == 6.0f);
}

TEST_CASE("custom alignment pads the data section and offsets", "[io][gguf]") {
  for (std::uint32_t align : {1u, 8u, 64u, 256u}) {
    INFO("alignment " << align);
    GgufWriter w;
    w.alignment(align);
    w.tensor_f32("x", {3}, {1, 2, 3}).tensor_f32("y", {1}, {4});
    GgufLayout l;
    const auto f = gguf::File::from_bytes(w.build(&l));
    CHECK(f.alignment() == align);
    CHECK(f.data_offset() == l.data_at);
    CHECK(f.data_offset() % align == 0);
    CHECK(f.tensor("y").offset == (12 + align - 1) / align * align);
    CHECK(f.dequantize(f.tensor("y")) == std::vector<float>{4});
  }
}

TEST_CASE("bad alignment values are rejected", "[io][gguf]") {
  auto build = [](Value v) {
    GgufWriter w;
    w.add("general.alignment", std::move(v));
    return w.build();
  };
  CHECK_THROWS_AS(gguf::File::from_bytes(build(Value{std::uint32_t{48}})), FormatError);
  CHECK_THROWS_WITH(gguf::File::from_bytes(build(Value{std::uint32_t{48}})),
                    Catch::Contains("general.alignment") && Catch::Contains("48") && Catch::Contains("power of two"));
  CHECK_THROWS_WITH(gguf::File::from_bytes(build(Value{std::uint32_t{0}})), Catch::Contains("power of two"));
  CHECK_THROWS_WITH(gguf::File::from_bytes(build(Value{std::int32_t{-32}})), Catch::Contains("power of two"));
  CHECK_THROWS_WITH(gguf::File::from_bytes(build(str("32"))),
                    Catch::Contains("general.alignment") && Catch::Contains("has type string"));
  CHECK(gguf::File::from_bytes(build(Value{std::uint64_t{16}})).alignment() == 16);
}

TEST_CASE("header errors: empty, bad magic, versions", "[io][gguf]") {
  CHECK_THROWS_AS(gguf::File::from_bytes({}), FormatError);
  CHECK_THROWS_WITH(gguf::File::from_bytes({}), Catch::Contains("truncated at offset 0") && Catch::Contains("magic"));

  auto b = every_type().build();
  auto bad = b;
  bad[0] = std::byte{'G'};
  bad[1] = std::byte{'G'};
  bad[2] = std::byte{'M'};
  bad[3] = std::byte{'L'};
  CHECK_THROWS_AS(gguf::File::from_bytes(bad), FormatError);
  CHECK_THROWS_WITH(gguf::File::from_bytes(bad), Catch::Contains("bad magic") && Catch::Contains("47 47 4d 4c"));

  auto v1 = b;
  put<std::uint32_t>(v1, GgufLayout::version_at, 1);
  CHECK_THROWS_AS(gguf::File::from_bytes(v1), UnsupportedError);
  CHECK_THROWS_WITH(gguf::File::from_bytes(v1), Catch::Contains("version 1") && Catch::Contains("2 and 3"));

  auto be = b;
  put<std::uint32_t>(be, GgufLayout::version_at, 0x03000000u);
  CHECK_THROWS_AS(gguf::File::from_bytes(be), UnsupportedError);
  CHECK_THROWS_WITH(gguf::File::from_bytes(be), Catch::Contains("big-endian") && Catch::Contains("version 3"));

  auto v4 = b;
  put<std::uint32_t>(v4, GgufLayout::version_at, 4);
  CHECK_THROWS_AS(gguf::File::from_bytes(v4), UnsupportedError);
  CHECK_THROWS_WITH(gguf::File::from_bytes(v4), Catch::Contains("version 4"));

  auto shortv = std::vector<std::byte>(b.begin(), b.begin() + 6);
  CHECK_THROWS_WITH(gguf::File::from_bytes(shortv),
                    Catch::Contains("truncated at offset 4") && Catch::Contains("version"));
}

TEST_CASE("absurd counts are rejected before allocating", "[io][gguf]") {
  const auto b = with_tensors(nullptr);
  auto kv = b;
  put<std::uint64_t>(kv, GgufLayout::kv_count_at, std::uint64_t{1} << 60);
  CHECK_THROWS_AS(gguf::File::from_bytes(kv), FormatError);
  CHECK_THROWS_WITH(gguf::File::from_bytes(kv), Catch::Contains("metadata count 1152921504606846976") &&
                                                    Catch::Contains("cannot fit"));
  auto tc = b;
  put<std::uint64_t>(tc, GgufLayout::tensor_count_at, ~std::uint64_t{0});
  CHECK_THROWS_WITH(gguf::File::from_bytes(tc), Catch::Contains("tensor count 18446744073709551615") &&
                                                    Catch::Contains("cannot fit"));

  GgufLayout l;
  const auto e = every_type().build(&l);
  auto ac = e;
  put<std::uint64_t>(ac, l.kv("t.ints").value_at + 4, std::uint64_t{1} << 40);  // array length
  CHECK_THROWS_AS(gguf::File::from_bytes(ac), FormatError);
  CHECK_THROWS_WITH(gguf::File::from_bytes(ac), Catch::Contains("t.ints") && Catch::Contains("claims 1099511627776 items") &&
                                                    Catch::Contains("i32"));
}

TEST_CASE("strings and values past the end", "[io][gguf]") {
  GgufLayout l;
  const auto e = every_type().build(&l);
  auto sl = e;
  put<std::uint64_t>(sl, l.kv("t.string").value_at, std::uint64_t{1} << 50);
  CHECK_THROWS_AS(gguf::File::from_bytes(sl), FormatError);
  CHECK_THROWS_WITH(gguf::File::from_bytes(sl), Catch::Contains("t.string") && Catch::Contains("claims 1125899906842624 bytes") &&
                                                    Catch::Contains(std::to_string(l.kv("t.string").value_at)));
  auto kl = e;
  put<std::uint64_t>(kl, l.kv("t.u8").key_len_at, 1000000);
  CHECK_THROWS_WITH(gguf::File::from_bytes(kl), Catch::Contains("metadata key") && Catch::Contains("metadata entry 1 of 22") &&
                                                    Catch::Contains("claims 1000000 bytes"));
  // Truncated in the middle of the u32 value of t.u32.
  GgufWriter small;
  small.add("t.u32", Value{5u});
  GgufLayout sl2;
  const auto s = small.build(&sl2);
  const std::size_t cut = sl2.kv("t.u32").value_at + 2;
  const std::vector<std::byte> tr(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(cut));
  CHECK_THROWS_AS(gguf::File::from_bytes(tr), FormatError);
  CHECK_THROWS_WITH(gguf::File::from_bytes(tr), Catch::Contains("truncated at offset " + std::to_string(cut - 2)) &&
                                                    Catch::Contains("u32 value") && Catch::Contains("'t.u32'") &&
                                                    Catch::Contains("need 4 bytes, 2 left"));
}

TEST_CASE("bad value types, bools and nesting", "[io][gguf]") {
  GgufLayout l;
  const auto e = every_type().build(&l);
  auto vt = e;
  put<std::uint32_t>(vt, l.kv("t.u8").type_at, 13);
  CHECK_THROWS_AS(gguf::File::from_bytes(vt), FormatError);
  CHECK_THROWS_WITH(gguf::File::from_bytes(vt), Catch::Contains("unknown value type 13") && Catch::Contains("'t.u8'"));
  auto et = e;
  put<std::uint32_t>(et, l.kv("t.ints").value_at, 99);  // array element type
  CHECK_THROWS_WITH(gguf::File::from_bytes(et), Catch::Contains("unknown element type 99") && Catch::Contains("'t.ints'"));
  auto bo = e;
  put<std::uint8_t>(bo, l.kv("t.bool").value_at, 2);
  CHECK_THROWS_WITH(gguf::File::from_bytes(bo), Catch::Contains("must be 0 or 1") && Catch::Contains("'t.bool'"));

  auto nest = [](int depth) {
    Value v = arr(ValueType::u8, {Value{std::uint8_t{1}}});
    for (int d = 1; d < depth; ++d) v = arr(ValueType::array, {v});
    GgufWriter w;
    w.add("deep", v);
    return w.build();
  };
  const auto ok = gguf::File::from_bytes(nest(8));
  CHECK(ok.at("deep").to_display() == "[[[[[[[[1]]]]]]]]");
  CHECK_THROWS_AS(gguf::File::from_bytes(nest(9)), FormatError);
  CHECK_THROWS_WITH(gguf::File::from_bytes(nest(9)), Catch::Contains("nested deeper than 8") && Catch::Contains("'deep'"));
}

TEST_CASE("duplicate keys and tensor names", "[io][gguf]") {
  GgufWriter w;
  w.add("a.key", Value{1u}).add("b.key", Value{2u}).add("a.key", Value{3u});
  CHECK_THROWS_AS(gguf::File::from_bytes(w.build()), FormatError);
  CHECK_THROWS_WITH(gguf::File::from_bytes(w.build()),
                    Catch::Contains("duplicate metadata key") && Catch::Contains("'a.key'") && Catch::Contains("entries 0 and 2"));
  GgufWriter t;
  t.tensor_f32("w", {1}, {1}).tensor_f32("w", {1}, {2});
  CHECK_THROWS_AS(gguf::File::from_bytes(t.build()), FormatError);
  CHECK_THROWS_WITH(gguf::File::from_bytes(t.build()), Catch::Contains("duplicate tensor name") && Catch::Contains("'w'"));
}

TEST_CASE("tensor info errors", "[io][gguf]") {
  GgufLayout l;
  const auto b = with_tensors(&l);
  const auto& tb = l.tensor("b.q8");

  auto nd = b;
  put<std::uint32_t>(nd, tb.n_dims_at, 5);
  CHECK_THROWS_AS(gguf::File::from_bytes(nd), FormatError);
  CHECK_THROWS_WITH(gguf::File::from_bytes(nd), Catch::Contains("dimension count 5") && Catch::Contains("'b.q8'"));
  auto nd0 = b;
  put<std::uint32_t>(nd0, tb.n_dims_at, 0);
  CHECK_THROWS_WITH(gguf::File::from_bytes(nd0), Catch::Contains("dimension count 0"));

  auto q3k = b;
  put<std::uint32_t>(q3k, tb.type_at, 11);
  CHECK_THROWS_AS(gguf::File::from_bytes(q3k), UnsupportedError);
  CHECK_THROWS_WITH(gguf::File::from_bytes(q3k),
                    Catch::Contains("'b.q8'") && Catch::Contains("type 11") && Catch::Contains("Q3_K") &&
                        Catch::Contains("(supported: F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, "
                                        "IQ4_NL, IQ4_XS, BF16)"));
  auto q2k = b;
  put<std::uint32_t>(q2k, tb.type_at, 10);
  CHECK_THROWS_WITH(gguf::File::from_bytes(q2k), Catch::Contains("Q2_K"));
  auto iq = b;
  put<std::uint32_t>(iq, tb.type_at, 16);
  CHECK_THROWS_WITH(gguf::File::from_bytes(iq), Catch::Contains("IQ2_XXS"));
  auto unk = b;
  put<std::uint32_t>(unk, tb.type_at, 1000);
  CHECK_THROWS_AS(gguf::File::from_bytes(unk), UnsupportedError);
  CHECK_THROWS_WITH(gguf::File::from_bytes(unk), Catch::Contains("type 1000 (unknown)"));

  auto mis = b;
  put<std::uint64_t>(mis, tb.offset_at, 40);
  CHECK_THROWS_AS(gguf::File::from_bytes(mis), FormatError);
  CHECK_THROWS_WITH(gguf::File::from_bytes(mis), Catch::Contains("'b.q8'") && Catch::Contains("offset 40") &&
                                                     Catch::Contains("not a multiple of the alignment 32"));
  auto past = b;
  put<std::uint64_t>(past, tb.offset_at, 1024);
  CHECK_THROWS_AS(gguf::File::from_bytes(past), FormatError);
  CHECK_THROWS_WITH(gguf::File::from_bytes(past), Catch::Contains("'b.q8'") && Catch::Contains("past the end") &&
                                                      Catch::Contains(std::to_string(b.size()) + " bytes"));
  auto huge = b;
  put<std::uint64_t>(huge, tb.offset_at, ~std::uint64_t{31});  // offset + data start overflows
  CHECK_THROWS_WITH(gguf::File::from_bytes(huge), Catch::Contains("past the end"));
  // The last tensor's 4 bytes of data lose one.
  const std::vector<std::byte> cut(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(l.tensor("c").data_at + 3));
  CHECK_THROWS_WITH(gguf::File::from_bytes(cut), Catch::Contains("'c'") && Catch::Contains("past the end"));

  auto blk = b;
  put<std::uint64_t>(blk, tb.dims_at, 48);  // Q8_0 rows must be whole blocks of 32
  CHECK_THROWS_AS(gguf::File::from_bytes(blk), FormatError);
  CHECK_THROWS_WITH(gguf::File::from_bytes(blk), Catch::Contains("'b.q8'") && Catch::Contains("first dimension 48") &&
                                                     Catch::Contains("block size 32"));

  GgufWriter ov;
  ov.tensor("big", 0, {std::uint64_t{1} << 32, std::uint64_t{1} << 32, 2}, {});
  CHECK_THROWS_AS(gguf::File::from_bytes(ov.build()), FormatError);
  CHECK_THROWS_WITH(gguf::File::from_bytes(ov.build()),
                    Catch::Contains("'big'") && Catch::Contains("element count") && Catch::Contains("overflows"));
  GgufWriter ob;
  ob.tensor("wide", 0, {std::uint64_t{1} << 62}, {});  // 2^62 f32 = 2^64 bytes
  CHECK_THROWS_WITH(gguf::File::from_bytes(ob.build()), Catch::Contains("'wide'") && Catch::Contains("byte size"));

  // Truncated inside a tensor info.
  const std::vector<std::byte> ti(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(tb.dims_at + 3));
  CHECK_THROWS_WITH(gguf::File::from_bytes(ti), Catch::Contains("truncated at offset " + std::to_string(tb.dims_at)) &&
                                                    Catch::Contains("tensor dimension") && Catch::Contains("'b.q8'"));
}

namespace {

/// Every ggml type the reader takes: its id (gguf-py's GGMLQuantizationType), and the values and bytes of one
/// row of a test tensor (one block of the block types, from gguf-py's GGML_QUANT_SIZES).
struct GgmlType {
  std::uint32_t id;
  DType type;
  std::uint64_t elems, bytes;
};
constexpr GgmlType kGgmlTypes[] = {
    {0, DType::f32, 4, 16},      {1, DType::f16, 4, 8},       {30, DType::bf16, 4, 8},     {8, DType::q8_0, 32, 34},
    {2, DType::q4_0, 32, 18},    {3, DType::q4_1, 32, 20},    {6, DType::q5_0, 32, 22},    {7, DType::q5_1, 32, 24},
    {12, DType::q4_k, 256, 144}, {13, DType::q5_k, 256, 176}, {14, DType::q6_k, 256, 210}, {20, DType::iq4_nl, 32, 18},
    {23, DType::iq4_xs, 256, 136}};

}  // namespace

TEST_CASE("zero-element tensors and tensors of every supported type", "[io][gguf]") {
  GgufWriter w;
  w.tensor("empty", 0, {0, 3}, {});
  for (const auto& t : kGgmlTypes)
    w.tensor("t" + std::to_string(t.id), t.id, {t.elems, 2}, std::vector<std::byte>(2 * t.bytes, std::byte{0}));
  const auto f = gguf::File::from_bytes(w.build());
  CHECK(f.tensor("empty").elements() == 0);
  CHECK(f.tensor("empty").bytes == 0);
  CHECK(f.dequantize(f.tensor("empty")).empty());
  for (const auto& t : kGgmlTypes) {
    const auto& ti = f.tensor("t" + std::to_string(t.id));
    CHECK(ti.type == t.type);
    CHECK(ti.bytes == 2 * t.bytes);
    CHECK(f.dequantize(ti) == std::vector<float>(2 * t.elems, 0.0f));
  }
}

TEST_CASE("block-type tensors with partial blocks or short data are refused", "[io][gguf]") {
  for (const auto& t : kGgmlTypes) {
    const DTypeInfo ti = info(t.type);
    if (ti.block_elems == 1) continue;
    INFO("type " << ti.name);
    GgufWriter partial;
    partial.tensor("w", t.id, {t.elems + t.elems / 2, 2}, std::vector<std::byte>(3 * t.bytes));
    CHECK_THROWS_AS(gguf::File::from_bytes(partial.build()), FormatError);
    CHECK_THROWS_WITH(gguf::File::from_bytes(partial.build()),
                      Catch::Contains("'w'") &&
                          Catch::Contains(detail::cat("first dimension ", t.elems + t.elems / 2, " of a ", ti.name,
                                                      " tensor is not a multiple of its block size ", t.elems)));
    // Two rows of blocks, the file cut a byte short of their end: the data runs past the end of the file.
    GgufWriter whole;
    whole.tensor("w", t.id, {t.elems, 2}, std::vector<std::byte>(2 * t.bytes));
    GgufLayout l;
    auto cut = whole.build(&l);
    REQUIRE_NOTHROW(gguf::File::from_bytes(cut));
    cut.resize(l.tensor("w").data_at + 2 * t.bytes - 1);
    CHECK_THROWS_AS(gguf::File::from_bytes(cut), FormatError);
    CHECK_THROWS_WITH(gguf::File::from_bytes(cut),
                      Catch::Contains("'w'") && Catch::Contains(detail::cat("(", 2 * t.bytes, " bytes")) &&
                          Catch::Contains("past the end"));
  }
}

TEST_CASE("File::open maps a file from disk", "[io][gguf]") {
  const auto dir = std::filesystem::temp_directory_path() / "infer_test_gguf";
  std::filesystem::create_directories(dir);
  const auto path = dir / "tiny.gguf";
  const auto bytes = with_tensors(nullptr);
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  const auto f = gguf::File::open(path);
  CHECK(f.tensors().size() == 3);
  CHECK(f.get<std::string>("general.name") == "tiny");
  CHECK(f.dequantize(f.tensor("a"))[2] == 3.0f);
  std::filesystem::remove(path);

  CHECK_THROWS_AS(gguf::File::open(dir / "missing.gguf"), IoError);
  CHECK_THROWS_WITH(gguf::File::open(dir / "missing.gguf"), Catch::Contains("missing.gguf"));
  // Errors from a real path name it.
  {
    std::ofstream out(path, std::ios::binary);
    out << "GGML";
  }
  CHECK_THROWS_WITH(gguf::File::open(path), Catch::Contains("tiny.gguf") && Catch::Contains("bad magic"));
  std::filesystem::remove(path);
}

TEST_CASE("architecture() needs a string", "[io][gguf]") {
  GgufWriter none;
  CHECK_THROWS_AS(gguf::File::from_bytes(none.build()).architecture(), NotFoundError);
  GgufWriter wrong;
  wrong.add("general.architecture", Value{1u});
  CHECK_THROWS_AS(gguf::File::from_bytes(wrong.build()).architecture(), FormatError);
}
