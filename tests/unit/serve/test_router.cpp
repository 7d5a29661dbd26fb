// The hybrid router's decisions (rules in order, default, fallback order) and its config's checks.
#include <catch2/catch.hpp>

#include "infer/serve/router.hpp"

using namespace infer;
using namespace infer::serve;
using Catch::Contains;
using nlohmann::json;

namespace {
const json config = {
    {"engines", {{{"name", "short"}, {"engine", "static"}}, {{"name", "long"}, {"engine", "paged"}, {"block_size", 16}},
                 {{"name", "spare"}, {"engine", "paged"}, {"max_waiting", 4}, {"kv_cache_memory", "64M"}}}},
    {"rules",
     {{{"engine", "long"}, {"min_prompt_tokens", 256}},
      {{"engine", "long"}, {"keywords", {"Step By Step", "explain"}}},
      {{"engine", "long"}, {"min_max_tokens", 200}},
      {{"engine", "spare"}, {"endpoint", "completions"}, {"max_prompt_tokens", 2}}}},
    {"default", "short"},
    {"fallback", {"long", "spare"}}};
EngineSpec base_spec() {
  EngineSpec s;
  s.llm.engine_options.max_model_len = 2048;
  s.model = ModelSpec{.model = "base.gguf", .backend = "cpu"};  // what --model gave
  return s;
}
RouteQuery query(std::int64_t prompt, std::optional<std::int64_t> max_tokens = std::nullopt, std::string text = "hello",
                 std::string endpoint = "chat") {
  return RouteQuery{prompt, max_tokens, std::move(text), std::move(endpoint), 0, {}};
}
}  // namespace

TEST_CASE("a config becomes engine specs over the command line's defaults", "[serve][router]") {
  const RouterConfig c = parse_router_config(config, base_spec());
  REQUIRE(c.engines.size() == 3);
  CHECK(c.engines[0].llm.engine == "static");
  CHECK(c.engines[1].llm.block_size == 16);
  CHECK(c.engines[2].worker.max_waiting == 4);
  CHECK(c.engines[2].worker.name == "spare");
  CHECK(c.engines[2].llm.engine_options.kv_cache_bytes == std::size_t{64} << 20);
  CHECK(c.engines[0].llm.engine_options.max_model_len == 2048);  // inherited
}

TEST_CASE("an engine entry may load its own model, backend, quantizer, Shape and memory share", "[serve][router]") {
  const EngineSpec base = base_spec();
  const json c = {{"engines",
                   {{{"name", "fast"}, {"engine", "static"}, {"max_batch", 4}, {"max_input", 64}, {"max_output", 32}},
                    {{"name", "big"}, {"engine", "paged"}, {"dummy", "llama3-8b"}, {"tokenizer", "base.gguf"},
                     {"dummy_seed", 7}, {"gpu_memory_utilization", 0.85}},
                    {{"name", "other"}, {"model", "other.gguf"}}}}};
  const RouterConfig r = parse_router_config(c, base);
  REQUIRE(r.engines.size() == 3);
  CHECK(r.engines[0].model.model == "base.gguf");  // inherited whole
  CHECK(r.engines[0].llm.engine_options.static_shape == Shape{4, 64, 32});
  CHECK(r.engines[1].model.dummy == "llama3-8b");
  CHECK(r.engines[1].model.model.empty());  // an entry's model replaces the command line's, not merges
  CHECK(r.engines[1].model.tokenizer == "base.gguf");
  CHECK(r.engines[1].model.dummy_seed == 7);
  CHECK(r.engines[1].model.backend == "cpu");  // the backend is inherited unless given
  CHECK(r.engines[1].llm.engine_options.gpu_memory_utilization == 0.85);
  CHECK(r.engines[0].llm.engine_options.gpu_memory_utilization == base.llm.engine_options.gpu_memory_utilization);
  CHECK(r.engines[2].model.model == "other.gguf");
  CHECK(r.engines[2].model.dummy.empty());
}

TEST_CASE("rules in order, then the default, fallbacks follow", "[serve][router]") {
  const Router r(parse_router_config(config, base_spec()));
  using V = std::vector<std::size_t>;
  CHECK(r.candidates(query(20)) == V{0, 1, 2});              // short prompt: the default, then the fallbacks
  CHECK(r.candidates(query(300)) == V{1, 2});                // long prompt
  CHECK(r.candidates(query(20, 50, "Explain this")) == V{1, 2});  // keyword, case-insensitive
  CHECK(r.candidates(query(20, 50, "do it STEP BY STEP")) == V{1, 2});
  CHECK(r.candidates(query(20, 200)) == V{1, 2});            // long output
  CHECK(r.candidates(query(20, 199)) == V{0, 1, 2});
  CHECK(r.candidates(query(2, 10, "x", "completions")) == V{2, 1});  // endpoint + max prompt
  CHECK(r.candidates(query(2, 10, "x", "chat")) == V{0, 1, 2});
}

TEST_CASE("without a fallback list every other engine is tried in config order", "[serve][router]") {
  json c = config;
  c.erase("fallback");
  const Router r(parse_router_config(c, base_spec()));
  CHECK(r.candidates(query(300)) == std::vector<std::size_t>{1, 0, 2});
}

TEST_CASE("config mistakes are named", "[serve][router]") {
  auto error = [](json c) {
    try {
      (void)parse_router_config(c, base_spec());
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(error(json::object()), Contains("'engines'"));
  json c = config;
  c["rules"][1]["engine"] = "nope";
  CHECK_THAT(error(c), Contains("rules[1].engine 'nope'"));
  c = config;
  c["engines"][1]["blocksize"] = 16;
  CHECK_THAT(error(c), Contains("unknown key 'blocksize'"));
  c = config;
  c["engines"][1]["name"] = "short";
  CHECK_THAT(error(c), Contains("used twice"));
  c = config;
  c["engines"][0]["engine"] = "turbo";
  CHECK_THAT(error(c), Contains("engines[0].engine 'turbo'"));
  c = config;
  c["default"] = "x";
  CHECK_THAT(error(c), Contains("default 'x'"));
  c = config;
  c["engines"][2]["kv_cache_memory"] = "lots";
  CHECK_THAT(error(c), Contains("kv_cache_memory"));
  c = config;
  c["rules"][0]["min_prompt_tokens"] = -3;
  CHECK_THAT(error(c), Contains("min_prompt_tokens"));
  c = config;
  c["engines"][1]["model"] = "a.gguf";
  c["engines"][1]["dummy"] = "llama3-8b";
  CHECK_THAT(error(c), Contains("engines[1] gives both 'model' and 'dummy'"));
  c = config;
  c["engines"][1]["tokenizer"] = "t.json";
  CHECK_THAT(error(c), Contains("engines[1].tokenizer and .dummy_seed go with 'dummy'"));
  c = config;
  c["engines"][0]["backend"] = "tpu";
  CHECK_THAT(error(c), Contains("engines[0]: backend 'tpu' is unknown"));
  c = config;
  c["engines"][0]["quantizer"] = "int3";
  CHECK_THAT(error(c), Contains("engines[0]: quantizer 'int3' is unknown"));
  c = config;
  c["engines"][2]["gpu_memory_utilization"] = 1.5;
  CHECK_THAT(error(c), Contains("engines[2].gpu_memory_utilization must be a number in (0, 1]"));
  c = config;
  c["engines"][0]["max_batch"] = "eight";
  CHECK_THAT(error(c), Contains("engines[0].max_batch must be an integer"));
}

TEST_CASE("memory sizes", "[serve][router]") {
  CHECK(parse_memory_size("512M") == std::size_t{512} << 20);
  CHECK(parse_memory_size("2G") == std::size_t{2} << 30);
  CHECK(parse_memory_size("1048576") == 1048576);
  CHECK_THROWS_AS(parse_memory_size("big"), InvalidArgument);
  CHECK_THROWS_AS(parse_memory_size("-1M"), InvalidArgument);
}

TEST_CASE("replicas: prefix affinity while loads are close, the least loaded beyond the slack", "[serve][router]") {
  // --data-parallel-size 3 on the CPU: three copies of the command line's engine, no device each.
  const RouterConfig c = replica_config(base_spec(), 3, /*one_device_each=*/false);
  REQUIRE(c.engines.size() == 3);
  CHECK(c.engines[2].name == "replica-2");
  CHECK(c.engines[2].worker.name == "replica-2");
  CHECK(c.engines[2].model.device == -1);
  CHECK(replica_config(base_spec(), 2, true).engines[1].model.device == 1);
  const Router r(c);
  const std::vector<std::int32_t> prompt{1, 2, 3, 4, 5};
  RouteQuery q = query(5);
  q.prefix_key = Router::prefix_key(prompt);
  const std::size_t affine = q.prefix_key % 3;
  // Without loads (a server that does not balance) the default engine and its fallbacks, as before.
  CHECK(r.candidates(q) == std::vector<std::size_t>{0, 1, 2});
  // Idle: the affine replica, then the others in config order.
  q.loads = {0, 0, 0};
  CHECK(r.candidates(q).front() == affine);
  // The affine replica keeps its requests up to kAffinitySlack beyond the least loaded ...
  q.loads = {0, 0, 0};
  q.loads[affine] = Router::kAffinitySlack;
  CHECK(r.candidates(q).front() == affine);
  // ... and beyond it the least loaded takes the request; the rest follow by load.
  q.loads = {5, 5, 5};
  q.loads[affine] = 5 + Router::kAffinitySlack + 1;
  q.loads[(affine + 1) % 3] = 4;
  const auto order = r.candidates(q);
  CHECK(order == std::vector<std::size_t>{(affine + 1) % 3, (affine + 2) % 3, affine});
  // The key looks at the first kAffinityTokens tokens only: a shared system prompt, different questions.
  std::vector<std::int32_t> a(Router::kAffinityTokens, 7), b = a;
  a.push_back(100);
  b.push_back(200);
  CHECK(Router::prefix_key(a) == Router::prefix_key(b));
  CHECK(Router::prefix_key(prompt) != Router::prefix_key(a));
}

TEST_CASE("a router config names its replicas", "[serve][router]") {
  json j = config;
  j["replicas"] = {"long", "spare"};
  CHECK(parse_router_config(j, base_spec()).replicas == std::vector<std::string>{"long", "spare"});
  j["replicas"] = {"long", "nope"};
  CHECK_THROWS_WITH(parse_router_config(j, base_spec()), Contains("replicas entry \"nope\" is not one of the engines"));
}
