#pragma once
/// \file
/// The hybrid router: one server, several engines, each request sent to the engine a rule picks — for
/// example the static engine (fixed shapes, no paging overhead) with a small model for short prompts and
/// the paged engine with a larger one for long prompts, long outputs or prompts that ask for more work —
/// with fallback to the others when the chosen one is full, failed, or cannot run the request's shape.
///
/// A config (JSON, `infer-serve --router CONFIG.json`):
///
///   {"engines": [{"name": "short", "engine": "static", "max_batch": 8, "max_input": 256, "max_output": 256},
///                {"name": "long",  "engine": "paged", "block_size": 16, "max_num_seqs": 64,
///                 "dummy": "llama3-8b", "tokenizer": "SmolLM2.gguf", "gpu_memory_utilization": 0.9}],
///    "rules":   [{"engine": "long", "min_prompt_tokens": 256},
///                {"engine": "long", "keywords": ["step by step", "explain"]},
///                {"engine": "long", "min_max_tokens": 256}],
///    "default": "short",
///    "fallback": ["long", "short"]}
///
/// An engine entry takes what the command line leaves out: its model (`model`, or `dummy` with
/// `tokenizer` and `dummy_seed`), `backend`, `quantizer`, the static Shape, the cache and scheduler limits.
/// The server tokenizes a prompt once, before routing, so every engine must read the same tokenizer
/// (infer-serve checks it once the engines are loaded: tokenizer_difference). Engines load one after another in
/// config order; on the GPU each one's `gpu_memory_utilization` caps the device's use once it is loaded,
/// the engines before it included (vLLM's meaning, per engine), so the later engine gets the larger number.
///
/// Rules are tried in order; a rule matches when every condition it states holds; the first match
/// wins, else `default`. The candidates for a request are its engine, then `fallback` in order (every
/// other engine in config order when `fallback` is absent). Deciding is pure (`Router::candidates`),
/// so rules are unit-tested without engines.
///
/// Replicas (data parallel, `infer-serve --data-parallel-size N`, or `"replicas": [names]` in a config): engines
/// that serve the same model interchangeably, e.g. one per GPU. When the rules pick one of them, the router picks
/// among them by prefix-cache affinity and queue depth: a request goes to the replica its prompt's first
/// kAffinityTokens tokens hash to (requests sharing a system prompt or a conversation's history land where those
/// KV blocks are cached), unless that replica has more than kAffinitySlack requests outstanding beyond the least
/// loaded one, which then takes it; the other replicas follow, least loaded first, as fallbacks.

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <fstream>
#include <limits>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "infer/engine/llm.hpp"
#include "infer/memory/prefix_hash.hpp"
#include "infer/serve/api_error.hpp"
#include "infer/serve/engine_worker.hpp"

namespace infer::serve {

/// One engine of a router config: what it loads, how to build it and how it takes requests.
struct EngineSpec {
  std::string name;
  LlmOptions llm;         ///< engine, block_size, engine_options (the infer-generate flags)
  WorkerOptions worker;   ///< max_waiting, stall timeout
  ModelSpec model;        ///< the model and backend (the command line's unless the entry names its own)
};

struct RouteRule {
  std::string engine;
  std::optional<std::int64_t> min_prompt_tokens, max_prompt_tokens;
  std::optional<std::int64_t> min_max_tokens, max_max_tokens;
  std::vector<std::string> keywords;  ///< any of them, case-insensitive, in the prompt text
  std::optional<std::string> endpoint;  ///< "completions" or "chat"
};

/// What a rule looks at.
struct RouteQuery {
  std::int64_t prompt_tokens = 0;       ///< the longest prompt of the request
  std::optional<std::int64_t> max_tokens;  ///< as the client asked (absent: the endpoint's default)
  std::string text;                     ///< prompt text (or the messages' contents), for keywords
  std::string endpoint;                 ///< "completions" or "chat"
  std::uint64_t prefix_key = 0;          ///< Router::prefix_key of the (first) prompt, for replica affinity
  std::vector<std::size_t> loads;        ///< each engine's outstanding requests (empty: unknown, no balancing)
};

struct RouterConfig {
  std::vector<EngineSpec> engines;
  std::vector<RouteRule> rules;
  std::string default_engine;
  std::vector<std::string> fallback;  ///< empty: every other engine, in config order
  std::vector<std::string> replicas;  ///< engines serving one model interchangeably (balanced; see the file comment)
};

/// `n` replicas of `base` ("replica-0" ... "replica-<n-1>"), balanced (infer-serve --data-parallel-size): on the
/// cuda backend replica i runs on device i (ModelSpec::device).
inline RouterConfig replica_config(const EngineSpec& base, int n, bool one_device_each) {
  RouterConfig c;
  for (int i = 0; i < n; ++i) {
    EngineSpec s = base;
    s.name = infer::detail::cat("replica-", i);
    s.worker.name = s.name;
    if (one_device_each) s.model.device = i;
    c.replicas.push_back(s.name);
    c.engines.push_back(std::move(s));
  }
  c.default_engine = c.engines.front().name;
  return c;
}

namespace detail {
inline std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}
}  // namespace detail

/// Reads a router config; InvalidArgument names the field (e.g. "router config: rules[1].engine 'x' is
/// not one of the engines"). `base` supplies what an engine entry leaves out (the command line's flags).
inline RouterConfig parse_router_config(const nlohmann::json& j, const EngineSpec& base) {
  using infer::detail::cat;
  auto fail = [](const std::string& m) -> void { throw InvalidArgument("router config: " + m); };
  if (!j.is_object()) fail("the config must be a JSON object");
  RouterConfig c;
  auto get_int = [&](const nlohmann::json& o, const char* key, const std::string& where) -> std::optional<std::int64_t> {
    if (!o.contains(key) || o[key].is_null()) return std::nullopt;
    if (!o[key].is_number_integer() && !o[key].is_number_unsigned()) fail(cat(where, ".", key, " must be an integer"));
    const auto v = o[key].get<std::int64_t>();
    if (v < 0 || v > std::numeric_limits<std::int32_t>::max()) fail(cat(where, ".", key, " = ", v, " is out of range"));
    return v;
  };
  auto get_str = [&](const nlohmann::json& o, const char* key, const std::string& where) -> std::optional<std::string> {
    if (!o.contains(key) || o[key].is_null()) return std::nullopt;
    if (!o[key].is_string()) fail(cat(where, ".", key, " must be a string"));
    return o[key].get<std::string>();
  };
  if (!j.contains("engines") || !j["engines"].is_array() || j["engines"].empty())
    fail("'engines' must be a non-empty array");
  static const std::vector<std::string> engine_keys{
      "name", "engine", "block_size", "kv_cache_memory", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
      "enable_prefix_caching", "max_waiting", "model", "dummy", "dummy_seed", "tokenizer", "backend", "quantizer",
      "gpu_memory_utilization", "max_batch", "max_input", "max_output"};
  for (std::size_t i = 0; i < j["engines"].size(); ++i) {
    const auto& e = j["engines"][i];
    const std::string where = cat("engines[", i, "]");
    if (!e.is_object()) fail(where + " must be an object");
    for (const auto& [k, v] : e.items())
      if (std::find(engine_keys.begin(), engine_keys.end(), k) == engine_keys.end())
        fail(cat(where, " has an unknown key '", k, "'"));  // a typo here would silently change the engine
    EngineSpec s = base;
    s.name = get_str(e, "name", where).value_or("");
    if (s.name.empty()) fail(where + ".name is required");
    for (const auto& other : c.engines)
      if (other.name == s.name) fail(cat(where, ".name '", s.name, "' is used twice"));
    s.worker.name = s.name;
    if (auto v = get_str(e, "engine", where)) s.llm.engine = *v;
    if (s.llm.engine != "paged" && s.llm.engine != "static")
      fail(cat(where, ".engine '", s.llm.engine, "' is unknown; choose paged or static"));
    if (auto v = get_int(e, "block_size", where)) s.llm.block_size = static_cast<std::int32_t>(*v);
    if (auto v = get_str(e, "kv_cache_memory", where)) s.llm.engine_options.kv_cache_bytes = parse_memory_size(*v, where + ".kv_cache_memory");
    if (auto v = get_int(e, "max_model_len", where)) s.llm.engine_options.max_model_len = static_cast<std::int32_t>(*v);
    if (auto v = get_int(e, "max_num_seqs", where)) s.llm.engine_options.scheduler.max_num_seqs = static_cast<std::int32_t>(*v);
    if (auto v = get_int(e, "max_num_batched_tokens", where))
      s.llm.engine_options.scheduler.max_num_batched_tokens = static_cast<std::int32_t>(*v);
    if (e.contains("enable_prefix_caching")) {
      if (!e["enable_prefix_caching"].is_boolean()) fail(where + ".enable_prefix_caching must be a boolean");
      s.llm.engine_options.enable_prefix_caching = e["enable_prefix_caching"].get<bool>();
    }
    if (auto v = get_int(e, "max_waiting", where)) {
      if (*v < 1) fail(where + ".max_waiting must be >= 1");
      s.worker.max_waiting = static_cast<std::size_t>(*v);
    }
    if (auto v = get_str(e, "quantizer", where)) s.llm.quantizer = *v;
    if (e.contains("gpu_memory_utilization")) {
      const auto& g = e["gpu_memory_utilization"];
      if (!g.is_number() || !(g.get<double>() > 0.0 && g.get<double>() <= 1.0))
        fail(where + ".gpu_memory_utilization must be a number in (0, 1]");
      s.llm.engine_options.gpu_memory_utilization = g.get<double>();
    }
    Shape& shape = s.llm.engine_options.static_shape;
    if (auto v = get_int(e, "max_batch", where)) shape.max_batch = static_cast<std::int32_t>(*v);
    if (auto v = get_int(e, "max_input", where)) shape.max_input = static_cast<std::int32_t>(*v);
    if (auto v = get_int(e, "max_output", where)) shape.max_output = static_cast<std::int32_t>(*v);
    // The model: an entry naming one replaces the command line's whole (a file or a dummy shape, with its
    // tokenizer and seed); the backend may be given alone.
    const auto model = get_str(e, "model", where), dummy = get_str(e, "dummy", where);
    const auto tokenizer = get_str(e, "tokenizer", where);
    const auto seed = get_int(e, "dummy_seed", where);
    if (model && dummy) fail(where + " gives both 'model' and 'dummy'; give one");
    if ((tokenizer || seed) && !dummy) fail(where + ".tokenizer and .dummy_seed go with 'dummy'");
    if (model || dummy) {
      s.model = ModelSpec{.backend = s.model.backend};
      if (model) s.model.model = *model;
      if (dummy) s.model.dummy = *dummy;
      if (tokenizer) s.model.tokenizer = *tokenizer;
      if (seed) s.model.dummy_seed = static_cast<std::uint64_t>(*seed);
    }
    const auto backend = get_str(e, "backend", where);
    if (backend) s.model.backend = *backend;
    try {  // what the command line gave was checked there; the entry's own choices are checked here
      if (model || dummy || backend) s.model.validate();
      if (s.model.backend != "auto") check_engine_choice(s.model.backend, s.llm);
    } catch (const InvalidArgument& err) {
      fail(cat(where, ": ", err.what()));
    }
    c.engines.push_back(std::move(s));
  }
  auto known = [&](const std::string& name) {
    return std::any_of(c.engines.begin(), c.engines.end(), [&](const EngineSpec& s) { return s.name == name; });
  };
  if (j.contains("rules")) {
    if (!j["rules"].is_array()) fail("'rules' must be an array");
    for (std::size_t i = 0; i < j["rules"].size(); ++i) {
      const auto& r = j["rules"][i];
      const std::string where = cat("rules[", i, "]");
      if (!r.is_object()) fail(where + " must be an object");
      RouteRule rule;
      rule.engine = get_str(r, "engine", where).value_or("");
      if (!known(rule.engine)) fail(cat(where, ".engine '", rule.engine, "' is not one of the engines"));
      rule.min_prompt_tokens = get_int(r, "min_prompt_tokens", where);
      rule.max_prompt_tokens = get_int(r, "max_prompt_tokens", where);
      rule.min_max_tokens = get_int(r, "min_max_tokens", where);
      rule.max_max_tokens = get_int(r, "max_max_tokens", where);
      rule.endpoint = get_str(r, "endpoint", where);
      if (rule.endpoint && *rule.endpoint != "chat" && *rule.endpoint != "completions")
        fail(cat(where, ".endpoint '", *rule.endpoint, "' is unknown; use chat or completions"));
      if (r.contains("keywords")) {
        if (!r["keywords"].is_array()) fail(where + ".keywords must be an array of strings");
        for (const auto& k : r["keywords"]) {
          if (!k.is_string() || k.get<std::string>().empty()) fail(where + ".keywords must be non-empty strings");
          rule.keywords.push_back(detail::lower(k.get<std::string>()));
        }
      }
      c.rules.push_back(std::move(rule));
    }
  }
  if (j.contains("replicas")) {
    if (!j["replicas"].is_array()) fail("'replicas' must be an array of engine names");
    for (const auto& f : j["replicas"]) {
      if (!f.is_string() || !known(f.get<std::string>())) fail(cat("replicas entry ", f.dump(), " is not one of the engines"));
      c.replicas.push_back(f.get<std::string>());
    }
  }
  c.default_engine = get_str(j, "default", "config").value_or(c.engines.front().name);
  if (!known(c.default_engine)) fail(cat("default '", c.default_engine, "' is not one of the engines"));
  if (j.contains("fallback")) {
    if (!j["fallback"].is_array()) fail("'fallback' must be an array of engine names");
    for (const auto& f : j["fallback"]) {
      if (!f.is_string() || !known(f.get<std::string>())) fail(cat("fallback entry ", f.dump(), " is not one of the engines"));
      c.fallback.push_back(f.get<std::string>());
    }
  }
  return c;
}

inline RouterConfig read_router_config(const std::string& path, const EngineSpec& base) {
  std::ifstream in(path);
  if (!in) throw IoError("cannot read router config '" + path + "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(infer::detail::cat("router config '", path, "' is not valid JSON: ", e.what()));
  }
  return parse_router_config(j, base);
}

/// Where two engines' tokenizers differ (the vocabulary size, a token's bytes, an added token), or nothing
/// when they are the same: a router's engines take the ids the server tokenized once, so they must agree.
inline std::optional<std::string> tokenizer_difference(const Tokenizer& a, const Tokenizer& b) {
  using infer::detail::cat;
  if (a.vocab_size() != b.vocab_size()) return cat("vocabulary of ", a.vocab_size(), " vs ", b.vocab_size(), " tokens");
  for (std::size_t id = 0; id < a.vocab_size(); ++id) {
    const auto i = static_cast<std::int32_t>(id);
    if (a.token_bytes(i) != b.token_bytes(i)) return cat("token ", id, " differs");
  }
  const auto &x = a.added_tokens(), &y = b.added_tokens();
  if (x.size() != y.size()) return cat(x.size(), " vs ", y.size(), " added tokens");
  for (std::size_t k = 0; k < x.size(); ++k)
    if (x[k].id != y[k].id || x[k].content != y[k].content) return cat("added token '", x[k].content, "' differs");
  return std::nullopt;
}

/// The decision: which engines to try, in order. Indices into config.engines.
class Router {
 public:
  explicit Router(RouterConfig config) : config_(std::move(config)) {}

  [[nodiscard]] const RouterConfig& config() const noexcept { return config_; }

  [[nodiscard]] static bool matches(const RouteRule& r, const RouteQuery& q) {
    if (r.min_prompt_tokens && q.prompt_tokens < *r.min_prompt_tokens) return false;
    if (r.max_prompt_tokens && q.prompt_tokens > *r.max_prompt_tokens) return false;
    if (r.min_max_tokens && (!q.max_tokens || *q.max_tokens < *r.min_max_tokens)) return false;
    if (r.max_max_tokens && (!q.max_tokens || *q.max_tokens > *r.max_max_tokens)) return false;
    if (r.endpoint && *r.endpoint != q.endpoint) return false;
    if (!r.keywords.empty()) {
      const std::string text = detail::lower(q.text);
      if (std::none_of(r.keywords.begin(), r.keywords.end(),
                       [&](const std::string& k) { return text.find(k) != std::string::npos; }))
        return false;
    }
    return true;
  }

  /// Prompt tokens a replica's affinity looks at: two KV blocks of 16, a system prompt's worth.
  static constexpr std::size_t kAffinityTokens = 32;
  /// Requests outstanding beyond the least loaded replica's that the affine replica may have and still take one.
  static constexpr std::size_t kAffinitySlack = 2;

  /// The affinity key of a prompt: a hash (FNV-1a) of its first kAffinityTokens tokens.
  [[nodiscard]] static std::uint64_t prefix_key(std::span<const std::int32_t> prompt) noexcept {
    return hash_block(kPrefixHashSeed, prompt.first(std::min<std::size_t>(prompt.size(), kAffinityTokens)));
  }

  /// The engine the rules pick (among replicas, the balanced one), then the fallbacks.
  [[nodiscard]] std::vector<std::size_t> candidates(const RouteQuery& q) const {
    std::string first = config_.default_engine;
    for (const auto& r : config_.rules)
      if (matches(r, q)) {
        first = r.engine;
        break;
      }
    std::vector<std::size_t> out;
    auto add = [&](std::size_t i) {
      if (std::find(out.begin(), out.end(), i) == out.end()) out.push_back(i);
    };
    const bool replica = std::find(config_.replicas.begin(), config_.replicas.end(), first) != config_.replicas.end();
    if (replica && q.loads.size() == config_.engines.size()) {
      for (const std::size_t i : balanced(q)) add(i);
    } else {
      add(index_of(first));
    }
    if (config_.fallback.empty()) {
      for (std::size_t i = 0; i < config_.engines.size(); ++i) add(i);
    } else {
      for (const auto& f : config_.fallback) add(index_of(f));
    }
    return out;
  }

  /// The replicas in the order to try them: the affine one unless it is loaded beyond the slack, then the rest,
  /// least loaded first (ties in config order).
  [[nodiscard]] std::vector<std::size_t> balanced(const RouteQuery& q) const {
    std::vector<std::size_t> r;
    for (const auto& name : config_.replicas) r.push_back(index_of(name));
    std::stable_sort(r.begin(), r.end(), [&](std::size_t a, std::size_t b) { return q.loads[a] < q.loads[b]; });
    const std::size_t affine = index_of(config_.replicas[q.prefix_key % config_.replicas.size()]);
    if (q.loads[affine] <= q.loads[r.front()] + kAffinitySlack) {
      r.erase(std::find(r.begin(), r.end(), affine));
      r.insert(r.begin(), affine);
    }
    return r;
  }

  [[nodiscard]] std::size_t index_of(const std::string& name) const {
    for (std::size_t i = 0; i < config_.engines.size(); ++i)
      if (config_.engines[i].name == name) return i;
    throw NotFoundError("router: no engine named '" + name + "'");
  }

 private:
  RouterConfig config_;
};

}  // namespace infer::serve
