// What a server engine loads: a model file or a dummy shape with a borrowed tokenizer, and the checks
// that refuse a combination before anything is read. A dummy model whose vocabulary is larger than its
// tokenizer's (the Llama-3-8B shape served with SmolLM2's tokenizer for a benchmark) generates ids the
// tokenizer does not know: they stream with no text instead of failing the request.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "infer/engine/engine_registry.hpp"
#include "support/fixtures.hpp"

using namespace infer;

namespace {

/// A small llama with `vocab` entries, as a config.json in a fresh folder (the form --dummy also takes).
std::filesystem::path write_config(std::int64_t vocab) {
  const auto dir = std::filesystem::temp_directory_path() / ("infer_model_spec_" + std::to_string(vocab));
  std::filesystem::create_directories(dir);
  const auto path = dir / "config.json";
  std::ofstream(path) << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": )" << vocab
                      << R"(, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
      "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 256,
      "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "eos_token_id": 2})";
  return path;
}

LlmOptions small_options() {
  LlmOptions o;
  o.engine_options.kv_cache_bytes = std::size_t{8} << 20;
  o.engine_options.max_model_len = 256;
  return o;
}

}  // namespace

TEST_CASE("ModelSpec refuses combinations that cannot load, naming the flag") {
  const auto model = infer::test::default_model();
  auto message = [](const ModelSpec& s) {
    try {
      s.validate();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK_THAT(message(ModelSpec{}), Catch::Contains("--model PATH or --dummy SHAPE"));
  CHECK_THAT(message(ModelSpec{.model = model, .dummy = "llama3-8b"}), Catch::Contains("--model PATH or --dummy SHAPE"));
  CHECK_THAT(message(ModelSpec{.model = model, .tokenizer = model}), Catch::Contains("--tokenizer is for --dummy"));
  CHECK_THAT(message(ModelSpec{.model = model, .backend = "tpu"}), Catch::Contains("backend 'tpu' is unknown"));
#if !defined(INFER_HAVE_CUDA)
  CHECK_THAT(message(ModelSpec{.model = model, .backend = "cuda"}), Catch::Contains("no CUDA backend"));
#else
  // The cuda backend compiles one paged block size; other choices are refused before the GPU is touched.
  LlmOptions o = small_options();
  o.block_size = 8;
  CHECK_THROWS_WITH(make_engine(ModelSpec{.model = model, .backend = "cuda"}, o), Catch::Contains("block_size 16"));
  if (cuda_devices() == 0)
    CHECK_THROWS_WITH(make_engine(ModelSpec{.model = model, .backend = "cuda"}, small_options()),
                      Catch::Contains("no CUDA device is present"));
#endif
  // auto: the GPU when this build has one and a device is present.
  CHECK(resolve_backend("auto") == (cuda_devices() > 0 ? "cuda" : "cpu"));
  CHECK(resolve_backend("cpu") == "cpu");
  CHECK_THROWS_WITH(resolve_backend("tpu"), Catch::Contains("backend 'tpu' is unknown"));
  LlmOptions bf16_on_cpu = small_options();
  bf16_on_cpu.quantizer = "bf16";
  CHECK_THROWS_WITH(make_engine(ModelSpec{.model = model}, bf16_on_cpu), Catch::Contains("cuda backend option"));
  LlmOptions int8 = small_options();
  int8.quantizer = "int8";
  CHECK_NOTHROW(check_engine_choice("cuda", int8));  // Int8WeightOnly has its GPU kernels (kernels/cuda/int_linear.cu)
  int8.block_size = 8;
  CHECK_THROWS_WITH(check_engine_choice("cpu", int8), Catch::Contains("block_size 16"));
  int8.quantizer = "int3";
  CHECK_THROWS_WITH(check_engine_choice("cpu", int8), Catch::Contains("choose auto, bf16, int8, fp8 or int4"));
  int8.quantizer = "int4";
  int8.block_size = 16;
  CHECK_NOTHROW(check_engine_choice("cuda", int8));  // and so has Int4
  int8.block_size = 32;
  CHECK_THROWS_WITH(check_engine_choice("cuda", int8), Catch::Contains("block_size 16"));
  LlmOptions fp8 = small_options();
  fp8.quantizer = "fp8";
  CHECK_NOTHROW(check_engine_choice("cuda", fp8));  // Fp8 has its GPU kernels (kernels/cuda/fp8_linear.cu)
  fp8.engine = "static";
  CHECK_NOTHROW(check_engine_choice("cuda", fp8));
  fp8.engine = "paged";
  fp8.block_size = 8;
  CHECK_THROWS_WITH(check_engine_choice("cuda", fp8), Catch::Contains("block_size 16"));
  CHECK(message(ModelSpec{.dummy = "llama3-8b", .tokenizer = model, .backend = "cpu"}).empty());
  CHECK(ModelSpec{.dummy = "llama3-8b"}.name() == "dummy-llama3-8b");
  CHECK(ModelSpec{.model = model}.name() == model.filename().string());
}

TEST_CASE("A dummy model borrows a tokenizer: text prompts work and unknown ids have no text") {
  const auto model = infer::test::default_model();
  const ModelSource donor = ModelSource::open(model);
  REQUIRE(donor.tokenizer());
  const auto tok_vocab = static_cast<std::int64_t>(donor.tokenizer()->vocab_size());

  SECTION("an HF tokenizer.json serves as well as a model file") {
    const ModelSpec spec{.dummy = write_config(tok_vocab).string(),
                         .tokenizer = infer::test::fixture("smollm2/tokenizer.json")};
    const ModelSource source = spec.open();
    REQUIRE(source.tokenizer());
    CHECK(source.tokenizer()->vocab_size() == donor.tokenizer()->vocab_size());
    CHECK(source.tokenizer()->decode(donor.tokenizer()->encode("Hello world"), true) == "Hello world");
  }

  SECTION("a tokenizer larger than the model's vocabulary is refused") {
    const ModelSpec small{.dummy = write_config(tok_vocab / 2).string(), .tokenizer = model};
    CHECK_THROWS_WITH(small.open(), Catch::Contains("more than the model's vocabulary"));
  }

  SECTION("ids beyond the tokenizer stream as empty text; the rest decode as the tokenizer does") {
    // Twice the tokenizer's vocabulary: about half the ids random weights pick have no text.
    const ModelSpec spec{.dummy = write_config(2 * tok_vocab).string(), .dummy_seed = 5, .tokenizer = model};
    auto engine = make_engine(spec, small_options());
    REQUIRE(engine->tokenizer());
    const Tokenizer& tok = *engine->tokenizer();
    SamplingParams p;
    p.temperature = 1.0f;  // random weights: sampling spreads the ids over the whole vocabulary
    p.seed = 3;
    p.max_tokens = 64;
    p.ignore_eos = true;
    engine->add_request(tok.encode("The capital of France is"), p);
    std::vector<std::int32_t> ids;
    std::string text;
    while (engine->has_unfinished())
      for (const auto& out : engine->step()) {
        ids.insert(ids.end(), out.outputs[0].delta_token_ids.begin(), out.outputs[0].delta_token_ids.end());
        text += out.outputs[0].delta_text;
      }
    REQUIRE(ids.size() == 64);
    std::vector<std::int32_t> known;
    for (auto id : ids)
      if (id < tok_vocab) known.push_back(id);
    CHECK(known.size() < ids.size());  // some ids are beyond the tokenizer...
    CHECK(!known.empty());             // ...and some are not
    CHECK(text == tok.decode(known, true));
    CHECK(engine->kv_stats().free_blocks == engine->kv_stats().total_blocks);
  }
}
