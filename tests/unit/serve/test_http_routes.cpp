// The routing layer without a socket: which handler answers, the API key on /v1/* (the Bearer scheme in
// any case, the key exactly), OpenAI-shaped 401/404/405 and refusals, and every status counted by route.
#include <catch2/catch.hpp>

#include <string>

#include "infer/serve/http_routes.hpp"

using namespace infer;
using namespace infer::serve;
using nlohmann::json;

namespace {
HttpRequest request(std::string method, std::string path, std::string auth = {}) {
  HttpRequest r;
  r.method = std::move(method);
  r.path = std::move(path);
  if (!auth.empty()) r.headers.emplace_back("authorization", std::move(auth));
  return r;
}
bool openai_error(const HttpResponse& r, int status, const char* code = nullptr) {
  const json body = json::parse(r.body);
  return r.status == status && r.content_type == "application/json" && body.contains("error") &&
         body["error"].size() == 4 && (!code || body["error"]["code"] == code);
}
void add_test_routes(HttpRoutes& routes) {
  routes.add("POST", "/v1/completions", [](const HttpRequest& r) {
    HttpResponse res;
    res.body = R"({"ok":true,"body":")" + r.body + "\"}";
    return res;
  });
  routes.add("GET", "/health", [](const HttpRequest&) { return HttpResponse{}; });
  routes.add("GET", "/v1/models", [](const HttpRequest&) -> HttpResponse {
    throw ParamError("model", "no such thing");
  });
}
}  // namespace

TEST_CASE("bearer tokens: the scheme in any case, the key exactly", "[serve][routes]") {
  CHECK(bearer_matches("Bearer k3y", "k3y"));
  CHECK(bearer_matches("bearer k3y", "k3y"));
  CHECK(bearer_matches("BEARER k3y", "k3y"));
  CHECK(bearer_matches("  Bearer   k3y  ", "k3y"));
  CHECK(bearer_matches("Bearer\tk3y", "k3y"));
  CHECK_FALSE(bearer_matches("Bearer K3Y", "k3y"));
  CHECK_FALSE(bearer_matches("Bearer k3y2", "k3y"));
  CHECK_FALSE(bearer_matches("Bearer k3", "k3y"));
  CHECK_FALSE(bearer_matches("Basic k3y", "k3y"));
  CHECK_FALSE(bearer_matches("Bearerk3y", "k3y"));
  CHECK_FALSE(bearer_matches("k3y", "k3y"));
  CHECK_FALSE(bearer_matches("Bearer ", ""));
}

TEST_CASE("routes: /v1/* needs the key, the others do not", "[serve][routes]") {
  HttpRoutes routes("secret");
  add_test_routes(routes);
  const HttpResponse missing = routes.handle(request("POST", "/v1/completions"));
  CHECK(openai_error(missing, 401, "invalid_api_key"));
  CHECK(json::parse(missing.body)["error"]["message"].get<std::string>().find("Missing") != std::string::npos);
  bool www = false;
  for (const auto& [k, v] : missing.headers) www = www || (k == "WWW-Authenticate" && v == "Bearer");
  CHECK(www);
  CHECK(openai_error(routes.handle(request("POST", "/v1/completions", "Bearer wrong")), 401));
  CHECK(routes.handle(request("POST", "/v1/completions", "bearer secret")).status == 200);
  CHECK(routes.handle(request("POST", "/v1/completions", "Bearer secret")).status == 200);
  CHECK(routes.handle(request("GET", "/health")).status == 200);
  // an unknown /v1/ path is refused for the key first, as vLLM does
  CHECK(openai_error(routes.handle(request("GET", "/v1/nothing")), 401));
  CHECK(openai_error(routes.handle(request("GET", "/v1/nothing", "Bearer secret")), 404, "unknown_url"));
}

TEST_CASE("routes: 404 and 405 with Allow, handler errors in OpenAI's shape, labels by known route", "[serve][routes]") {
  HttpRoutes routes("");
  add_test_routes(routes);
  const HttpResponse nf = routes.handle(request("GET", "/nothing/here"));
  CHECK(openai_error(nf, 404, "unknown_url"));
  CHECK(nf.route == "unknown");
  const HttpResponse wrong = routes.handle(request("GET", "/v1/completions"));
  CHECK(openai_error(wrong, 405, "method_not_allowed"));
  CHECK(wrong.route == "/v1/completions");
  REQUIRE(wrong.headers.size() == 1);
  CHECK(wrong.headers[0] == std::pair<std::string, std::string>{"Allow", "POST"});
  CHECK(routes.handle(request("HEAD", "/health")).status == 200);  // a GET route answers HEAD (the transport drops the body)
  CHECK(openai_error(routes.handle(request("HEAD", "/v1/completions")), 405));
  const HttpResponse bad = routes.handle(request("GET", "/v1/models"));
  CHECK(openai_error(bad, 400));
  CHECK(json::parse(bad.body)["error"]["param"] == "model");
  CHECK(bad.route == "/v1/models");
}

TEST_CASE("routes: the transport's refusals and every status counted", "[serve][routes]") {
  HttpRoutes routes("");
  add_test_routes(routes);
  const HttpResponse busy = routes.refuse(503, "too many", "too_many_connections", {});
  CHECK(openai_error(busy, 503, "too_many_connections"));
  CHECK(json::parse(busy.body)["error"]["type"] == "server_error");
  REQUIRE(busy.headers.size() == 1);
  CHECK(busy.headers[0] == std::pair<std::string, std::string>{"Retry-After", "1"});
  const HttpResponse slow = routes.refuse(408, "slow", "request_timeout", "/v1/completions");
  CHECK(openai_error(slow, 408, "request_timeout"));
  CHECK(json::parse(slow.body)["error"]["type"] == "invalid_request_error");
  CHECK(slow.route == "/v1/completions");
  CHECK(routes.refuse(414, "long", "uri_too_long", "/a/path/nobody/serves").route == "unknown");

  routes.sent("/v1/completions", 405);
  routes.sent("unknown", 414);
  routes.sent("unknown", 414);
  routes.sent("/health", 200);
  const auto counts = routes.counts();
  CHECK(counts.at("405 /v1/completions") == 1);
  CHECK(counts.at("414 unknown") == 2);
  CHECK(counts.at("200 /health") == 1);
}
