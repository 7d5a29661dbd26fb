// infer-bench-serve: an online-serving benchmark for any OpenAI-compatible server (infer-serve, vLLM,
// ...), modelled on vLLM's `benchmarks/benchmark_serving.py`: requests arrive as a Poisson process at
// --request-rate (or all at once), optionally capped at --max-concurrency in flight, each one streamed,
// and the run reports per-request latencies — TTFT (time to first token), TPOT (time per output token
// after the first), ITL (the gaps between streamed chunks), E2E — as mean / p50 / p90 / p99, request
// and token throughput, and goodput: the rate of requests that met every --goodput SLO.
//
//   infer-bench-serve --url http://127.0.0.1:8000 --num-prompts 200 --request-rate 4
//                     --random-input-len 128 --random-output-len 64 [--endpoint chat] [--goodput ttft:500 tpot:50]
//   infer-bench-serve --dataset jsonl --dataset-path prompts.jsonl ...   lines {"prompt": ...} or {"messages": [...]}
//
// Output lengths are made exact (max_tokens with ignore_eos), as vLLM's benchmark does, so token
// throughput compares across servers. Connections are kept alive and reused, as vLLM's benchmark's aiohttp
// session does (--no-keep-alive: a new connection per request); failures are counted by cause (connect,
// reset, closed, timeout, http_<status>, stream). The HTTP client is http_client.hpp. The table goes to stdout, the JSON record to --result-dir
// (bench/results by default) as serve-<date>-<time>.json, or to --result-file.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "http_client.hpp"

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

struct Prompt {
  std::string text;     // completions: the prompt; chat: the user turn (when `messages` is empty)
  json messages;        // chat prompts from a JSONL file may carry a whole conversation
  int output_len = 0;   // max_tokens
};

/// What one request measured. Times in seconds from its own start.
struct Outcome {
  bool ok = false;
  bench::Cause cause = bench::Cause::none;  // why it failed
  std::string error;
  int status = 0;
  double ttft = 0, e2e = 0;
  std::vector<double> itl;  // gaps between chunks that carried text, after the first
  std::int64_t prompt_tokens = 0, output_tokens = 0;
  std::string engine;       // the X-Infer-Engine header, when the server sends one
};

// ---- prompts -------------------------------------------------------------------------------------------

/// Common short English words: about one token each for a BPE vocabulary, so a random prompt of N words
/// is close to N tokens (the server's usage reports the exact count, which is what the results use).
const std::vector<std::string>& words() {
  static const std::vector<std::string> w{
      "time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child", "world", "school", "state",
      "family", "student", "group", "country", "problem", "hand", "part", "place", "case", "week", "company",
      "system", "program", "question", "work", "number", "night", "point", "home", "water", "room", "mother",
      "area", "money", "story", "fact", "month", "lot", "right", "study", "book", "eye", "job", "word", "business",
      "issue", "side", "kind", "head", "house", "service", "friend", "father", "power", "hour", "game", "line",
      "end", "member", "law", "car", "city", "name", "team", "minute", "idea", "kid", "body", "back", "parent",
      "face", "others", "level", "office", "door", "health", "person", "art", "war", "history", "party", "result",
      "change", "morning", "reason", "research", "girl", "guy", "moment", "air", "teacher", "force", "education"};
  return w;
}

std::vector<Prompt> random_prompts(int n, int input_len, int output_len, double range_ratio, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto length = [&](int mean) {
    const int lo = std::max(1, static_cast<int>(std::floor(mean * (1.0 - range_ratio))));
    const int hi = std::max(lo, static_cast<int>(std::ceil(mean * (1.0 + range_ratio))));
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  std::uniform_int_distribution<std::size_t> pick(0, words().size() - 1);
  std::vector<Prompt> out;
  for (int i = 0; i < n; ++i) {
    Prompt p;
    const int len = length(input_len);
    for (int k = 0; k < len; ++k) p.text += (k ? " " : "") + words()[pick(rng)];
    p.output_len = length(output_len);
    out.push_back(std::move(p));
  }
  return out;
}

/// JSONL: {"prompt": "..."} or {"messages": [...]}, optionally with "max_tokens"; plain lines are prompts.
/// The file is cycled when it has fewer lines than --num-prompts.
std::vector<Prompt> jsonl_prompts(const std::string& path, int n, int output_len) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(fmt::format("cannot read --dataset-path '{}'", path));
  std::vector<Prompt> file;
  std::string line;
  for (int ln = 1; std::getline(in, line); ++ln) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    Prompt p;
    p.output_len = output_len;
    if (line.front() != '{') {
      p.text = line;
    } else {
      json j;
      try {
        j = json::parse(line);
      } catch (const json::exception& e) {
        throw std::runtime_error(fmt::format("{} line {}: not valid JSON ({})", path, ln, e.what()));
      }
      if (j.contains("messages") && j["messages"].is_array()) p.messages = j["messages"];
      else if (j.contains("prompt") && j["prompt"].is_string()) p.text = j["prompt"].get<std::string>();
      else throw std::runtime_error(fmt::format("{} line {}: expected {{\"prompt\": string}} or {{\"messages\": [...]}}", path, ln));
      if (j.contains("max_tokens") && j["max_tokens"].is_number_integer()) p.output_len = j["max_tokens"].get<int>();
    }
    file.push_back(std::move(p));
  }
  if (file.empty()) throw std::runtime_error(fmt::format("--dataset-path '{}' has no prompts", path));
  std::vector<Prompt> out;
  for (int i = 0; i < n; ++i) out.push_back(file[static_cast<std::size_t>(i) % file.size()]);
  return out;
}

// ---- one streamed request ------------------------------------------------------------------------------

struct Target {
  std::string host;
  int port = 8000;
  std::string api_key, model;
  bool chat = false;
};

Target parse_url(const std::string& url) {
  Target t;
  std::string rest = url;
  if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
  else if (rest.find("://") != std::string::npos) throw std::runtime_error("--url: only http:// is supported");
  if (auto slash = rest.find('/'); slash != std::string::npos) rest = rest.substr(0, slash);
  const auto colon = rest.rfind(':');
  t.host = rest.substr(0, colon);
  if (colon != std::string::npos) {
    try {
      t.port = std::stoi(rest.substr(colon + 1));
    } catch (const std::exception&) {
      throw std::runtime_error(fmt::format("--url '{}': the port is not a number", url));
    }
  }
  if (t.host.empty()) throw std::runtime_error(fmt::format("--url '{}' has no host", url));
  return t;
}

/// Sends one streaming request and times its chunks as they arrive.
bench::net::awaitable<Outcome> run_one(bench::Client& client, const Target& t, const Prompt& p) {
  Outcome o;
  json body{{"model", t.model}, {"max_tokens", p.output_len}, {"ignore_eos", true}, {"temperature", 0},
            {"stream", true}, {"stream_options", {{"include_usage", true}}}};
  if (t.chat) body["messages"] = p.messages.is_array() ? p.messages : json::array({{{"role", "user"}, {"content", p.text}}});
  else body["prompt"] = p.text;

  std::string buffer;
  const auto start = Clock::now();
  std::optional<Clock::time_point> last;
  bool done = false;
  auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  auto on_body = [&](std::string_view data) {
    buffer.append(data);
    // SSE events end with a blank line; a chunk may carry several events or part of one.
    for (std::size_t end; (end = buffer.find("\n\n")) != std::string::npos;) {
      const std::string event = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;  // comments (keep-alives) and other fields
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      json j;
      try {
        j = json::parse(payload);
      } catch (const json::exception&) {
        o.error = "stream: a streamed event is not valid JSON";
        return false;
      }
      if (j.contains("error")) {
        o.error = "stream: " + j["error"].value("message", std::string("error event"));
        return false;
      }
      if (j.contains("usage") && j["usage"].is_object()) {
        o.prompt_tokens = j["usage"].value("prompt_tokens", std::int64_t{0});
        o.output_tokens = j["usage"].value("completion_tokens", std::int64_t{0});
      }
      // A chunk is a token's arrival when a choice carries text, or carries none but is not an end:
      // a model may produce tokens with no text of their own (a vocabulary larger than its tokenizer's,
      // part of a UTF-8 character), and TTFT and ITL time the tokens. Chat's opening chunk (the role)
      // and a bare finish_reason are not tokens.
      bool token = false;
      for (const auto& c : j.value("choices", json::array())) {
        const json delta = t.chat ? c.value("delta", json::object()) : json::object();
        if (t.chat && delta.contains("role")) continue;
        const json& piece = t.chat ? delta.value("content", json()) : c.value("text", json());
        const bool has_text = piece.is_string() && !piece.get<std::string>().empty();
        token = token || has_text || c.value("finish_reason", json()).is_null();
      }
      if (!token) continue;
      const auto now = Clock::now();
      if (!last) o.ttft = seconds(now - start);
      else o.itl.push_back(seconds(now - *last));
      last = now;
    }
    return true;
  };
  std::string method = "POST", target = t.chat ? "/v1/chat/completions" : "/v1/completions", payload = body.dump();
  bench::Client::BodyCallback callback = on_body;
  const bench::Reply r = co_await client.request(std::move(method), std::move(target), std::move(payload), std::move(callback));
  o.e2e = seconds(Clock::now() - start);
  o.status = r.status;
  o.engine = r.engine;
  o.cause = r.cause;
  if (r.cause == bench::Cause::http) {
    std::string msg = r.body;
    try {
      msg = json::parse(r.body)["error"].value("message", r.body);
    } catch (const json::exception&) {
    }
    o.error = fmt::format("HTTP {}: {}", r.status, msg.substr(0, 300));
  } else if (r.cause != bench::Cause::none) {
    if (o.error.empty()) o.error = r.error;
  } else {
    o.cause = bench::Cause::stream;
    if (!done) o.error = "stream: the stream ended without [DONE]";
    else if (o.output_tokens == 0) o.error = "stream: no usage chunk (the server ignored stream_options.include_usage)";
    else if (!last) o.error = "stream: no text was streamed";
    else o.cause = bench::Cause::none;
  }
  o.ok = o.cause == bench::Cause::none;
  co_return o;
}

// ---- the run -------------------------------------------------------------------------------------------

/// Starts request i at its arrival time (Poisson at `rate`, or all at once when rate is infinite),
/// never more than `max_concurrency` in flight (0: no cap). Everything runs on this thread's event loop.
std::vector<Outcome> run_all(bench::net::io_context& ioc, bench::Client& client, const Target& t,
                             const std::vector<Prompt>& prompts, double rate, int max_concurrency, std::uint64_t seed,
                             double& duration_s) {
  namespace net = bench::net;
  std::vector<Outcome> out(prompts.size());
  int in_flight = 0;
  std::size_t finished = 0;
  net::steady_timer slot(ioc);  // cancelled when a request finishes: the launcher may go on
  std::mt19937_64 rng(seed ^ 0x9E3779B97F4A7C15ull);
  std::exponential_distribution<double> gap(std::isfinite(rate) && rate > 0 ? rate : 1.0);
  const auto start = Clock::now();
  auto one = [&](std::size_t i) -> net::awaitable<void> {
    out[i] = co_await run_one(client, t, prompts[i]);
    --in_flight;
    ++finished;
    slot.cancel();
  };
  auto launcher = [&]() -> net::awaitable<void> {
    net::steady_timer arrival(ioc);
    auto next = start;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      bench::error_code ec;
      if (std::isfinite(rate)) {
        arrival.expires_at(next);
        co_await arrival.async_wait(net::redirect_error(net::use_awaitable, ec));
        next += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap(rng)));
      }
      while (max_concurrency > 0 && in_flight >= max_concurrency) {
        slot.expires_at(Clock::time_point::max());
        co_await slot.async_wait(net::redirect_error(net::use_awaitable, ec));
      }
      ++in_flight;
      net::co_spawn(ioc, one(i), net::detached);
    }
  };
  net::co_spawn(ioc, launcher(), net::detached);
  ioc.run();
  ioc.restart();
  duration_s = std::chrono::duration<double>(Clock::now() - start).count();
  if (finished != prompts.size()) throw std::runtime_error("the event loop ended with requests unfinished");
  return out;
}

/// The first model the server lists at /v1/models.
std::string first_model(bench::net::io_context& ioc, bench::Client& client, const std::string& url) {
  std::string model, error;
  auto get = [&]() -> bench::net::awaitable<void> {
    std::string body;
    std::string method = "GET", target = "/v1/models", none;
    bench::Client::BodyCallback callback = [&](std::string_view d) {
      body.append(d);
      return true;
    };
    const bench::Reply r = co_await client.request(std::move(method), std::move(target), std::move(none), std::move(callback));
    if (r.cause == bench::Cause::http) error = fmt::format("GET /v1/models: HTTP {}: {}", r.status, r.body);
    else if (r.cause != bench::Cause::none) error = fmt::format("cannot reach {}: {}", url, r.error);
    else model = json::parse(body).at("data").at(0).at("id").get<std::string>();
  };
  bench::net::co_spawn(ioc, get(), bench::net::detached);
  ioc.run();
  ioc.restart();
  if (!error.empty()) throw std::runtime_error(error);
  return model;
}

/// Linear-interpolated percentile (numpy's default), of a sorted vector.
double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q / 100.0 * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const auto hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - static_cast<double>(lo));
}

/// mean, std, p50, p90, p99 in milliseconds.
json summary_ms(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const double n = static_cast<double>(v.size());
  const double mean = v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / n;
  double var = 0;
  for (double x : v) var += (x - mean) * (x - mean);
  const double sd = v.size() > 1 ? std::sqrt(var / (n - 1)) : 0;
  return {{"mean", mean * 1e3}, {"std", sd * 1e3}, {"p50", percentile(v, 50) * 1e3}, {"p90", percentile(v, 90) * 1e3},
          {"p99", percentile(v, 99) * 1e3}, {"count", v.size()}};
}

/// --goodput "ttft:500 tpot:50 e2e:2000" (milliseconds) → SLOs.
std::vector<std::pair<std::string, double>> parse_slos(const std::vector<std::string>& specs) {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& s : specs) {
    const auto colon = s.find(':');
    const std::string key = s.substr(0, colon);
    if (colon == std::string::npos || (key != "ttft" && key != "tpot" && key != "e2e"))
      throw std::runtime_error(fmt::format("--goodput '{}': use ttft:MS, tpot:MS or e2e:MS", s));
    double ms = 0;
    try {
      ms = std::stod(s.substr(colon + 1));
    } catch (const std::exception&) {
      ms = -1;
    }
    if (!(ms > 0)) throw std::runtime_error(fmt::format("--goodput '{}': the limit must be a positive number of ms", s));
    out.emplace_back(key, ms);
  }
  return out;
}

std::string today() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d-%H%M%S", &tm);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Online-serving benchmark for an OpenAI-compatible server", "infer-bench-serve"};
  std::string url = "http://127.0.0.1:8000", endpoint = "completions", dataset = "random", dataset_path;
  std::string result_dir = "bench/results", result_file, label;
  Target t;
  int num_prompts = 100, input_len = 128, output_len = 64, max_concurrency = 0;
  double rate = std::numeric_limits<double>::infinity(), range_ratio = 0.0;
  std::uint64_t seed = 0;
  std::vector<std::string> goodput;
  bool no_save = false, no_keep_alive = false;
  double timeout_s = 600;
  app.add_option("--url", url, "the server's base URL")->capture_default_str();
  app.add_option("--endpoint", endpoint, "completions or chat")->check(CLI::IsMember({"completions", "chat"}))->capture_default_str();
  app.add_option("--model", t.model, "the model name to send (default: the server's first in /v1/models)");
  app.add_option("--api-key", t.api_key, "sent as 'Authorization: Bearer KEY' (also $OPENAI_API_KEY)")->envname("OPENAI_API_KEY");
  app.add_option("--num-prompts,-n", num_prompts, "requests to send")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--request-rate", rate, "requests per second, Poisson arrivals (inf: all at once)")->capture_default_str();
  app.add_option("--max-concurrency", max_concurrency, "requests in flight at most (0: no cap)")->check(CLI::NonNegativeNumber);
  app.add_option("--dataset", dataset, "random or jsonl")->check(CLI::IsMember({"random", "jsonl"}))->capture_default_str();
  app.add_option("--dataset-path", dataset_path, "the JSONL file for --dataset jsonl");
  app.add_option("--random-input-len", input_len, "random prompts: words per prompt")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--random-output-len", output_len, "tokens to generate per request (max_tokens, ignore_eos)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--random-range-ratio", range_ratio, "lengths uniform in [len*(1-r), len*(1+r)]")->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", seed, "prompts and arrival times")->capture_default_str();
  app.add_option("--goodput", goodput, "SLOs a request must meet to count as good, in ms: ttft:500 tpot:50 e2e:3000");
  app.add_option("--timeout", timeout_s, "seconds one request may take")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_flag("--no-keep-alive", no_keep_alive,
               "a new connection per request, with 'Connection: close' (by default connections are kept and reused, "
               "as vLLM's benchmark does)");
  app.add_option("--result-dir", result_dir, "where the JSON record goes")->capture_default_str();
  app.add_option("--result-file", result_file, "the JSON record's path (instead of --result-dir/serve-<date>.json)");
  app.add_option("--label", label, "a name for this run, kept in the record");
  app.add_flag("--no-save", no_save, "print the table only");
  CLI11_PARSE(app, argc, argv);

  try {
    const Target parsed = parse_url(url);
    t.host = parsed.host;
    t.port = parsed.port;
    t.chat = endpoint == "chat";
    if (!(rate > 0)) throw std::runtime_error("--request-rate must be > 0 (inf: all at once)");
    const auto slos = parse_slos(goodput);
    if (dataset == "jsonl" && dataset_path.empty()) throw std::runtime_error("--dataset jsonl needs --dataset-path");

    bench::net::io_context ioc(1);
    bench::ClientOptions co;
    co.host = t.host;
    co.port = t.port;
    co.api_key = t.api_key;
    co.keep_alive = !no_keep_alive;
    co.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000));
    bench::Client client(ioc, co);
    if (t.model.empty()) t.model = first_model(ioc, client, url);
    const auto prompts = dataset == "random" ? random_prompts(num_prompts, input_len, output_len, range_ratio, seed)
                                             : jsonl_prompts(dataset_path, num_prompts, output_len);

    fmt::print("infer-bench-serve: {} requests to {} ({} endpoint, model '{}'), rate {}, max concurrency {}, {}\n",
               prompts.size(), url, endpoint, t.model, std::isfinite(rate) ? fmt::format("{:g}/s", rate) : "inf",
               max_concurrency > 0 ? std::to_string(max_concurrency) : "none",
               no_keep_alive ? "a new connection per request" : "connections kept alive");
    double duration = 0;
    const std::size_t opened_before = client.connections_opened();
    const auto outcomes = run_all(ioc, client, t, prompts, rate, max_concurrency, seed, duration);

    std::vector<double> ttft, tpot, itl, e2e;
    std::int64_t in_tokens = 0, out_tokens = 0;
    int completed = 0, good = 0;
    json errors = json::object(), failures = json::object();
    struct EngineLatency {
      std::vector<double> ttft, tpot, e2e;
    };
    std::map<std::string, EngineLatency> per_engine;  // behind a router: each engine's own latencies
    for (const auto& o : outcomes) {
      if (!o.ok) {
        const std::string key = o.error.substr(0, 200);
        errors[key] = errors.value(key, 0) + 1;
        const std::string cause = o.cause == bench::Cause::http ? fmt::format("http_{}", o.status) : bench::to_string(o.cause);
        failures[cause] = failures.value(cause, 0) + 1;
        continue;
      }
      ++completed;
      in_tokens += o.prompt_tokens;
      out_tokens += o.output_tokens;
      ttft.push_back(o.ttft);
      e2e.push_back(o.e2e);
      const double per_token = o.output_tokens > 1 ? (o.e2e - o.ttft) / static_cast<double>(o.output_tokens - 1) : 0;
      if (o.output_tokens > 1) tpot.push_back(per_token);
      itl.insert(itl.end(), o.itl.begin(), o.itl.end());
      if (!o.engine.empty()) {
        auto& l = per_engine[o.engine];
        l.ttft.push_back(o.ttft);
        l.e2e.push_back(o.e2e);
        if (o.output_tokens > 1) l.tpot.push_back(per_token);
      }
      bool meets = true;
      for (const auto& [key, ms] : slos) {
        const double v = key == "ttft" ? o.ttft : key == "tpot" ? per_token : o.e2e;
        meets = meets && v * 1e3 <= ms;
      }
      good += meets ? 1 : 0;
    }

    json engines = json::object(), by_engine = json::object();  // served_by: counts; by_engine: and latencies
    for (const auto& [name, l] : per_engine) {
      engines[name] = l.e2e.size();
      by_engine[name] = {{"completed", l.e2e.size()}, {"ttft_ms", summary_ms(l.ttft)}, {"tpot_ms", summary_ms(l.tpot)},
                         {"e2e_ms", summary_ms(l.e2e)}};
    }
    json slo_json = json::object();
    for (const auto& [k, v] : slos) slo_json[k] = v;
    json record{
        {"date", today()},
        {"commit", std::getenv("INFER_COMMIT") ? std::getenv("INFER_COMMIT") : "unknown"},  // set by bench/gpu_suite.sh
        {"label", label},
        {"url", url},
        {"endpoint", endpoint},
        {"model", t.model},
        {"dataset", dataset == "random" ? json{{"kind", "random"}, {"input_len", input_len}, {"output_len", output_len},
                                               {"range_ratio", range_ratio}, {"seed", seed}}
                                        : json{{"kind", "jsonl"}, {"path", dataset_path}, {"output_len", output_len}}},
        {"request_rate", std::isfinite(rate) ? json(rate) : json("inf")},
        {"max_concurrency", max_concurrency > 0 ? json(max_concurrency) : json(nullptr)},
        {"num_prompts", prompts.size()},
        {"completed", completed},
        {"failed", static_cast<int>(prompts.size()) - completed},
        {"failures", failures},
        {"errors", errors},
        {"keep_alive", !no_keep_alive},
        {"connections_opened", client.connections_opened() - opened_before},
        {"retried_on_closed_connection", client.retried()},
        {"duration_s", duration},
        {"total_input_tokens", in_tokens},
        {"total_output_tokens", out_tokens},
        {"request_throughput", completed / duration},
        {"output_throughput", static_cast<double>(out_tokens) / duration},
        {"total_token_throughput", static_cast<double>(in_tokens + out_tokens) / duration},
        {"goodput", slos.empty() ? json(nullptr) : json(good / duration)},
        {"slo_ms", slo_json},
        {"good_requests", slos.empty() ? json(nullptr) : json(good)},
        {"ttft_ms", summary_ms(ttft)},
        {"tpot_ms", summary_ms(tpot)},
        {"itl_ms", summary_ms(itl)},
        {"e2e_ms", summary_ms(e2e)},
        {"served_by", engines},
        {"by_engine", by_engine},
    };

    fmt::print("{:=^60}\n", " Serving benchmark result ");
    auto row = [](const std::string& k, const std::string& v) { fmt::print("{:<42}{:>18}\n", k, v); };
    row("Successful requests:", std::to_string(completed));
    row("Failed requests:", std::to_string(prompts.size() - static_cast<std::size_t>(completed)));
    for (const auto& [cause, n] : failures.items()) row(fmt::format("  by cause: {}", cause), std::to_string(n.get<int>()));
    row("Connections opened:", std::to_string(client.connections_opened() - opened_before));
    row("Benchmark duration (s):", fmt::format("{:.2f}", duration));
    row("Total input tokens:", std::to_string(in_tokens));
    row("Total generated tokens:", std::to_string(out_tokens));
    row("Request throughput (req/s):", fmt::format("{:.2f}", record["request_throughput"].get<double>()));
    row("Output token throughput (tok/s):", fmt::format("{:.2f}", record["output_throughput"].get<double>()));
    row("Total token throughput (tok/s):", fmt::format("{:.2f}", record["total_token_throughput"].get<double>()));
    if (!slos.empty()) row("Request goodput (req/s):", fmt::format("{:.2f}", good / duration));
    for (const auto& [name, key] : std::vector<std::pair<std::string, std::string>>{
             {"Time to First Token", "ttft_ms"}, {"Time per Output Token (excl. 1st token)", "tpot_ms"},
             {"Inter-token Latency", "itl_ms"}, {"End-to-end Latency", "e2e_ms"}}) {
      fmt::print("{:-^60}\n", " " + name + " ");
      const json& s = record[key];
      const std::string shortname = key.substr(0, key.size() - 3);
      for (const char* stat : {"mean", "p50", "p90", "p99"})
        row(fmt::format("{} {} (ms):", stat, shortname), fmt::format("{:.2f}", s[stat].get<double>()));
    }
    if (per_engine.size() > 1) {  // a router: what each engine served, and how fast
      fmt::print("{:-^60}\n", " Per engine (X-Infer-Engine) ");
      for (const auto& [name, e] : by_engine.items())
        row(fmt::format("{}: requests, p50 ttft / tpot / e2e (ms)", name),
            fmt::format("{} {:.1f} {:.1f} {:.1f}", e["completed"].get<std::size_t>(), e["ttft_ms"]["p50"].get<double>(),
                        e["tpot_ms"]["p50"].get<double>(), e["e2e_ms"]["p50"].get<double>()));
    }
    fmt::print("{:=^60}\n", "");
    for (const auto& [msg, n] : errors.items()) fmt::print("error ({} requests): {}\n", n.get<int>(), msg);

    if (!no_save) {
      std::filesystem::path path = result_file.empty() ? std::filesystem::path(result_dir) / ("serve-" + today() + ".json")
                                                       : std::filesystem::path(result_file);
      if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
      std::ofstream f(path);
      if (!f) throw std::runtime_error(fmt::format("cannot write {}", path.string()));
      f << record.dump(2) << '\n';
      fmt::print("infer-bench-serve: wrote {}\n", path.string());
    }
    return completed == static_cast<int>(prompts.size()) ? 0 : 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "infer-bench-serve: error: {}\n", e.what());
    return 1;
  }
}
