#pragma once
/// \file
/// `OpenAIServer`: the OpenAI-compatible endpoints over one or more `EngineWorker`s and a `Router`.
///
///   POST /v1/completions, /v1/chat/completions   JSON or server-sent events (`"stream": true`)
///   GET  /v1/models, /health, /metrics, /version, /openapi.json
///   POST /tokenize, /detokenize                  vLLM's extensions
///
/// Three layers, a file each: the transport (http_transport.hpp) owns the sockets — one event loop, the
/// deadlines, the connection cap; the routes (http_routes.hpp) pick the handler, check the API key and
/// count every status; this file is what the endpoints mean. A handler parses and validates the body
/// (protocol.hpp) and tokenizes on a handler thread (the tokenizer is thread-safe), asks the router for
/// candidate engines, and answers completions and chat with an `EngineResponse` (engine_response.hpp):
/// admission with fallback, then the output as server-sent events or one body, with no thread waiting on
/// it. A client that hangs up — streaming or not, queued, prefilling or decoding — cancels it, and the
/// engine thread frees its KV blocks at its next turn.
///
/// A text prompt that cannot fit the context is refused from its length in bytes before it is tokenized:
/// no token of the model is longer than `max_token_bytes`, so a prompt of B bytes has at least
/// B / max_token_bytes tokens. A multi-megabyte prompt then costs its body and one scan, not a tokenization.
///
/// With `test_hooks` (--enable-test-hooks, for tests only) two more routes hold and release every
/// engine's loop (EngineWorker::hold): `POST /debug/hold` answers once every loop is parked, so a test
/// waits for the state instead of sleeping; `POST /debug/release` lets them go on. They are not in
/// /openapi.json and need no API key: a server that has them must not face the network.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "infer/serve/api_error.hpp"
#include "infer/serve/engine_response.hpp"
#include "infer/serve/engine_worker.hpp"
#include "infer/serve/exchange.hpp"
#include "infer/serve/http_routes.hpp"
#include "infer/serve/http_transport.hpp"
#include "infer/serve/metrics.hpp"
#include "infer/serve/openai_format.hpp"
#include "infer/serve/openapi.hpp"
#include "infer/serve/protocol.hpp"
#include "infer/serve/router.hpp"
#include "infer/version.hpp"

namespace infer::serve {

struct ServerOptions {
  TransportOptions http;                     ///< address, connection cap, deadlines, handler threads, body limit
  std::string api_key;                       ///< empty: no authentication
  std::vector<std::string> served_model_names;  ///< the names clients may send as `model`; the first is reported
  std::string model_path;                    ///< shown as the model's `root` in /v1/models
  std::string chat_template;                 ///< a built-in template name instead of the model's own
  /// Choices one request may ask for (prompts × n): what one client can make the engine generate at
  /// once. 400 beyond; /openapi.json states the bound on n.
  std::size_t max_choices = RequestLimits::max_choices;
  std::chrono::milliseconds admission_timeout{30000};  ///< longest wait for an engine thread to admit
  bool test_hooks = false;                   ///< POST /debug/hold and /debug/release (tests only)
};

class OpenAIServer {
 public:
  /// `workers[i]` serves `router.config().engines[i]`. The server does not own the workers.
  OpenAIServer(ServerOptions options, Router router, std::vector<EngineWorker*> workers)
      : o_(std::move(options)), router_(std::move(router)), workers_(std::move(workers)), started_(unix_time_now()),
        routes_(o_.api_key), transport_(o_.http, routes_) {
    require<InvalidArgument>(!workers_.empty() && workers_.size() == router_.config().engines.size(),
                             "OpenAIServer: one worker per router engine is needed");
    require<InvalidArgument>(!o_.served_model_names.empty(), "OpenAIServer: at least one served model name is needed");
    require<InvalidArgument>(o_.http.handler_threads >= 1, "handler_threads = 0: at least one is needed");
    require<InvalidArgument>(o_.http.max_connections >= 1, "max_connections = 0: at least one is needed");
    require<InvalidArgument>(o_.max_choices >= 1 && o_.max_choices <= RequestLimits::max_choices, "max_choices = ",
                             o_.max_choices, " must be in [1, ", RequestLimits::max_choices, "]");
    add_routes();
  }

  /// Binds the socket; false (with the reason in `error`) when the address is taken or invalid.
  bool bind(std::string* error = nullptr) { return transport_.bind(error); }
  [[nodiscard]] int port() const noexcept { return transport_.port(); }
  /// Serves on the calling thread until stop() has ended every connection.
  void serve() { transport_.serve(); }
  /// Closes the listener; responses in progress may finish (within the transport's stop_grace).
  void stop() { transport_.stop(); }

  /// What `serve()` needs to know when draining: requests outstanding on every engine.
  [[nodiscard]] std::size_t outstanding() const {
    std::size_t n = 0;
    for (auto* w : workers_) n += w->outstanding();
    return n;
  }

  /// The /metrics text (also what the tests read).
  [[nodiscard]] std::string metrics_text() const {
    PrometheusWriter w;
    for (auto* wk : workers_) {
      const Labels l{{"engine", wk->name()}, {"model_name", o_.served_model_names.front()}};
      const WorkerSnapshot s = wk->snapshot();
      const Health h = wk->health();
      w.gauge("infer:engine_healthy", "1 when the engine is loaded and making progress", l, h.ok ? 1 : 0);
      w.gauge("infer:num_requests_running", "Requests whose sequences the scheduler runs", l, static_cast<double>(s.running));
      w.gauge("infer:num_requests_waiting", "Requests waiting for a slot (queued or in the scheduler)", l,
              static_cast<double>(s.waiting));
      const double usage = s.kv.total_blocks ? static_cast<double>(s.kv.used_blocks) / s.kv.total_blocks : 0.0;
      w.gauge("infer:kv_cache_usage_perc", "KV-cache usage: blocks held by sequences / all blocks (0..1)", l, usage);
      w.gauge("infer:kv_cache_used_blocks", "KV blocks held by live sequences", l, s.kv.used_blocks);
      w.gauge("infer:kv_cache_total_blocks", "KV blocks in the pool", l, s.kv.total_blocks);
      w.gauge("infer:kv_cache_cached_blocks", "Free KV blocks that still hold a reusable prefix", l, s.kv.cached_blocks);
      w.counter("infer:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache", l,
                static_cast<double>(s.kv.prefix_queried_tokens));
      w.counter("infer:prefix_cache_hits_total", "Prompt tokens found in the prefix cache", l,
                static_cast<double>(s.kv.prefix_hit_tokens));
      w.gauge("infer:prefix_cache_hit_rate", "prefix_cache_hits_total / prefix_cache_queries_total", l,
              s.kv.prefix_queried_tokens ? static_cast<double>(s.kv.prefix_hit_tokens) / static_cast<double>(s.kv.prefix_queried_tokens) : 0.0);
      w.counter("infer:prompt_tokens_total", "Prompt tokens of admitted requests", l, static_cast<double>(s.stats.prompt_tokens));
      w.counter("infer:generation_tokens_total", "Generated tokens", l, static_cast<double>(s.stats.generated_tokens));
      w.counter("infer:num_preemptions_total", "Sequences preempted (recomputed later)", l,
                static_cast<double>(s.stats.preemptions));
      w.counter("infer:engine_steps_total", "Engine steps run", l, static_cast<double>(s.stats.steps));
      w.gauge("infer:engine_seconds_since_progress", "Seconds since the engine loop last went round", l,
              s.seconds_since_progress);
      auto& m = wk->metrics();
      for (const auto& [reason, n] : m.finished.snapshot()) {
        Labels lr = l;
        lr.emplace_back("finished_reason", reason);
        w.counter("infer:request_success_total", "Requests finished, by finish reason", lr, static_cast<double>(n));
      }
      for (const auto& [reason, n] : m.rejected.snapshot()) {
        Labels lr = l;
        lr.emplace_back("reason", reason);
        w.counter("infer:requests_rejected_total", "Requests refused before running, by reason", lr, static_cast<double>(n));
      }
      w.histogram("infer:time_to_first_token_seconds", "Time from submission to the first token", l, m.ttft.snapshot());
      w.histogram("infer:inter_token_latency_seconds", "Time between consecutive tokens of a request", l, m.itl.snapshot());
      w.histogram("infer:e2e_request_latency_seconds", "Time from submission to the end of a request", l, m.e2e.snapshot());
      w.counter("infer:router_requests_total", "Requests served, by the engine that served them", {{"engine", wk->name()}},
                static_cast<double>(routing_.routed.get(wk->name())));
    }
    for (const auto& [edge, n] : routing_.fallbacks.snapshot())
      w.counter("infer:router_fallbacks_total", "Requests that an engine refused and another served (from->to)",
                {{"route", edge}}, static_cast<double>(n));
    for (const auto& [key, n] : routes_.counts()) {
      const auto sep = key.find(' ');
      w.counter("infer:http_requests_total", "HTTP responses, by route and status",
                {{"route", key.substr(sep + 1)}, {"status", key.substr(0, sep)}}, static_cast<double>(n));
    }
    w.gauge("infer:http_open_connections", "Client connections open now", {},
            static_cast<double>(transport_.open_connections()));
    return w.str();
  }

 private:
  // ---- plumbing ----------------------------------------------------------------------------------------

  static HttpResponse json_response(const json& body) {
    HttpResponse r;
    r.body = dump_body(body);
    return r;
  }

  /// The served name of the request's model; 404 for a name the server does not serve.
  std::string check_model(const std::optional<std::string>& model) const {
    if (!model) return o_.served_model_names.front();
    for (const auto& n : o_.served_model_names)
      if (*model == n) return n;
    throw NotFound("model", "model_not_found",
                   infer::detail::cat("The model '", *model, "' does not exist; this server serves '",
                                      o_.served_model_names.front(), "'"));
  }

  void check_choices(std::size_t prompts, std::int32_t n) const {
    const std::size_t choices = prompts * static_cast<std::size_t>(n);
    if (choices > o_.max_choices)
      throw ParamError("n", infer::detail::cat(prompts > 1 ? infer::detail::cat(prompts, " prompts × n = ", n) : infer::detail::cat("n = ", n),
                                               " would make ", choices, " choices; this server allows at most ",
                                               o_.max_choices, " per request"));
  }

  EngineWorker& primary() const { return *workers_.front(); }

  /// Any loaded engine's tokenizer (a router's engines read one: infer-serve checks); ServiceError while none is loaded.
  const Tokenizer& tokenizer() const {
    std::optional<ServiceError> err;
    for (auto* w : workers_) {
      try {
        if (const Tokenizer* t = w->tokenizer()) return *t;
        throw InvalidArgument("this model has no tokenizer: send token ids to /v1/completions");
      } catch (const ServiceError& e) {
        if (!err) err = e;
      }
    }
    throw *err;
  }

  /// The most bytes of text one token stands for: its bytes, or an added token's literal text, which a
  /// prompt may spell out (computed once).
  std::size_t max_token_bytes() const {
    std::call_once(longest_once_, [&] {
      const Tokenizer& tok = tokenizer();
      std::size_t longest = 1;
      for (std::size_t id = 0; id < tok.vocab_size(); ++id)
        longest = std::max(longest, tok.token_bytes(static_cast<std::int32_t>(id)).size());
      for (const auto& added : tok.added_tokens()) longest = std::max(longest, added.content.size());
      longest_ = longest;
    });
    return longest_;
  }

  /// Refuses text that has more tokens than any engine's context, judged from its length alone: at
  /// least bytes / max_token_bytes tokens (`what` names the field, as resolve_max_tokens does).
  void check_text_fits(std::size_t bytes, const std::string& param, const char* what) const {
    std::int32_t context = 0;
    for (auto* w : workers_) {
      try {
        context = std::max(context, w->info().max_model_len);
      } catch (const ServiceError&) {
      }
    }
    const std::size_t longest = max_token_bytes();
    if (context == 0 || bytes / longest < static_cast<std::size_t>(context)) return;
    throw ParamError(param, infer::detail::cat("This model's maximum context length is ", context, " tokens. However, your ",
                                               what, " is ", bytes, " bytes: at least ", bytes / longest,
                                               " tokens, as no token of this model is longer than ", longest,
                                               " bytes. Please shorten the ", what, "."));
  }

  ChatTemplate chat_template() const {
    std::lock_guard lock(template_mu_);
    if (!template_) {
      template_ = o_.chat_template.empty() ? ChatTemplate::from_source(tokenizer().chat_template_source())
                                           : ChatTemplate::from_name(o_.chat_template);
    }
    return *template_;
  }

  std::vector<std::int32_t> encode_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                        bool check_fits) const {
    const std::string rendered = chat_template().apply(messages, add_generation_prompt);
    if (check_fits) check_text_fits(rendered.size(), "messages", "messages");
    EncodeOptions opts;
    opts.add_bos = false;  // a rendered chat carries its own BOS text (as infer::LLM::encode_chat)
    return tokenizer().encode(rendered, opts);
  }

  /// What both endpoints' exchanges are set up with, from a parsed completion or chat request (the
  /// engine's tokenizer is added when an engine admits it).
  template <class Request>
  static ExchangeSetup exchange_setup(const Request& r, bool chat, const std::string& model,
                                      const std::vector<std::vector<std::int32_t>>& prompts) {
    ExchangeSetup s;
    s.chat = chat;
    s.stream = r.stream;
    s.stream_options = r.stream_options;
    s.logprobs = r.logprobs;
    s.top_logprobs = r.params.logprobs.value_or(0);
    s.n = r.params.n;
    s.id = make_response_id(chat ? "chatcmpl" : "cmpl");
    s.model = model;
    s.created = unix_time_now();
    for (const auto& p : prompts) s.prompt_tokens.push_back(static_cast<std::int32_t>(p.size()));
    return s;
  }

  /// The response to a generation request: the engines' output once one admits it.
  HttpResponse generate(EngineRequest r) {
    HttpResponse res;
    res.source = std::make_shared<EngineResponse>(std::move(r), workers_, o_.admission_timeout, routing_);
    return res;
  }

  // ---- endpoints -----------------------------------------------------------------------------------

  HttpResponse completions(const HttpRequest& req) {
    const CompletionRequest r = parse_completion_request(parse_json_body(req.body));
    const std::string model = check_model(r.model);
    check_choices(r.prompts.size(), r.params.n);
    std::vector<std::vector<std::int32_t>> prompts;
    std::vector<std::string> echo;
    RouteQuery q;
    q.endpoint = "completions";
    q.max_tokens = r.max_tokens;
    const Tokenizer* tok = nullptr;
    for (std::size_t i = 0; i < r.prompts.size(); ++i) {
      const PromptInput& p = r.prompts[i];
      const std::string param = r.prompts.size() == 1 ? "prompt" : infer::detail::cat("prompt[", i, "]");
      if (p.text) {
        if (!tok) tok = &tokenizer();
        check_text_fits(p.text->size(), param, "prompt");
        try {
          prompts.push_back(tok->encode(*p.text));
        } catch (const Error& e) {
          throw ParamError(param, e.what());
        }
        if (prompts.back().empty())
          throw ParamError("prompt", "the prompt is empty after tokenization; give at least one token");
        q.text += *p.text + "\n";
      } else {
        prompts.push_back(p.ids);
      }
      q.prompt_tokens = std::max<std::int64_t>(q.prompt_tokens, static_cast<std::int64_t>(prompts.back().size()));
    }
    if (r.echo) {
      for (std::size_t i = 0; i < r.prompts.size(); ++i) {
        if (r.prompts[i].text) echo.push_back(*r.prompts[i].text);
        else {
          if (!tok) tok = &tokenizer();
          check_token_ids(r.prompts[i].ids, static_cast<std::int64_t>(tok->vocab_size()), "prompt");
          echo.push_back(tok->decode(r.prompts[i].ids));
        }
      }
    }
    std::vector<std::size_t> candidates = route(q, prompts.front());
    EngineRequest e{std::move(prompts), r, /*chat=*/false, std::move(candidates), {}};
    e.setup = exchange_setup(r, /*chat=*/false, model, e.prompts);
    e.setup.echo = std::move(echo);
    return generate(std::move(e));
  }

  HttpResponse chat_completions(const HttpRequest& req) {
    const ChatRequest r = parse_chat_request(parse_json_body(req.body));
    const std::string model = check_model(r.model);
    check_choices(1, r.params.n);
    std::vector<std::vector<std::int32_t>> prompts{encode_chat(r.messages, r.add_generation_prompt, /*check_fits=*/true)};
    RouteQuery q;
    q.endpoint = "chat";
    q.max_tokens = r.max_tokens;
    q.prompt_tokens = static_cast<std::int64_t>(prompts[0].size());
    for (const auto& m : r.messages) q.text += m.content + "\n";
    std::vector<std::size_t> candidates = route(q, prompts.front());
    EngineRequest e{std::move(prompts), r, /*chat=*/true, std::move(candidates), {}};
    e.setup = exchange_setup(r, /*chat=*/true, model, e.prompts);
    return generate(std::move(e));
  }

  /// The router's candidates for q, with what replicas are balanced by: the prompt's affinity key and each
  /// engine's outstanding requests now.
  std::vector<std::size_t> route(RouteQuery& q, std::span<const std::int32_t> prompt) const {
    if (!router_.config().replicas.empty()) {
      q.prefix_key = Router::prefix_key(prompt);
      q.loads.clear();
      for (const EngineWorker* w : workers_) q.loads.push_back(w->outstanding());
    }
    return router_.candidates(q);
  }

  HttpResponse models() const {
    json data = json::array();
    std::optional<std::int32_t> max_len;
    try {
      max_len = primary().info().max_model_len;
    } catch (const ServiceError&) {
    }
    for (const auto& n : o_.served_model_names)
      data.push_back({{"id", n}, {"object", "model"}, {"created", started_}, {"owned_by", "infer"},
                      {"root", o_.model_path}, {"parent", nullptr},
                      {"max_model_len", max_len ? json(*max_len) : json(nullptr)}});
    return json_response(json{{"object", "list"}, {"data", data}});
  }

  HttpResponse health() const {
    for (auto* w : workers_) {
      const Health h = w->health();
      if (!h.ok)
        return error_response(ApiError::unavailable(infer::detail::cat("engine '", w->name(), "': ", h.message), h.code,
                                                    h.code == "engine_stalled" ? 1 : 5));
    }
    return json_response(json{{"status", "ok"}});
  }

  HttpResponse tokenize(const HttpRequest& req) const {
    const TokenizeRequest r = parse_tokenize_request(parse_json_body(req.body));
    check_model(r.model);
    std::vector<std::int32_t> ids;
    const Tokenizer& tok = tokenizer();
    try {
      if (r.prompt) {
        EncodeOptions opts;
        if (!r.add_special_tokens) opts.add_bos = false;
        ids = tok.encode(*r.prompt, opts);
      } else {
        ids = encode_chat(r.messages, r.add_generation_prompt, /*check_fits=*/false);
      }
    } catch (const TokenizerError& e) {
      throw ParamError(r.prompt ? "prompt" : "messages", e.what());
    }
    json out{{"count", ids.size()}, {"max_model_len", primary().info().max_model_len}, {"tokens", ids}};
    if (r.return_token_strs) {
      json strs = json::array();
      for (auto id : ids) strs.push_back(token_text(&tok, id));
      out["token_strs"] = strs;
    }
    return json_response(out);
  }

  HttpResponse detokenize(const HttpRequest& req) const {
    const DetokenizeRequest r = parse_detokenize_request(parse_json_body(req.body));
    check_model(r.model);
    const Tokenizer& tok = tokenizer();
    check_token_ids(r.tokens, static_cast<std::int64_t>(tok.vocab_size()), "tokens");
    return json_response(json{{"prompt", tok.decode(r.tokens)}});
  }

  /// POST /debug/hold: parks every engine's loop; 200 once all are parked (within admission_timeout,
  /// the same bound as for the engine thread taking a request), else 503 with the hold still asked for.
  HttpResponse debug_hold() {
    json held = json::array();
    for (auto* w : workers_) w->hold();
    for (auto* w : workers_) {
      if (!w->wait_held(o_.admission_timeout))
        throw HttpError(ApiError::unavailable(infer::detail::cat("engine '", w->name(), "' did not park within ",
                                                                 o_.admission_timeout.count(), " ms"),
                                              "hold_timeout", 1));
      held.push_back(w->name());
    }
    return json_response(json{{"held", held}});
  }

  HttpResponse debug_release() {
    json released = json::array();
    for (auto* w : workers_) {
      w->release();
      released.push_back(w->name());
    }
    return json_response(json{{"released", released}});
  }

  void add_routes() {
    auto post = [&](const char* path, auto f) { routes_.add("POST", path, [this, f](const HttpRequest& r) { return (this->*f)(r); }); };
    post("/v1/completions", &OpenAIServer::completions);
    post("/v1/chat/completions", &OpenAIServer::chat_completions);
    post("/tokenize", &OpenAIServer::tokenize);
    post("/detokenize", &OpenAIServer::detokenize);
    routes_.add("GET", "/v1/models", [this](const HttpRequest&) { return models(); });
    routes_.add("GET", "/health", [this](const HttpRequest&) { return health(); });
    routes_.add("GET", "/metrics", [this](const HttpRequest&) {
      HttpResponse r;
      r.content_type = "text/plain; version=0.0.4; charset=utf-8";
      r.body = metrics_text();
      return r;
    });
    routes_.add("GET", "/version", [](const HttpRequest&) { return json_response(json{{"version", INFER_VERSION}}); });
    routes_.add("GET", "/openapi.json", [this](const HttpRequest&) {
      return json_response(openapi_document(INFER_VERSION, !o_.api_key.empty(), static_cast<std::int64_t>(o_.max_choices)));
    });
    if (o_.test_hooks) {
      routes_.add("POST", "/debug/hold", [this](const HttpRequest&) { return debug_hold(); });
      routes_.add("POST", "/debug/release", [this](const HttpRequest&) { return debug_release(); });
    }
  }

  ServerOptions o_;
  Router router_;
  std::vector<EngineWorker*> workers_;
  std::int64_t started_;
  mutable std::mutex template_mu_;
  mutable std::optional<ChatTemplate> template_;
  mutable std::once_flag longest_once_;
  mutable std::size_t longest_ = 1;
  RoutingCounters routing_;
  HttpRoutes routes_;
  HttpTransport transport_;  ///< last: its threads stop before the rest goes
};

}  // namespace infer::serve
