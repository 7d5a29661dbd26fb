#pragma once
/// \file
/// `OpenAIServer`: the HTTP layer (cpp-httplib) over one or more `EngineWorker`s and a `Router`.
///
///   POST /v1/completions, /v1/chat/completions   JSON or server-sent events (`"stream": true`)
///   GET  /v1/models, /health, /metrics, /version, /openapi.json
///   POST /tokenize, /detokenize                  vLLM's extensions
///
/// A handler parses and validates the body (protocol.hpp), tokenizes on its own thread (the tokenizer is
/// thread-safe), asks the router for candidate engines, submits to the first that admits the request,
/// and answers through a chunked content provider that polls the request's streams. httplib calls the
/// provider only while the client's socket is alive (`is_writable` checks it), and destroys it when
/// the connection ends: the `Exchange` it owns then cancels whatever has not finished, so a client that
/// hangs up — streaming or not, waiting or running — aborts its requests and frees their KV blocks.
///
/// Every error body has OpenAI's shape (api_error.hpp), including the ones httplib produces itself
/// (404 for an unknown route, 413 for an oversized body), which the error handler rewrites.
/// Only /v1/* needs the API key, as in vLLM: probes and scrapers reach /health and /metrics without it.
///
/// With `test_hooks` (--enable-test-hooks, for tests only) two more routes hold and release every
/// engine's loop (EngineWorker::hold): `POST /debug/hold` answers once every loop is parked, so a test
/// waits for the state instead of sleeping; `POST /debug/release` lets them go on. They are not in
/// /openapi.json and need no API key: a server that has them must not face the network.

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "infer/serve/api_error.hpp"
#include "infer/serve/engine_worker.hpp"
#include "infer/serve/exchange.hpp"
#include "infer/serve/metrics.hpp"
#include "infer/serve/openai_format.hpp"
#include "infer/serve/openapi.hpp"
#include "infer/serve/protocol.hpp"
#include "infer/serve/router.hpp"
#include "infer/version.hpp"

namespace infer::serve {

namespace detail {
/// httplib's server with a listen backlog fit for bursts. cpp-httplib 0.11 listens with a backlog of 5
/// (CPPHTTPLIB_LISTEN_BACKLOG, compiled into Debian's library): when more connections than that arrived
/// while the accept thread waited for a core, the kernel dropped their handshakes (TcpExtListenOverflows):
/// clients waited for SYN-ACK retransmits (1 s, 3 s, ...) and some were reset. 32 streams opened at once
/// on 2 cores hit it about one time in five. listen() on a listening socket changes only its backlog.
class HttpServer : public httplib::Server {
 public:
  bool raise_backlog(int backlog) { return ::listen(svr_sock_, backlog) == 0; }
};
}  // namespace detail

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                           ///< 0: any free port (see OpenAIServer::port())
  std::string api_key;                       ///< empty: no authentication
  std::vector<std::string> served_model_names;  ///< the names clients may send as `model`; the first is reported
  std::string model_path;                    ///< shown as the model's `root` in /v1/models
  std::string chat_template;                 ///< a built-in template name instead of the model's own
  std::size_t max_body_bytes = std::size_t{4} << 20;
  /// Choices one request may ask for (prompts × n): what one client can make the engine generate at
  /// once. 400 beyond; /openapi.json states the bound on n.
  std::size_t max_choices = RequestLimits::max_choices;
  std::size_t http_threads = 128;            ///< connections served at once (each stream holds one)
  int keep_alive_timeout_s = 5;
  std::chrono::milliseconds admission_timeout{30000};  ///< longest wait for the engine thread to admit
  std::chrono::milliseconds poll_interval{50};          ///< how often a waiting response checks its client
  bool test_hooks = false;                   ///< POST /debug/hold and /debug/release (tests only)
};

class OpenAIServer {
 public:
  /// `workers[i]` serves `router.config().engines[i]`. The server does not own the workers.
  OpenAIServer(ServerOptions options, Router router, std::vector<EngineWorker*> workers)
      : o_(std::move(options)), router_(std::move(router)), workers_(std::move(workers)), started_(unix_time_now()) {
    require<InvalidArgument>(!workers_.empty() && workers_.size() == router_.config().engines.size(),
                             "OpenAIServer: one worker per router engine is needed");
    require<InvalidArgument>(!o_.served_model_names.empty(), "OpenAIServer: at least one served model name is needed");
    require<InvalidArgument>(o_.http_threads >= 2, "http_threads = ", o_.http_threads, " must be >= 2");
    require<InvalidArgument>(o_.max_choices >= 1 && o_.max_choices <= RequestLimits::max_choices, "max_choices = ",
                             o_.max_choices, " must be in [1, ", RequestLimits::max_choices, "]");
    routes();
  }

  /// Binds the socket; false when the address is taken or invalid.
  bool bind() {
    if (o_.port == 0) {
      port_ = svr_.bind_to_any_port(o_.host);
      if (port_ <= 0) return false;
    } else {
      port_ = o_.port;
      if (!svr_.bind_to_port(o_.host, o_.port)) return false;
    }
    return svr_.raise_backlog(SOMAXCONN);
  }
  [[nodiscard]] int port() const noexcept { return port_; }
  /// Serves until stop(); returns false when the listener failed.
  bool serve() { return svr_.listen_after_bind(); }
  /// Closes the listener, waits for the handler threads to end.
  void stop() { svr_.stop(); }
  [[nodiscard]] bool running() const { return svr_.is_running(); }

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
                static_cast<double>(routed_.get(wk->name())));
    }
    for (const auto& [edge, n] : fallbacks_.snapshot())
      w.counter("infer:router_fallbacks_total", "Requests that an engine refused and another served (from->to)",
                {{"route", edge}}, static_cast<double>(n));
    for (const auto& [key, n] : http_.snapshot()) {
      const auto sep = key.find(' ');
      w.counter("infer:http_requests_total", "HTTP responses, by route and status",
                {{"route", key.substr(sep + 1)}, {"status", key.substr(0, sep)}}, static_cast<double>(n));
    }
    return w.str();
  }

 private:
  // ---- plumbing ----------------------------------------------------------------------------------------

  static void send_error(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    if (e.retry_after_s) res.set_header("Retry-After", std::to_string(*e.retry_after_s));
    if (e.status == 401) res.set_header("WWW-Authenticate", "Bearer");
    res.set_content(e.body(), "application/json");
  }

  template <class F>
  auto guarded(const char* route, F&& f) {
    return [this, route, f = std::forward<F>(f)](const httplib::Request& req, httplib::Response& res) {
      try {
        f(req, res);
      } catch (const std::exception& e) {
        send_error(res, to_api_error(e));
      }
      // httplib fills in 200 after the handler when it set no status (and for every streamed body).
      http_.add(std::to_string(res.status == -1 ? 200 : res.status) + " " + route);
    };
  }

  static json parse_body(const httplib::Request& req) {
    try {
      return json::parse(req.body);
    } catch (const json::parse_error& e) {
      throw ParamError("body", infer::detail::cat("the request body is not valid JSON: ", e.what()));
    }
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

  /// Any loaded engine's tokenizer (they serve one model); ServiceError while none is loaded.
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

  ChatTemplate chat_template() const {
    std::lock_guard lock(template_mu_);
    if (!template_) {
      template_ = o_.chat_template.empty() ? ChatTemplate::from_source(tokenizer().chat_template_source())
                                           : ChatTemplate::from_name(o_.chat_template);
    }
    return *template_;
  }

  std::vector<std::int32_t> encode_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
    const std::string rendered = chat_template().apply(messages, add_generation_prompt);
    EncodeOptions opts;
    opts.add_bos = false;  // a rendered chat carries its own BOS text (as infer::LLM::encode_chat)
    return tokenizer().encode(rendered, opts);
  }

  // ---- submission with routing and fallback --------------------------------------------------------------

  struct Admitted {
    std::size_t engine = 0;
    std::vector<std::shared_ptr<RequestStream>> streams;
  };

  /// Submits every prompt of one HTTP request to one engine, trying the router's candidates in order.
  /// The first engine that admits all of them serves the request; a refusal (full, failed, a shape or
  /// context it cannot take) moves on to the next. When all refuse: a 503 if any engine was merely busy
  /// (the client should retry), else the first engine's 4xx.
  Admitted submit(const std::vector<std::vector<std::int32_t>>& prompts, const GenerationRequest& r, bool chat,
                  const RouteQuery& q) {
    const auto candidates = router_.candidates(q);
    std::optional<ApiError> first_client_error, last_unavailable;
    for (std::size_t k = 0; k < candidates.size(); ++k) {
      EngineWorker& w = *workers_[candidates[k]];
      std::vector<std::shared_ptr<RequestStream>> streams;
      try {
        const EngineInfo& info = w.info();
        for (const auto& ids : prompts) check_token_ids(ids, info.vocab_size, "prompt");
        for (const auto& ids : prompts) {
          SamplingParams p = r.params;
          p.max_tokens = resolve_max_tokens(r, chat, static_cast<std::int64_t>(ids.size()), info.max_model_len,
                                            info.max_output);
          p.validate(static_cast<std::int32_t>(info.vocab_size));
          streams.push_back(w.submit(ids, std::move(p)));
        }
        std::optional<ApiError> refused;
        for (auto& s : streams) {
          const auto st = s->wait_admission(o_.admission_timeout);
          if (st == RequestStream::State::rejected) refused = s->rejection();
          else if (st == RequestStream::State::queued)
            refused = ApiError::unavailable(infer::detail::cat("engine '", w.name(), "' did not admit the request within ",
                                                               o_.admission_timeout.count(), " ms"),
                                            "engine_stalled", 5);
          if (refused) break;
        }
        if (refused) throw HttpError(*refused);
        routed_.add(w.name());
        if (k > 0) fallbacks_.add(workers_[candidates[0]]->name() + "->" + w.name());
        return {candidates[k], std::move(streams)};
      } catch (const std::exception& e) {
        for (auto& s : streams) s->cancel();
        ApiError err = to_api_error(e);
        if (err.status == 503) last_unavailable = err;
        else if (!first_client_error) first_client_error = err;
        if (err.status == 404 || err.status == 413) break;  // the same on every engine
      }
    }
    throw HttpError(last_unavailable ? *last_unavailable : *first_client_error);
  }

  /// Sends the exchange: a chunked body, written as events arrive (streaming) or once at the end.
  void respond(httplib::Response& res, std::shared_ptr<Exchange> ex, bool stream, const std::string& engine) {
    res.set_header("X-Infer-Engine", engine);
    const auto poll = o_.poll_interval;
    if (stream) {
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider("text/event-stream", [ex, poll](std::size_t, httplib::DataSink& sink) {
        std::string out;
        ex->poll(poll, &out);
        if (ex->finished()) out += ex->stream_tail();
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          ex->cancel();
          return false;
        }
        if (ex->finished()) sink.done();
        return true;  // httplib checks the socket before calling again: a closed one ends the exchange
      });
    } else {
      res.set_chunked_content_provider("application/json", [ex, poll](std::size_t, httplib::DataSink& sink) {
        ex->poll(poll, nullptr);
        if (!ex->finished()) return sink.is_writable();
        // The status line went out when the provider started; a request the engine failed after
        // admission (a forward-pass error) can only be reported in the body.
        const std::string body = ex->error() ? ApiError::internal(*ex->error()).body() : dump_body(ex->final_body());
        if (!sink.write(body.data(), body.size())) return false;
        sink.done();
        return true;
      });
    }
  }

  // ---- endpoints -----------------------------------------------------------------------------------

  void completions(const httplib::Request& req, httplib::Response& res) {
    const CompletionRequest r = parse_completion_request(parse_body(req));
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
      if (p.text) {
        if (!tok) tok = &tokenizer();
        try {
          prompts.push_back(tok->encode(*p.text));
        } catch (const Error& e) {
          throw ParamError(r.prompts.size() == 1 ? "prompt" : infer::detail::cat("prompt[", i, "]"), e.what());
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
    Admitted a = submit(prompts, r, /*chat=*/false, q);
    ExchangeSetup s = exchange_setup(r, /*chat=*/false, model, a.engine, prompts);
    s.echo = std::move(echo);
    respond(res, std::make_shared<Exchange>(std::move(s), std::move(a.streams)), r.stream, workers_[a.engine]->name());
  }

  /// What both endpoints' exchanges are set up with, from a parsed completion or chat request.
  template <class Request>
  ExchangeSetup exchange_setup(const Request& r, bool chat, const std::string& model, std::size_t engine,
                               const std::vector<std::vector<std::int32_t>>& prompts) const {
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
    s.tokenizer = workers_[engine]->tokenizer();
    for (const auto& p : prompts) s.prompt_tokens.push_back(static_cast<std::int32_t>(p.size()));
    return s;
  }

  void chat_completions(const httplib::Request& req, httplib::Response& res) {
    const ChatRequest r = parse_chat_request(parse_body(req));
    const std::string model = check_model(r.model);
    check_choices(1, r.params.n);
    std::vector<std::vector<std::int32_t>> prompts{encode_chat(r.messages, r.add_generation_prompt)};
    RouteQuery q;
    q.endpoint = "chat";
    q.max_tokens = r.max_tokens;
    q.prompt_tokens = static_cast<std::int64_t>(prompts[0].size());
    for (const auto& m : r.messages) q.text += m.content + "\n";
    Admitted a = submit(prompts, r, /*chat=*/true, q);
    ExchangeSetup s = exchange_setup(r, /*chat=*/true, model, a.engine, prompts);
    respond(res, std::make_shared<Exchange>(std::move(s), std::move(a.streams)), r.stream, workers_[a.engine]->name());
  }

  void models(const httplib::Request&, httplib::Response& res) {
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
    res.set_content(json{{"object", "list"}, {"data", data}}.dump(), "application/json");
  }

  void health(const httplib::Request&, httplib::Response& res) {
    for (auto* w : workers_) {
      const Health h = w->health();
      if (!h.ok) {
        send_error(res, ApiError::unavailable(infer::detail::cat("engine '", w->name(), "': ", h.message), h.code,
                                              h.code == "engine_stalled" ? 1 : 5));
        return;
      }
    }
    res.set_content(R"({"status":"ok"})", "application/json");
  }

  void tokenize(const httplib::Request& req, httplib::Response& res) {
    const TokenizeRequest r = parse_tokenize_request(parse_body(req));
    check_model(r.model);
    std::vector<std::int32_t> ids;
    const Tokenizer& tok = tokenizer();
    try {
      if (r.prompt) {
        EncodeOptions opts;
        if (!r.add_special_tokens) opts.add_bos = false;
        ids = tok.encode(*r.prompt, opts);
      } else {
        ids = encode_chat(r.messages, r.add_generation_prompt);
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
    res.set_content(dump_body(out), "application/json");
  }

  void detokenize(const httplib::Request& req, httplib::Response& res) {
    const DetokenizeRequest r = parse_detokenize_request(parse_body(req));
    check_model(r.model);
    const Tokenizer& tok = tokenizer();
    check_token_ids(r.tokens, static_cast<std::int64_t>(tok.vocab_size()), "tokens");
    res.set_content(dump_body(json{{"prompt", tok.decode(r.tokens)}}), "application/json");
  }

  /// POST /debug/hold: parks every engine's loop; 200 once all are parked (within admission_timeout,
  /// the same bound as for the engine thread taking a request), else 503 with the hold still asked for.
  void debug_hold(httplib::Response& res) {
    json held = json::array();
    for (auto* w : workers_) w->hold();
    for (auto* w : workers_) {
      if (!w->wait_held(o_.admission_timeout))
        throw HttpError(ApiError::unavailable(infer::detail::cat("engine '", w->name(), "' did not park within ",
                                                                 o_.admission_timeout.count(), " ms"),
                                              "hold_timeout", 1));
      held.push_back(w->name());
    }
    res.set_content(json{{"held", held}}.dump(), "application/json");
  }

  void debug_release(httplib::Response& res) {
    json released = json::array();
    for (auto* w : workers_) {
      w->release();
      released.push_back(w->name());
    }
    res.set_content(json{{"released", released}}.dump(), "application/json");
  }

  static bool known_route(const std::string& path) {
    for (const char* p : {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/tokenize",
                          "/detokenize", "/version", "/openapi.json"})
      if (path == p) return true;
    return false;
  }

  void routes() {
    svr_.new_task_queue = [n = o_.http_threads] { return new httplib::ThreadPool(n); };
    svr_.set_payload_max_length(o_.max_body_bytes);
    // Without TCP_NODELAY a response written in two pieces (headers, then body or an SSE chunk) waits for
    // the client's delayed ACK on a kept-alive connection: about 40 ms per response and per streamed token.
    svr_.set_tcp_nodelay(true);
    svr_.set_keep_alive_timeout(o_.keep_alive_timeout_s);
    svr_.set_read_timeout(30);
    svr_.set_write_timeout(30);

    svr_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (o_.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
      if (req.get_header_value("Authorization") == "Bearer " + o_.api_key)
        return httplib::Server::HandlerResponse::Unhandled;
      send_error(res, ApiError::unauthorized(req.has_header("Authorization")
                                                 ? "Incorrect API key provided"
                                                 : "Missing API key: send it as 'Authorization: Bearer <key>'"));
      http_.add(std::string("401 ") + (known_route(req.path) ? req.path : "unknown"));
      return httplib::Server::HandlerResponse::Handled;
    });
    // httplib's own errors (no route, body too large, unreadable request) get OpenAI's body too.
    svr_.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      ApiError e;
      if (res.status == 404) e = ApiError::not_found(infer::detail::cat("Not found: ", req.method, " ", req.path), std::nullopt,
                                                      "unknown_url");
      else if (res.status == 413)
        e = {413, infer::detail::cat("The request body is larger than the server's limit of ", o_.max_body_bytes, " bytes"),
             "invalid_request_error", std::nullopt, "request_too_large", std::nullopt};
      else if (res.status < 500)
        e = {res.status, infer::detail::cat("The request could not be read (HTTP ", res.status, ")"),
             "invalid_request_error", std::nullopt, std::nullopt, std::nullopt};
      else e = ApiError::internal(infer::detail::cat("HTTP ", res.status));
      const int status = res.status;
      send_error(res, e);
      res.status = status;
      // Label by route only for the server's own paths: a label per arbitrary path would let clients
      // grow the metrics (and the memory behind them) without bound.
      if (status == 404 || status == 413) http_.add(std::to_string(status) + " " + (known_route(req.path) ? req.path : "unknown"));
      return httplib::Server::HandlerResponse::Handled;
    }));
    svr_.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      send_error(res, to_api_error(ep));
    });

    svr_.Post("/v1/completions", guarded("/v1/completions", [this](auto& q, auto& s) { completions(q, s); }));
    svr_.Post("/v1/chat/completions", guarded("/v1/chat/completions", [this](auto& q, auto& s) { chat_completions(q, s); }));
    svr_.Get("/v1/models", guarded("/v1/models", [this](auto& q, auto& s) { models(q, s); }));
    svr_.Get("/health", guarded("/health", [this](auto& q, auto& s) { health(q, s); }));
    svr_.Get("/metrics", guarded("/metrics", [this](auto&, auto& s) {
      s.set_content(metrics_text(), "text/plain; version=0.0.4; charset=utf-8");
    }));
    svr_.Post("/tokenize", guarded("/tokenize", [this](auto& q, auto& s) { tokenize(q, s); }));
    svr_.Post("/detokenize", guarded("/detokenize", [this](auto& q, auto& s) { detokenize(q, s); }));
    svr_.Get("/version", guarded("/version", [](auto&, auto& s) {
      s.set_content(json{{"version", INFER_VERSION}}.dump(), "application/json");
    }));
    svr_.Get("/openapi.json", guarded("/openapi.json", [this](auto&, auto& s) {
      s.set_content(openapi_document(INFER_VERSION, !o_.api_key.empty(), static_cast<std::int64_t>(o_.max_choices)).dump(), "application/json");
    }));
    if (o_.test_hooks) {
      svr_.Post("/debug/hold", guarded("/debug/hold", [this](auto&, auto& s) { debug_hold(s); }));
      svr_.Post("/debug/release", guarded("/debug/release", [this](auto&, auto& s) { debug_release(s); }));
    }
    // A known path with the wrong method: 405 naming the method to use.
    auto wrong_method = [](const char* allowed) {
      return [allowed](const httplib::Request& req, httplib::Response& res) {
        send_error(res, {405, infer::detail::cat("Method ", req.method, " is not allowed on ", req.path, "; use ", allowed),
                         "invalid_request_error", std::nullopt, "method_not_allowed", std::nullopt});
        res.set_header("Allow", allowed);
      };
    };
    for (const char* p : {"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"}) {
      svr_.Get(p, wrong_method("POST"));
      svr_.Put(p, wrong_method("POST"));
      svr_.Delete(p, wrong_method("POST"));
    }
    for (const char* p : {"/v1/models", "/health", "/metrics", "/version", "/openapi.json"}) {
      svr_.Post(p, wrong_method("GET"));
      svr_.Put(p, wrong_method("GET"));
      svr_.Delete(p, wrong_method("GET"));
    }
  }

  ServerOptions o_;
  Router router_;
  std::vector<EngineWorker*> workers_;
  std::int64_t started_;
  detail::HttpServer svr_;
  int port_ = 0;
  mutable std::mutex template_mu_;
  mutable std::optional<ChatTemplate> template_;
  mutable LabeledCounter routed_, fallbacks_, http_;
};

}  // namespace infer::serve
