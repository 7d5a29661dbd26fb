// The engine file's arena visitors (io/engine_file.hpp), which the cuda backend's engine files are made of:
// a weight's pointers into one arena saved as offsets and placed back against another base, its sizes saved
// as scalars; and every offset that would reach outside the arena, a missing pointer that must be there,
// or a size outside its type refused with a FormatError naming it. Backend-free: the "arena" here is host
// memory, so CI checks what the GPU's loader relies on.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "infer/engine/engine_build.hpp"
#include "support/fixtures.hpp"

using namespace infer;

namespace {

/// A weight as a CUDA Quantizer lists it: sizes first, then its pointers with the bytes they must hold.
struct FakeWeight {
  std::int32_t out = 0;
  std::int64_t in = 0;
  const std::uint16_t* data = nullptr;
  const float* bias = nullptr;  ///< optional: none when `has_bias` is 0
  std::int64_t has_bias = 0;

  template <class Self, class V>
  static void visit_arena(Self& self, const V& v) {
    v.scalar("out", self.out);
    v.scalar("in", self.in);
    v.scalar("has_bias", self.has_bias);
    v.pointer("data", self.data, static_cast<std::size_t>(self.out) * static_cast<std::size_t>(self.in) * 2);
    v.pointer("bias", self.bias, self.has_bias ? static_cast<std::size_t>(self.out) * sizeof(float) : 0);
  }
};

std::filesystem::path temp_path(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / "infer_engine_arena_test";
  std::filesystem::create_directories(dir);
  return dir / name;
}

/// An engine file holding `arena` as its part "arena" and `weights` saved against it, with a valid header
/// (taken from a tiny model's CPU build); `change` may then edit the scalars.
template <class Change>
std::filesystem::path write_with(const std::vector<std::byte>& arena, const std::vector<FakeWeight>& weights,
                                 const std::string& name, Change&& change) {
  // Built once per process: a file kept in the temp folder across runs would outlive a format version (a
  // stale version-2 file failed every case here once version 3 came), and ctest's parallel processes would
  // race on it.
  const auto base_file = temp_path(detail::cat("base-", ::getpid(), ".engine"));
  struct Built {  // removed when the process ends
    std::filesystem::path path;
    ~Built() {
      std::error_code ec;
      std::filesystem::remove(path, ec);
    }
  };
  static const Built built = [&] {
    LlmOptions o;
    o.engine_options.kv_cache_bytes = std::size_t{4} << 20;
    build_engine_file(ModelSpec{.model = infer::test::fixture("tiny_llama")}, o, base_file);
    return Built{base_file};
  }();
  const EngineFile base = EngineFile::open(base_file);
  EngineFileWriter w;
  w.add_part("arena", "u8", std::span<const std::byte>(arena));
  for (std::size_t i = 0; i < weights.size(); ++i)
    FakeWeight::visit_arena(weights[i], EngineArenaSaver{w, arena.data(), ""}.at(detail::cat("w", i)));
  EngineFileInfo info = base.info();
  info.scalars.clear();
  const auto path = temp_path(name);
  w.write(path, info, base.tokenizer());
  if constexpr (!std::is_same_v<std::decay_t<Change>, std::nullptr_t>) {
    const EngineFile f = EngineFile::open(path);
    EngineFileInfo edited = f.info();
    change(edited.scalars);
    EngineFileWriter again;
    for (const auto& p : f.parts()) again.add_part(p.name, p.dtype, f.part(p.name, p.dtype));
    again.write(path, edited, f.tokenizer());
  }
  return path;
}

/// The weights of `path` placed against `base` (the file's own arena bytes when null).
std::vector<FakeWeight> restore(const std::filesystem::path& path, std::size_t count, const void* base = nullptr) {
  const EngineFile f = EngineFile::open(path);
  const auto arena = f.part("arena", "u8");
  std::vector<FakeWeight> out(count);
  for (std::size_t i = 0; i < count; ++i)
    FakeWeight::visit_arena(out[i], EngineArenaLoader{f, base ? base : arena.data(), arena.size(), ""}.at(
                                        detail::cat("w", i)));
  return out;
}

}  // namespace

TEST_CASE("arena visitors: pointers saved as offsets come back at the same offsets from another base",
          "[engine_file]") {
  std::vector<std::byte> arena(8192);
  for (std::size_t i = 0; i < arena.size(); ++i) arena[i] = static_cast<std::byte>(i * 7);
  const auto at = [&](std::size_t offset) { return arena.data() + offset; };
  std::vector<FakeWeight> w(2);
  w[0] = {.out = 4, .in = 16, .data = reinterpret_cast<const std::uint16_t*>(at(256)), .bias = nullptr, .has_bias = 0};
  w[1] = {.out = 8, .in = 32, .data = reinterpret_cast<const std::uint16_t*>(at(1024)),
          .bias = reinterpret_cast<const float*>(at(8192 - 32)), .has_bias = 1};
  const auto path = write_with(arena, w, "round-trip.engine", nullptr);

  std::vector<std::byte> elsewhere(arena.size());
  const auto back = restore(path, 2, elsewhere.data());
  for (std::size_t i = 0; i < 2; ++i) {
    INFO("weight " << i);
    CHECK(back[i].out == w[i].out);
    CHECK(back[i].in == w[i].in);
    CHECK(back[i].has_bias == w[i].has_bias);
    CHECK(reinterpret_cast<const std::byte*>(back[i].data) - elsewhere.data() ==
          reinterpret_cast<const std::byte*>(w[i].data) - arena.data());
  }
  CHECK(back[0].bias == nullptr);  // saved as -1: none
  CHECK(reinterpret_cast<const std::byte*>(back[1].bias) - elsewhere.data() == 8192 - 32);
  // The arena's bytes travel as they are.
  const EngineFile f = EngineFile::open(path);
  const auto bytes = f.part("arena", "u8");
  REQUIRE(bytes.size() == arena.size());
  CHECK(std::equal(bytes.begin(), bytes.end(), arena.begin()));
}

TEST_CASE("arena visitors: an offset or size that does not fit is refused, naming it", "[engine_file]") {
  std::vector<std::byte> arena(4096);
  const std::vector<FakeWeight> w{
      {.out = 4, .in = 16, .data = reinterpret_cast<const std::uint16_t*>(arena.data() + 512), .bias = nullptr, .has_bias = 0}};
  const auto refused = [&](const char* name, auto&& change) {
    const auto path = write_with(arena, w, name, change);
    try {
      (void)restore(path, 1);
    } catch (const FormatError& e) {
      return std::string(e.what());
    }
    return std::string("not refused");
  };
  // 4 x 16 bf16 = 128 bytes: the last offset that fits is 4096 - 128.
  CHECK_THAT(refused("past-end.engine", [](auto& s) { s.at("w0.data.offset") = 4096 - 127; }),
             Catch::Contains("'w0.data.offset' is 3969 for 128 bytes, outside the weight arena of 4096 bytes"));
  CHECK_THAT(refused("negative.engine", [](auto& s) { s.at("w0.data.offset") = -5; }),
             Catch::Contains("'w0.data.offset' is -5"));
  CHECK_THAT(refused("missing.engine", [](auto& s) { s.at("w0.data.offset") = -1; }),
             Catch::Contains("'w0.data.offset' is -1 for 128 bytes"));
  CHECK_THAT(refused("bias-claimed.engine", [](auto& s) { s.at("w0.has_bias") = 1; }),
             Catch::Contains("'w0.bias.offset' is -1 for 16 bytes"));
  CHECK_THAT(refused("too-wide.engine", [](auto& s) { s.at("w0.out") = std::int64_t{1} << 40; }),
             Catch::Contains("scalar 'w0.out' is 1099511627776, out of its type's range"));
  CHECK_THAT(refused("huge.engine", [](auto& s) { s.at("w0.in") = std::int64_t{1} << 60; }),
             Catch::Contains("outside the weight arena"));
  const auto fits = write_with(arena, w, "last-fit.engine", [](auto& s) { s.at("w0.data.offset") = 4096 - 128; });
  CHECK(reinterpret_cast<std::uintptr_t>(restore(fits, 1)[0].data) != 0);
}
