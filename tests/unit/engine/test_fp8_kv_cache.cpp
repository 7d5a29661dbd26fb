// The FP8 KV cache (KvCacheDtype::fp8_e4m3, kv_dtype.hpp) on the CPU: the cache's storage and refusals, the
// attention kernel over e4m3 codes against the same kernel over the decoded values (bit for bit), and both
// engines with it: the tokens they agree on, the blocks they return, the capacity a byte budget buys, and
// the refusal of an attention kernel that does not read an FP8 cache.
#include "engine_test_support.hpp"

#include <cmath>
#include <functional>
#include <numeric>
#include <random>

#include "infer/attention/contiguous_attention.hpp"
#include "infer/attention/paged_attention.hpp"
#include "infer/core/fp8.hpp"
#include "infer/engine/engine_build.hpp"
#include "support/test_seed.hpp"
#include "support/tiny_checkpoint.hpp"

using namespace infer;
using namespace infer::test;

namespace {

TEST_CASE("an FP8 KV cache holds e4m3 codes: a quarter of f32's bytes, its scales, its refusals", "[kv][fp8]") {
  KvCache<cpu> f32(2, 8, 4, 2, 16);
  KvCache<cpu> fp8(2, 8, 4, 2, 16, KvCacheDtype::fp8_e4m3);
  CHECK(fp8.dtype() == KvCacheDtype::fp8_e4m3);
  CHECK(fp8.bytes() * 4 == f32.bytes());
  CHECK(KvCache<cpu>::bytes_per_token(2, 2, 16, KvCacheDtype::fp8_e4m3) == 2u * 2 * 2 * 16);
  CHECK(KvCache<cpu>::bytes_per_token(2, 2, 16) == 2u * 2 * 2 * 16 * sizeof(float));
  CHECK_THROWS_WITH(fp8.k(0), Catch::Contains("e4m3 codes"));
  CHECK_THROWS_WITH(f32.k_codes(0), Catch::Contains("not e4m3 codes"));
  CHECK_THROWS_AS(fp8.k_codes(2), InvalidArgument);

  CHECK(fp8.k_scale(1) == 1.0f);
  fp8.set_scales(1, 0.5f, 2.0f);
  CHECK(fp8.k_scale(1) == 0.5f);
  CHECK(fp8.v_scale(1) == 2.0f);
  CHECK_THROWS_WITH(fp8.set_scales(0, 0.0f, 1.0f), Catch::Contains("positive and finite"));
  CHECK_THROWS_WITH(fp8.set_scales(0, 1.0f, std::numeric_limits<float>::infinity()), Catch::Contains("positive and finite"));
  CHECK_THROWS_AS(fp8.set_scales(5, 1.0f, 1.0f), InvalidArgument);

  // copy_block copies codes, K and V, every layer, and nothing else.
  const std::size_t block = 4 * 2 * 16;
  for (std::int32_t l = 0; l < 2; ++l)
    for (std::size_t i = 0; i < block; ++i) {
      fp8.k_codes(l)[3 * block + i] = static_cast<std::uint8_t>(i + l);
      fp8.v_codes(l)[3 * block + i] = static_cast<std::uint8_t>(i * 3 + l);
    }
  fp8.copy_block(3, 6);
  for (std::int32_t l = 0; l < 2; ++l)
    for (std::size_t i = 0; i < block; ++i) {
      REQUIRE(fp8.k_codes(l)[6 * block + i] == static_cast<std::uint8_t>(i + l));
      REQUIRE(fp8.v_codes(l)[6 * block + i] == static_cast<std::uint8_t>(i * 3 + l));
      REQUIRE(fp8.k_codes(l)[5 * block + i] == 0);
    }
}

TEST_CASE("kv_cache_dtype parses vLLM's spellings and refuses others by name", "[kv][fp8]") {
  CHECK(parse_kv_cache_dtype("auto") == KvCacheDtype::automatic);
  CHECK(parse_kv_cache_dtype("fp8") == KvCacheDtype::fp8_e4m3);
  CHECK(parse_kv_cache_dtype("fp8_e4m3") == KvCacheDtype::fp8_e4m3);
  CHECK_THROWS_WITH(parse_kv_cache_dtype("fp8_e5m2"), Catch::Contains("fp8_e5m2") && Catch::Contains("auto, fp8, fp8_e4m3"));
  CHECK(to_string(KvCacheDtype::fp8_e4m3) == "fp8_e4m3");
}

/// Attention over e4m3 codes equals attention over an f32 cache holding code · scale, bit for bit: the kernel
/// decodes the codes and then does the f32 cache's arithmetic. Paged (scrambled table) and contiguous, with
/// scales that are not powers of two, GQA, and chunks that cross tiles.
TEST_CASE("CPU attention over an FP8 view equals attention over its decoded values", "[attention][fp8]") {
  std::mt19937 rng(test_seed("fp8 kv attention"));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct Case {
    AttentionShape shape;
    std::int32_t start, count;
  };
  for (const Case& c : {Case{{8, 2, 16, 0.25f}, 0, 11}, Case{{8, 2, 16, 0.25f}, 13, 1}, Case{{6, 3, 64, 0.125f}, 70, 5}}) {
    const std::int32_t len = c.start + c.count, kvh = c.shape.num_kv_heads, D = c.shape.head_dim;
    INFO("heads " << c.shape.num_heads << "/" << kvh << " dim " << D << " start " << c.start << " count " << c.count);
    const float k_scale = 0.37f, v_scale = 1.9f;
    const std::int32_t bs = 4, nb = (len + bs - 1) / bs, pool = 2 * nb + 1;
    std::vector<std::int32_t> ids(static_cast<std::size_t>(pool));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    const std::vector<std::int32_t> table(ids.begin(), ids.begin() + nb);
    const std::size_t n = static_cast<std::size_t>(pool) * bs * kvh * D;
    std::vector<std::uint8_t> kc(n, 0x7f), vc(n, 0x7f);  // NaN codes where nothing is written
    std::vector<float> kf(n, std::nanf("")), vf(n, std::nanf(""));
    auto codes = PagedAttention<>::make_view<std::uint8_t>(kc.data(), vc.data(), table, bs, kvh, D);
    codes.k_scale = k_scale;
    codes.v_scale = v_scale;
    const auto values = PagedAttention<>::make_view<float>(kf.data(), vf.data(), table, bs, kvh, D);
    for (std::int32_t p = 0; p < len; ++p)
      for (std::int32_t h = 0; h < kvh; ++h)
        for (std::int32_t d = 0; d < D; ++d) {
          // Codes of values around the scale, a few past its range (saturated) and some subnormals.
          const std::uint8_t a = f32_to_e4m3(normal(rng) * 3.0f), b = f32_to_e4m3(normal(rng) * 3.0f);
          codes.k_at(p, h)[d] = a;
          codes.v_at(p, h)[d] = b;
          values.k_at(p, h)[d] = e4m3_to_f32(a) * k_scale;
          values.v_at(p, h)[d] = e4m3_to_f32(b) * v_scale;
        }
    std::vector<float> q(static_cast<std::size_t>(c.count) * c.shape.num_heads * D);
    for (auto& x : q) x = normal(rng);
    std::vector<float> want(q.size()), got(q.size());
    PagedAttention<>::attend(cpu{}, c.shape, q.data(), want.data(), c.start, c.count, values);
    PagedAttention<>::attend(cpu{}, c.shape, q.data(), got.data(), c.start, c.count, codes);
    for (const float x : got) REQUIRE(std::isfinite(x));  // no NaN code was read
    CHECK(got == want);

    // The contiguous view of a slot holding the same rows: the same result.
    const std::vector<std::int32_t> slot = {1};
    std::vector<std::uint8_t> kc2(static_cast<std::size_t>(3) * len * kvh * D, 0x7f), vc2(kc2.size(), 0x7f);
    auto contiguous = FusedContiguousAttention<>::make_view<std::uint8_t>(kc2.data(), vc2.data(), slot, len, kvh, D);
    contiguous.k_scale = k_scale;
    contiguous.v_scale = v_scale;
    for (std::int32_t p = 0; p < len; ++p)
      for (std::int32_t h = 0; h < kvh; ++h)
        for (std::int32_t d = 0; d < D; ++d) {
          contiguous.k_at(p, h)[d] = codes.k_at(p, h)[d];
          contiguous.v_at(p, h)[d] = codes.v_at(p, h)[d];
        }
    std::vector<float> got_contiguous(q.size());
    FusedContiguousAttention<>::attend(cpu{}, c.shape, q.data(), got_contiguous.data(), c.start, c.count, contiguous);
    CHECK(got_contiguous == want);
  }
}

std::vector<Tokens> tiny_prompts() {
  return {{1, 15, 27, 99, 4, 18, 7}, {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23}, {1, 200, 100, 50}};
}

TEST_CASE("both engines run with an FP8 KV cache: equal tokens, every block returned, 4x the blocks of f32",
          "[engine][fp8]") {
  EngineOptions fp8;
  fp8.kv_cache_dtype = KvCacheDtype::fp8_e4m3;
  fp8.kv_cache_bytes = std::size_t{1} << 20;
  fp8.static_shape = Shape{.max_batch = 2, .max_input = 16, .max_output = 12};  // 3 prompts, 2 slots: a refill
  EngineOptions f32 = fp8;
  f32.kv_cache_dtype = KvCacheDtype::automatic;

  PagedEngine<cpu> paged(fixture("tiny_llama"), fp8);
  PagedEngine<cpu> paged_f32(fixture("tiny_llama"), f32);
  CHECK(paged.kv_cache().dtype() == KvCacheDtype::fp8_e4m3);
  CHECK(paged.kv_stats().total_blocks == 4 * paged_f32.kv_stats().total_blocks);
  StaticEngine<cpu, kShapeAtRuntime> fixed(fixture("tiny_llama"), fp8);

  const auto params = greedy_params(12);
  const auto a = run_batch(paged, tiny_prompts(), params);
  const auto b = run_batch(fixed, tiny_prompts(), params);
  const auto reference = run_batch(paged_f32, tiny_prompts(), params);
  // The paged and the static engine write the same codes and attend over them in the same order.
  CHECK(a == b);
  std::size_t same = 0, total = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].size() == 12);
    same += first_difference(a[i], reference[i]);
    total += a[i].size();
  }
  // Reported, not required: how far greedy decoding with FP8 K/V follows the f32 cache's on this fixture.
  WARN("tiny_llama, FP8 KV cache: " << same << " of " << total << " greedy tokens before the first difference from f32");
  check_all_blocks_free(paged);
  check_all_blocks_free(fixed);
}

/// The tiny Llama checkpoint (f32) with KV-cache scales under the given names: `names(layer)` gives the K and V
/// tensors' names, `values` the scalars to write (F32, shape [] or [1]).
std::filesystem::path with_kv_scales(const std::string& dir, const std::function<std::pair<std::string, std::string>(int)>& names,
                                     const std::vector<float>& values, std::vector<std::uint64_t> shape = {}) {
  std::vector<SafetensorsEntry> extra;
  for (int l = 0; l < 2; ++l) {
    const auto [k, v] = names(l);
    if (!k.empty()) extra.push_back(SafetensorsEntry::of<float>(k, "F32", shape, std::span(&values[2 * l], shape.empty() ? 1 : shape[0])));
    if (!v.empty()) extra.push_back(SafetensorsEntry::of<float>(v, "F32", shape, std::span(&values[2 * l + 1], shape.empty() ? 1 : shape[0])));
  }
  const auto f32 = [](const std::string& n, const std::vector<float>& w, std::int64_t out, std::int64_t in) {
    return std::vector<SafetensorsEntry>{
        SafetensorsEntry::of<float>(n, "F32", {static_cast<std::uint64_t>(out), static_cast<std::uint64_t>(in)}, w)};
  };
  return rewrite_tiny_llama(dir, f32, false, std::move(extra));
}

TEST_CASE("an FP8 KV cache takes a checkpoint's K/V scales (ModelOpt's and compressed-tensors' names)", "[engine][fp8][model]") {
  const std::vector<float> scales = {0.5f, 0.25f, 0.125f, 2.0f};  // layer 0 K, V; layer 1 K, V
  const auto modelopt = with_kv_scales("infer-kv-scales-modelopt", [](int l) {
    const std::string a = detail::cat("model.layers.", l, ".self_attn.");
    return std::pair{a + "k_proj.k_scale", a + "v_proj.v_scale"};
  }, scales);
  const auto compressed = with_kv_scales("infer-kv-scales-ct", [](int l) {
    const std::string a = detail::cat("model.layers.", l, ".self_attn.");
    return std::pair{a + "k_scale", a + "v_scale"};
  }, scales);
  EngineOptions fp8;
  fp8.kv_cache_dtype = KvCacheDtype::fp8_e4m3;
  fp8.static_shape = Shape{.max_batch = 2, .max_input = 16, .max_output = 12};
  for (const auto& dir : {modelopt, compressed}) {
    INFO(dir);
    const ModelSource src = ModelSource::open(dir);
    REQUIRE(src.kv_cache_scales(1).has_value());
    CHECK(src.kv_cache_scales(1)->k == 0.125f);
    CHECK(src.kv_cache_scales(1)->v == 2.0f);
    PagedEngine<cpu> paged(dir, fp8);
    StaticEngine<cpu, kShapeAtRuntime> fixed(dir, fp8);
    for (std::int32_t l = 0; l < 2; ++l) {
      CHECK(paged.kv_cache().k_scale(l) == scales[static_cast<std::size_t>(2 * l)]);
      CHECK(paged.kv_cache().v_scale(l) == scales[static_cast<std::size_t>(2 * l + 1)]);
      CHECK(fixed.kv_cache().k_scale(l) == scales[static_cast<std::size_t>(2 * l)]);
    }
    CHECK(run_batch(paged, tiny_prompts(), greedy_params(12)) == run_batch(fixed, tiny_prompts(), greedy_params(12)));
    check_all_blocks_free(paged);
  }
  // The f32 fixture ships none; a GGUF file or a dummy model neither.
  CHECK_FALSE(ModelSource::open(fixture("tiny_llama")).kv_cache_scales(0).has_value());
  CHECK_THROWS_AS(ModelSource::open(modelopt).kv_cache_scales(2), InvalidArgument);
}

TEST_CASE("an engine file keeps the checkpoint's KV-cache scales", "[engine][fp8][engine_file]") {
  const std::vector<float> scales = {0.5f, 0.25f, 0.125f, 2.0f};
  const auto dir = with_kv_scales("infer-kv-scales-for-file", [](int l) {
    const std::string a = detail::cat("model.layers.", l, ".self_attn.");
    return std::pair{a + "k_proj.k_scale", a + "v_proj.v_scale"};
  }, scales);
  const auto file = std::filesystem::temp_directory_path() / "infer-kv-scales.engine";
  build_engine_file(ModelSpec{.model = dir}, LlmOptions{}, file);
  const ModelSource src = ModelSource::open(file);
  REQUIRE(src.engine_file() != nullptr);
  REQUIRE(src.kv_cache_scales(1).has_value());
  CHECK(src.kv_cache_scales(1)->k == 0.125f);
  CHECK(src.kv_cache_scales(1)->v == 2.0f);
  EngineOptions fp8;
  fp8.kv_cache_dtype = KvCacheDtype::fp8_e4m3;
  PagedEngine<cpu> engine(file, fp8);
  CHECK(engine.kv_cache().k_scale(0) == 0.5f);
  CHECK(engine.kv_cache().v_scale(0) == 0.25f);
  CHECK(run_batch(engine, tiny_prompts(), greedy_params(4)).size() == 3);
  // A model that ships none builds a file that records none.
  const auto plain = std::filesystem::temp_directory_path() / "infer-kv-scales-none.engine";
  build_engine_file(ModelSpec{.model = fixture("tiny_llama")}, LlmOptions{}, plain);
  CHECK_FALSE(ModelSource::open(plain).kv_cache_scales(0).has_value());
  std::filesystem::remove(file);
  std::filesystem::remove(plain);
}

TEST_CASE("malformed KV-cache scales are refused with the tensor's name", "[engine][fp8][model][errors]") {
  const auto names = [](int l) {
    const std::string a = detail::cat("model.layers.", l, ".self_attn.");
    return std::pair{a + "k_scale", a + "v_scale"};
  };
  EngineOptions fp8;
  fp8.kv_cache_dtype = KvCacheDtype::fp8_e4m3;
  const auto negative = with_kv_scales("infer-kv-scales-negative", names, {0.5f, -1.0f, 1.0f, 1.0f});
  CHECK_THROWS_WITH(PagedEngine<cpu>(negative, fp8), Catch::Contains("model.layers.0.self_attn.v_scale") &&
                                                         Catch::Contains("positive and finite"));
  const auto vector = with_kv_scales("infer-kv-scales-vector", names, {1, 1, 1, 1, 1, 1, 1, 1}, {2});
  CHECK_THROWS_WITH(ModelSource::open(vector).kv_cache_scales(0), Catch::Contains("not one f32"));
  const auto half_pair = with_kv_scales("infer-kv-scales-half", [](int l) {
    return std::pair{detail::cat("model.layers.", l, ".self_attn.k_scale"), std::string()};
  }, {1, 1, 1, 1});
  CHECK_THROWS_WITH(ModelSource::open(half_pair).kv_cache_scales(0),
                    Catch::Contains("model.layers.0.self_attn.k_scale") && Catch::Contains("both scales"));
  // An engine with the default cache never reads them.
  PagedEngine<cpu> automatic(negative, EngineOptions{});
  CHECK(automatic.kv_cache().dtype() == KvCacheDtype::automatic);
}

/// PagedAttention's CPU kernel under another name, without reads_fp8_kv_cache: what a research kernel that
/// never learnt to read codes looks like to the engine.
struct F32OnlyAttention {
  static constexpr KvLayout layout = KvLayout::paged;
  static constexpr std::string_view name = "f32_only";
  template <class T>
  using view = PagedKvView<T>;
  template <class T>
  static view<T> make_view(T* k, T* v, std::span<const std::int32_t> table, std::int32_t block_size,
                           std::int32_t kv_heads, std::int32_t head_dim) {
    return PagedAttention<>::make_view<T>(k, v, table, block_size, kv_heads, head_dim);
  }
  static void attend(cpu, const AttentionShape& shape, const float* q, float* out, std::int32_t start,
                     std::int32_t count, const view<float>& kv) {
    PagedAttention<>::attend(cpu{}, shape, q, out, start, count, kv);
  }
};
static_assert(AttentionKernel<F32OnlyAttention, cpu>);
static_assert(!reads_fp8_kv_cache<F32OnlyAttention, cpu>);
static_assert(reads_fp8_kv_cache<PagedAttention<>, cpu> && reads_fp8_kv_cache<FusedContiguousAttention<>, cpu>);
/// The flag inherited, attend overridden for f32 views only (as examples/custom_kernels' counting kernel
/// does): it does not read an FP8 cache on the CPU.
struct InheritsTheFlag : PagedAttention<> {
  static void attend(cpu, const AttentionShape& shape, const float* q, float* out, std::int32_t start,
                     std::int32_t count, const view<float>& kv) {
    PagedAttention<>::attend(cpu{}, shape, q, out, start, count, kv);
  }
};
static_assert(!reads_fp8_kv_cache<InheritsTheFlag, cpu>);

TEST_CASE("an engine refuses an FP8 KV cache when its attention kernel does not read one", "[engine][fp8][errors]") {
  using E = Engine<cpu, llama, PagedBlockAllocator<16>, ContinuousBatchScheduler<>, F32OnlyAttention, F32>;
  EngineOptions o;
  o.kv_cache_dtype = KvCacheDtype::fp8_e4m3;
  CHECK_THROWS_WITH(E(fixture("tiny_llama"), o), Catch::Contains("f32_only") && Catch::Contains("reads_fp8_kv_cache"));
  o.kv_cache_dtype = KvCacheDtype::automatic;
  E engine(fixture("tiny_llama"), o);  // and runs with the f32 cache
  CHECK(run_batch(engine, tiny_prompts(), greedy_params(3)).size() == 3);
}

}  // namespace
