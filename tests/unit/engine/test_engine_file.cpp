// Engine files (infer-build): built from a model, loaded by the engine they were built for, they give the
// same tokens as the model loaded directly, for every CPU quantizer and both engine kinds; the tokenizer and
// chat template travel with them; and every file that cannot run is refused with a typed error naming
// what differs (not an engine file, another format version, a corrupted header, a truncated file, another
// library version, backend or architecture, another quantizer or engine kind, arrays of the wrong size).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "infer/engine/engine_build.hpp"
#include "infer/tokenizer/tokenizer.hpp"
#include "infer/version.hpp"
#include "support/engine_file_support.hpp"
#include "support/fixtures.hpp"

using namespace infer;
using Tokens = std::vector<std::int32_t>;

namespace {

std::filesystem::path temp_path(const std::string& name) { return test::engine_temp_path("infer_engine_file_test", name); }

LlmOptions small_options(const std::string& engine, const std::string& quantizer) {
  LlmOptions o;
  o.engine = engine;
  o.quantizer = quantizer;
  o.engine_options.kv_cache_bytes = std::size_t{4} << 20;
  o.engine_options.max_model_len = 128;
  o.engine_options.static_shape = Shape{.max_batch = 4, .max_input = 40, .max_output = 24};
  return o;
}

std::vector<Tokens> greedy(EngineHandle& engine, const std::vector<Tokens>& prompts, std::int32_t max_tokens) {
  return test::engine_greedy(engine, prompts, max_tokens);
}

std::vector<std::byte> read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  std::memcpy(b.data(), c.data(), c.size());
  return b;
}

void write_bytes(const std::filesystem::path& p, std::span<const std::byte> b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

/// The message of the exception `f` throws as E; fails the test when it throws nothing or something else.
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  FAIL("expected an exception");
  return {};
}

const ModelSpec kTiny{.model = infer::test::fixture("tiny_llama")};

}  // namespace

TEST_CASE("an engine file gives the tokens of the model it was built from, for every CPU quantizer and both engines",
          "[engine][engine_file]") {
  const std::vector<Tokens> prompts = {{1, 17, 42, 99, 3}, {1, 200, 5}, {1, 7, 7, 7, 7, 7, 7, 7, 7, 7, 120, 33}};
  for (const std::string engine : {"paged", "static"})
    for (const std::string quantizer : {"auto", "int8", "fp8", "int4"}) {
      DYNAMIC_SECTION(engine << " engine, quantizer " << quantizer) {
        const LlmOptions o = small_options(engine, quantizer);
        const auto path = temp_path(engine + "-" + quantizer + ".engine");
        const EngineBuildReport r = build_engine_file(kTiny, o, path);
        CHECK(r.info.library_version == INFER_VERSION);
        CHECK(r.info.backend == "cpu");
        CHECK(r.info.engine == engine);
        CHECK(r.file_bytes == std::filesystem::file_size(path));
        CHECK_FALSE(std::filesystem::exists(path.string() + ".partial"));

        auto direct = make_engine(kTiny, o);
        const auto want = greedy(*direct, prompts, 20);
        // Loaded with default options: the file says which engine and quantizer it needs.
        LlmOptions run;  // only the run-time settings
        run.engine_options = o.engine_options;
        auto built = make_engine(ModelSpec{.model = path}, run);
        CHECK(built->info().kind == engine);
        CHECK(built->config() == direct->config());
        CHECK(greedy(*built, prompts, 20) == want);
        const KvStats kv = built->kv_stats();
        CHECK(kv.free_blocks == kv.total_blocks);
      }
    }
}

TEST_CASE("an engine file carries the tokenizer, chat template and GEMM picks, and every part aligned to a page", "[engine][engine_file]") {
  const Tokenizer tok = Tokenizer::from_hf_json(infer::test::fixture("smollm2/tokenizer.json"));
  const auto path = temp_path("tokenizer.engine");
  EngineFileInfo info;
  info.library_version = INFER_VERSION;
  info.backend = "cpu";
  info.architecture = "cpu";
  info.engine = "paged";
  info.quantizer = "auto";
  info.quantizer_layout = "f32";
  info.config = ModelSource::open(infer::test::fixture("tiny_llama")).config();
  info.gemm_algorithms = {{"cublaslt", "130100"}, {"bf16 m256 n4096 k4096 bf16 a256/256/256 ldy0", std::string(128, 'a')}};
  const std::vector<float> a(1000, 1.5f), b(3, -2.0f);
  EngineFileWriter w;
  w.add_part("a.values", "f32", std::as_bytes(std::span<const float>(a)));
  w.add_part("b.values", "f32", std::as_bytes(std::span<const float>(b)));
  w.add_scalar("a.count", 1000);
  w.write(path, info, tok.spec());

  const EngineFile f = EngineFile::open(path);
  REQUIRE(f.tokenizer());
  const Tokenizer back(*f.tokenizer());
  for (const std::string text : {"Hello world!", "<|im_start|>user\nWhat is 2+2? 1234567 éàü 日本語<|im_end|>\n", "  a\tb\n\nc"})
    CHECK(back.encode(text) == tok.encode(text));
  CHECK(back.vocab_size() == tok.vocab_size());
  CHECK(back.chat_template_source() == tok.chat_template_source());
  CHECK(back.eos_id() == tok.eos_id());
  CHECK(f.info().config == info.config);
  CHECK(f.info().gemm_algorithms == info.gemm_algorithms);
  CHECK(f.scalar("a.count") == 1000);
  for (const auto& p : f.parts()) CHECK(p.offset % 4096 == 0);
  const auto bytes = f.part("b.values", "f32");
  REQUIRE(bytes.size() == 3 * sizeof(float));
  CHECK(reinterpret_cast<std::uintptr_t>(bytes.data()) % 4096 == 0);  // mapped: page-aligned in memory too
  CHECK_THAT(message_of<FormatError>([&] { (void)f.part("b.values", "i8"); }), Catch::Contains("holds f32 values"));
  CHECK_THAT(message_of<FormatError>([&] { (void)f.part("c.values", "f32"); }), Catch::Contains("no part 'c.values'"));
}

TEST_CASE("a file that is not a whole engine file of this format is refused, naming what is wrong", "[engine][engine_file]") {
  const auto good = temp_path("refuse.engine");
  build_engine_file(kTiny, small_options("paged", "int8"), good);
  const std::vector<std::byte> bytes = read_bytes(good);
  const auto bad = temp_path("bad.engine");
  auto open_bad = [&] { (void)EngineFile::open(bad); };

  SECTION("not an engine file") {
    CHECK_THAT(message_of<FormatError>([&] { (void)EngineFile::open(infer::test::fixture("tiny_llama/model.safetensors")); }),
               Catch::Contains("is not an infer engine file"));
  }
  SECTION("another format version") {
    auto b = bytes;
    b[8] = std::byte{7};
    write_bytes(bad, b);
    CHECK_THAT(message_of<UnsupportedError>(open_bad),
               Catch::Contains("format version 7") &&
                   Catch::Contains("reads versions " + std::to_string(kOldestEngineFileVersion) + " to " +
                                   std::to_string(kEngineFileVersion)) &&
                   Catch::Contains("rebuild it"));
    b[8] = std::byte{3};  // version 3 (before tensor-parallel files): still read, as the whole model
    write_bytes(bad, b);
    CHECK(EngineFile::open(bad).info().tensor_parallel == TensorParallel{});
    b[8] = std::byte{2};  // older than the oldest read
    write_bytes(bad, b);
    CHECK_THAT(message_of<UnsupportedError>(open_bad), Catch::Contains("format version 2"));
  }
  SECTION("a corrupted header") {
    auto b = bytes;
    b[200] = static_cast<std::byte>(static_cast<unsigned char>(b[200]) ^ 0x20);
    write_bytes(bad, b);
    CHECK_THAT(message_of<FormatError>(open_bad), Catch::Contains("header is corrupted"));
  }
  SECTION("truncated anywhere") {
    for (const std::size_t keep : {std::size_t{4}, std::size_t{20}, std::size_t{600}, bytes.size() / 2, bytes.size() - 1}) {
      write_bytes(bad, std::span<const std::byte>(bytes).first(keep));
      CHECK_THAT(message_of<FormatError>(open_bad), Catch::Contains(keep < 8 ? "not an infer engine file" : "truncated"));
    }
  }
}

TEST_CASE("an engine file built for something else is refused before its weights are read", "[engine][engine_file]") {
  const auto path = temp_path("built-int8.engine");
  const LlmOptions o = small_options("paged", "int8");
  build_engine_file(kTiny, o, path);
  const ModelSpec spec{.model = path};

  SECTION("another quantizer or engine kind than the file's") {
    LlmOptions fp8 = o;
    fp8.quantizer = "fp8";
    CHECK_THAT(message_of<InvalidArgument>([&] { (void)make_engine(spec, fp8); }),
               Catch::Contains("built with quantizer int8") && Catch::Contains("asks for quantizer fp8"));
    LlmOptions st = o;
    st.engine = "static";
    CHECK_THAT(message_of<InvalidArgument>([&] { (void)make_engine(spec, st); }),
               Catch::Contains("built with engine paged") && Catch::Contains("asks for engine static"));
  }
  SECTION("loaded by an engine type of another quantizer") {
    CHECK_THAT(message_of<FormatError>([&] { (void)PagedEngine<cpu, 16>(ModelSource::open(path), o.engine_options); }),
               Catch::Contains("holds weights of quantizer int8-weight-only") && Catch::Contains("this engine's is f32"));
  }
  SECTION("another library version, backend or architecture") {
    const EngineFile f = EngineFile::open(path);
    auto rewrite = [&](auto&& change) {
      EngineFileInfo info = f.info();
      change(info);
      EngineFileWriter w;
      for (const auto& p : f.parts()) w.add_part(p.name, p.dtype, f.part(p.name, p.dtype));
      const auto other = temp_path("other.engine");
      w.write(other, info, f.tokenizer());
      return other;
    };
    const auto old = rewrite([](EngineFileInfo& i) { i.library_version = "0.0.1"; });
    CHECK_THAT(message_of<UnsupportedError>([&] { (void)make_engine(ModelSpec{.model = old}, LlmOptions{}); }),
               Catch::Contains("built by infer 0.0.1") && Catch::Contains(std::string("this is infer ") + INFER_VERSION));
    const auto gpu = rewrite([](EngineFileInfo& i) { i.backend = "cuda"; i.architecture = "sm_90"; });
    CHECK_THAT(message_of<UnsupportedError>([&] { (void)make_engine(ModelSpec{.model = gpu, .backend = "cpu"}, LlmOptions{}); }),
               Catch::Contains("built for backend cuda") && Catch::Contains("asks for backend cpu"));
    // Where this machine has no sm_90 GPU (CI: no CUDA at all), a cuda file is refused naming both.
    if (engine_file_architecture("cuda") != "sm_90")
      CHECK_THAT(message_of<UnsupportedError>([&] { (void)make_engine(ModelSpec{.model = gpu, .backend = "auto"}, LlmOptions{}); }),
                 Catch::Contains("built for architecture sm_90") &&
                     Catch::Contains("cuda backend is " + engine_file_architecture("cuda")));
    const auto arch = rewrite([](EngineFileInfo& i) { i.architecture = "s390x"; });
    CHECK_THAT(message_of<UnsupportedError>([&] { (void)make_engine(ModelSpec{.model = arch}, LlmOptions{}); }),
               Catch::Contains("built for architecture s390x"));
  }
  SECTION("arrays whose sizes disagree with the config") {
    const EngineFile f = EngineFile::open(path);
    EngineFileWriter w;
    for (const auto& p : f.parts()) {
      auto b = f.part(p.name, p.dtype);
      if (p.name == "blk.1.ffn_down.q") b = b.first(b.size() - 64);  // a row short
      w.add_part(p.name, p.dtype, b);
    }
    const auto cut = temp_path("cut.engine");
    w.write(cut, f.info(), f.tokenizer());
    CHECK_THAT(message_of<FormatError>([&] { (void)make_engine(ModelSpec{.model = cut}, LlmOptions{}); }),
               Catch::Contains("'blk.1.ffn_down'") && Catch::Contains("do not agree"));
  }
}
