// Engine files on the cuda backend (infer-build --backend cuda): the weights loaded onto the GPU through the
// Quantizer, the weight arena written whole, and loaded back by one upload with every pointer placed from
// the file. The same bytes reach the same kernels, so a file must give token for token what the model
// loaded directly gives, for each cuda Quantizer (GGUF blocks in place, bf16, FP8 quantized on the device)
// and both engines; and a file whose offsets leave the arena, or that another Quantizer's engine loads, is
// refused before any weight reaches the device.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "infer/backend/cuda_runtime.hpp"
#include "infer/engine/engine_build.hpp"
#include "support/engine_file_support.hpp"
#include "support/fixtures.hpp"

using namespace infer;
using Tokens = std::vector<std::int32_t>;

namespace {

std::filesystem::path temp_path(const std::string& name) { return test::engine_temp_path("infer_cuda_engine_file_test", name); }

LlmOptions small_options(const std::string& engine, const std::string& quantizer) {
  LlmOptions o;
  o.engine = engine;
  o.quantizer = quantizer;
  o.engine_options.kv_cache_bytes = std::size_t{64} << 20;  // two engines live at once: not 90% of the GPU each
  o.engine_options.max_model_len = 256;
  o.engine_options.static_shape = Shape{.max_batch = 4, .max_input = 64, .max_output = 32};
  return o;
}

std::vector<Tokens> greedy(EngineHandle& engine, const std::vector<Tokens>& prompts, std::int32_t max_tokens) {
  return test::engine_greedy(engine, prompts, max_tokens);
}

}  // namespace

TEST_CASE("engine files on the GPU give the tokens of the model they were built from, each cuda quantizer, both engines",
          "[cuda][engine][engine_file]") {
  const ModelSpec model{.model = infer::test::default_model(), .backend = "cuda"};
  const std::vector<Tokens> prompts = {{1, 17, 42, 99, 3}, {1, 200, 5}, {1, 7, 7, 7, 7, 7, 7, 7, 7, 7, 120, 33, 906, 12}};
  for (const std::string engine : {"paged", "static"})
    for (const std::string quantizer : {"auto", "bf16", "fp8", "int8", "int4"}) {
      DYNAMIC_SECTION(engine << " engine, quantizer " << quantizer) {
        const LlmOptions o = small_options(engine, quantizer);
        const auto path = temp_path(engine + "-" + quantizer + ".engine");
        const EngineBuildReport r = build_engine_file(model, o, path);
        CHECK(r.info.backend == "cuda");
        CHECK(r.info.architecture == backend::cuda::device_architecture());
        CHECK(r.file_bytes == std::filesystem::file_size(path));

        std::vector<Tokens> want;
        {
          auto direct = make_engine(model, o);
          want = greedy(*direct, prompts, 24);
        }
        LlmOptions run;  // the run-time settings only: the file says which engine and quantizer
        run.engine_options = o.engine_options;
        auto built = make_engine(ModelSpec{.model = path, .backend = "auto"}, run);
        CHECK(built->info().kind == engine);
        CHECK(greedy(*built, prompts, 24) == want);
        const KvStats kv = built->kv_stats();
        CHECK(kv.free_blocks == kv.total_blocks);
        std::filesystem::remove(path);
      }
    }
}

TEST_CASE("a cuda engine file whose arena offsets or quantizer do not fit is refused, naming what", "[cuda][engine][engine_file]") {
  const ModelSpec model{.model = infer::test::default_model(), .backend = "cuda"};
  const LlmOptions o = small_options("paged", "bf16");
  const auto path = temp_path("refused-bf16.engine");
  build_engine_file(model, o, path);
  const EngineFile f = EngineFile::open(path);
  const auto rewrite = [&](const char* name, auto&& change) {
    EngineFileInfo info = f.info();
    change(info);
    EngineFileWriter w;
    for (const auto& p : f.parts()) w.add_part(p.name, p.dtype, f.part(p.name, p.dtype));
    const auto other = temp_path(name);
    w.write(other, info, f.tokenizer());
    return other;
  };
  const auto message = [](auto&& load) -> std::string {
    try {
      load();
    } catch (const FormatError& e) {
      return e.what();
    }
    return "no FormatError";
  };
  EngineOptions eo = o.engine_options;
  SECTION("an offset past the arena's end") {
    const auto bad = rewrite("offset.engine", [](EngineFileInfo& i) { i.scalars.at("blk.3.attn_output.data.offset") += 1 << 30; });
    CHECK_THAT(message([&] { (void)PagedEngine<cuda, 16, Bf16>(ModelSource::open(bad), eo); }),
               Catch::Contains("blk.3.attn_output.data.offset") && Catch::Contains("outside the weight arena"));
  }
  SECTION("a weight of another shape than the config's") {
    const auto bad = rewrite("shape.engine", [](EngineFileInfo& i) { i.scalars.at("blk.2.ffn_down.in") -= 64; });
    CHECK_THAT(message([&] { (void)PagedEngine<cuda, 16, Bf16>(ModelSource::open(bad), eo); }),
               Catch::Contains("'blk.2.ffn_down'") && Catch::Contains("the config implies"));
  }
  SECTION("loaded by an engine of another quantizer") {
    CHECK_THAT(message([&] { (void)PagedEngine<cuda, 16, Fp8>(ModelSource::open(path), eo); }),
               Catch::Contains("holds weights of quantizer bf16") && Catch::Contains("this engine's is fp8"));
  }
  std::filesystem::remove(path);
}
