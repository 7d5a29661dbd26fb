// Responses assembled from engine streams, without a socket: non-streaming bodies, SSE chunks in
// OpenAI's order (role, content, finish, usage, [DONE]), choice numbering for prompts × n, and
// cancellation of unfinished requests when an exchange is dropped.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "infer/serve/exchange.hpp"
#include "infer/serve/metrics.hpp"

using namespace infer;
using namespace infer::serve;
using nlohmann::json;

namespace {
StreamEvent delta(std::int32_t index, std::string text, std::vector<std::int32_t> ids, FinishReason r = FinishReason::none,
                  bool finished = false) {
  StreamEvent ev;
  ev.samples.push_back(SampleDelta{index, std::move(text), std::move(ids), {}, r});
  ev.finished = finished;
  ev.prompt_tokens = 4;
  return ev;
}
ExchangeSetup setup(bool chat, bool stream) {
  ExchangeSetup s;
  s.chat = chat;
  s.stream = stream;
  s.id = chat ? "chatcmpl-1" : "cmpl-1";
  s.model = "m";
  s.created = 123;
  s.prompt_tokens = {4};
  return s;
}
/// The JSON payloads of an SSE text, and whether it ended with [DONE].
std::vector<json> events_of(const std::string& sse, bool* done) {
  std::vector<json> out;
  *done = false;
  std::size_t pos = 0;
  while ((pos = sse.find("data: ", pos)) != std::string::npos) {
    const auto end = sse.find("\n\n", pos);
    REQUIRE(end != std::string::npos);
    const std::string payload = sse.substr(pos + 6, end - pos - 6);
    if (payload == "[DONE]") *done = true;
    else out.push_back(json::parse(payload));
    pos = end + 2;
  }
  return out;
}
}  // namespace

TEST_CASE("a non-streaming completion concatenates deltas, with usage and finish reason", "[serve][exchange]") {
  auto s = std::make_shared<RequestStream>();
  s->admit(7);
  s->push(delta(0, " Paris", {3}));
  s->push(delta(0, ".", {4}, FinishReason::length, true));
  Exchange ex(setup(false, false), {s});
  while (!ex.finished()) ex.poll(std::chrono::milliseconds(10), nullptr);
  const json body = ex.final_body();
  CHECK(body["object"] == "text_completion");
  CHECK(body["id"] == "cmpl-1");
  CHECK(body["model"] == "m");
  CHECK(body["choices"].size() == 1);
  CHECK(body["choices"][0]["text"] == " Paris.");
  CHECK(body["choices"][0]["finish_reason"] == "length");
  CHECK(body["choices"][0]["logprobs"].is_null());
  CHECK(body["usage"]["prompt_tokens"] == 4);
  CHECK(body["usage"]["completion_tokens"] == 2);
  CHECK(body["usage"]["total_tokens"] == 6);
  CHECK_FALSE(ex.error());
}

TEST_CASE("a streamed chat: role first, one chunk per delta, usage chunk, [DONE]", "[serve][exchange]") {
  auto s = std::make_shared<RequestStream>();
  s->admit(1);
  auto st = setup(true, true);
  st.stream_options.include_usage = true;
  Exchange ex(std::move(st), {s});
  std::string sse;
  ex.poll(std::chrono::milliseconds(1), &sse);  // nothing from the engine yet: only the role chunk
  s->push(delta(0, "Hi", {5}));
  s->push(delta(0, "!", {6}, FinishReason::stop, true));
  while (!ex.finished()) ex.poll(std::chrono::milliseconds(10), &sse);
  sse += ex.stream_tail();
  bool done = false;
  const auto evs = events_of(sse, &done);
  CHECK(done);
  REQUIRE(evs.size() == 4);
  CHECK(evs[0]["object"] == "chat.completion.chunk");
  CHECK(evs[0]["choices"][0]["delta"]["role"] == "assistant");
  CHECK(evs[0]["usage"].is_null());
  CHECK(evs[1]["choices"][0]["delta"]["content"] == "Hi");
  CHECK(evs[1]["choices"][0]["finish_reason"].is_null());
  CHECK(evs[2]["choices"][0]["delta"]["content"] == "!");
  CHECK(evs[2]["choices"][0]["finish_reason"] == "stop");
  CHECK(evs[3]["choices"].empty());
  CHECK(evs[3]["usage"]["completion_tokens"] == 2);
  CHECK(evs[3]["usage"]["prompt_tokens"] == 4);
}

TEST_CASE("without include_usage no chunk carries usage", "[serve][exchange]") {
  auto s = std::make_shared<RequestStream>();
  s->admit(1);
  Exchange ex(setup(false, true), {s});
  s->push(delta(0, "x", {5}, FinishReason::length, true));
  std::string sse;
  while (!ex.finished()) ex.poll(std::chrono::milliseconds(10), &sse);
  sse += ex.stream_tail();
  bool done = false;
  const auto evs = events_of(sse, &done);
  CHECK(done);
  REQUIRE(evs.size() == 1);
  CHECK_FALSE(evs[0].contains("usage"));
  CHECK(evs[0]["choices"][0]["text"] == "x");
}

TEST_CASE("k prompts × n samples are choices prompt*n + sample", "[serve][exchange]") {
  auto a = std::make_shared<RequestStream>(), b = std::make_shared<RequestStream>();
  a->admit(1);
  b->admit(2);
  auto st = setup(false, false);
  st.n = 2;
  st.prompt_tokens = {4, 6};
  Exchange ex(std::move(st), {a, b});
  a->push(delta(1, "a1", {1}, FinishReason::length, false));
  a->push(delta(0, "a0", {2}, FinishReason::length, true));
  StreamEvent ev = delta(0, "b0", {3}, FinishReason::stop);
  ev.samples.push_back(SampleDelta{1, "b1", {4, 5}, {}, FinishReason::length});
  ev.finished = true;
  ev.prompt_tokens = 6;
  b->push(ev);
  while (!ex.finished()) ex.poll(std::chrono::milliseconds(10), nullptr);
  const json body = ex.final_body();
  REQUIRE(body["choices"].size() == 4);
  CHECK(body["choices"][0]["text"] == "a0");
  CHECK(body["choices"][1]["text"] == "a1");
  CHECK(body["choices"][2]["text"] == "b0");
  CHECK(body["choices"][3]["text"] == "b1");
  CHECK(body["choices"][3]["index"] == 3);
  CHECK(body["usage"]["prompt_tokens"] == 10);
  CHECK(body["usage"]["completion_tokens"] == 5);
}

TEST_CASE("dropping an exchange cancels the requests that have not finished", "[serve][exchange]") {
  auto done = std::make_shared<RequestStream>(), running = std::make_shared<RequestStream>();
  done->admit(1);
  running->admit(2);
  {
    Exchange ex(setup(false, false), {done, running});
    done->push(delta(0, "x", {1}, FinishReason::stop, true));
    ex.poll(std::chrono::milliseconds(10), nullptr);
    CHECK_FALSE(ex.finished());
  }
  CHECK_FALSE(done->cancelled());
  CHECK(running->cancelled());
}

TEST_CASE("an engine failure or a shutdown abort becomes an error, not a finish reason", "[serve][exchange]") {
  auto s = std::make_shared<RequestStream>();
  s->admit(1);
  Exchange ex(setup(false, true), {s});
  s->push(delta(0, "", {}, FinishReason::abort, true));
  std::string sse;
  while (!ex.finished()) ex.poll(std::chrono::milliseconds(10), &sse);
  REQUIRE(ex.error());
  CHECK_THAT(*ex.error(), Catch::Contains("shutting down"));
  bool d = false;
  const auto evs = events_of(sse + ex.stream_tail(), &d);
  CHECK(d);
  CHECK(evs.back()["error"]["type"] == "server_error");
}

TEST_CASE("make_event turns cumulative engine output into deltas, each finish once", "[serve][exchange]") {
  RequestOutput out;
  out.outputs.resize(2);
  out.outputs[0].index = 0;
  out.outputs[1].index = 1;
  out.outputs[0].delta_text = "a";
  out.outputs[0].delta_token_ids = {1};
  out.outputs[0].finish_reason = FinishReason::length;
  std::vector<bool> reported;
  StreamEvent e1 = make_event(out, reported);
  REQUIRE(e1.samples.size() == 1);
  CHECK(e1.samples[0].finish_reason == FinishReason::length);
  out.outputs[0].delta_text.clear();
  out.outputs[0].delta_token_ids.clear();
  out.outputs[1].delta_text = "b";
  out.outputs[1].delta_token_ids = {2};
  StreamEvent e2 = make_event(out, reported);
  REQUIRE(e2.samples.size() == 1);  // sample 0's finish is not repeated
  CHECK(e2.samples[0].index == 1);
}

TEST_CASE("logprobs in each endpoint's shape, -inf clamped", "[serve][exchange]") {
  std::vector<TokenLogprob> lps{{5, -0.5f, {{5, -0.5f}, {6, -1.5f}}}, {7, -std::numeric_limits<float>::infinity(), {}}};
  const json c = completion_logprobs(nullptr, lps, 3, 2);
  CHECK(c["tokens"].size() == 2);
  CHECK(c["token_logprobs"][0] == Approx(-0.5));
  CHECK(c["token_logprobs"][1] == Approx(-9999.0));
  CHECK(c["top_logprobs"][0].size() == 2);
  CHECK(c["text_offset"][0] == 3);
  const json ch = chat_logprobs(nullptr, lps, 1);
  CHECK(ch["content"].size() == 2);
  CHECK(ch["content"][0]["top_logprobs"].size() == 1);
  CHECK(ch["content"][0]["logprob"] == Approx(-0.5));
}

TEST_CASE("Prometheus text: one HELP/TYPE per family, cumulative buckets", "[serve][metrics]") {
  Histogram h({0.1, 1.0});
  h.observe(0.05);
  h.observe(0.5);
  h.observe(5);
  PrometheusWriter w;
  w.gauge("infer:g", "a gauge", {{"engine", "a"}}, 1);
  w.gauge("infer:g", "a gauge", {{"engine", "b\"q"}}, 2);
  w.histogram("infer:h", "a histogram", {{"engine", "a"}}, h.snapshot());
  const std::string t = w.str();
  CHECK(t.find("# TYPE infer:g gauge") == t.rfind("# TYPE infer:g gauge"));
  CHECK(t.find("infer:g{engine=\"b\\\"q\"} 2") != std::string::npos);
  CHECK(t.find("infer:h_bucket{engine=\"a\",le=\"0.10000000000000001\"} 1") != std::string::npos);
  CHECK(t.find("infer:h_bucket{engine=\"a\",le=\"1\"} 2") != std::string::npos);
  CHECK(t.find("infer:h_bucket{engine=\"a\",le=\"+Inf\"} 3") != std::string::npos);
  CHECK(t.find("infer:h_count{engine=\"a\"} 3") != std::string::npos);
  CHECK(t.find("infer:h_sum{engine=\"a\"} 5.5") != std::string::npos);
}
