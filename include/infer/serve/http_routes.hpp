#pragma once
/// \file
/// `HttpRoutes`: which handler answers a request, and what every response shares — the `HttpService` the
/// transport (http_transport.hpp) serves. A handler is registered for a path and a method (a GET handler
/// answers HEAD too); a request for a path nobody serves is 404, for a known path with another method 405
/// (with `Allow`). With an API key,
/// every /v1/* path needs `Authorization: Bearer KEY` (the scheme in any case, RFC 7235; the key exactly),
/// else 401; probes and scrapers reach the others without it, as in vLLM. Every error — a handler's
/// exception, a refusal, one the transport makes itself (408, 413, 414, 431, 503) — gets OpenAI's body
/// (api_error.hpp), and every response's status is counted under its route for infer:http_requests_total.
/// Routes are labelled by the server's own paths only, "unknown" otherwise: a label per arbitrary path
/// would let clients grow the metrics without bound.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "infer/serve/api_error.hpp"
#include "infer/serve/http_message.hpp"
#include "infer/serve/metrics.hpp"

namespace infer::serve {

/// Whether `authorization` (an Authorization header's value) carries `key` as a bearer token: the scheme
/// matched in any case, the token exactly, in a time that does not depend on where it differs.
inline bool bearer_matches(std::string_view authorization, std::string_view key) {
  auto trim = [](std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
  };
  authorization = trim(authorization);
  const auto space = authorization.find_first_of(" \t");
  if (space == std::string_view::npos || !iequals(authorization.substr(0, space), "bearer")) return false;
  const std::string_view token = trim(authorization.substr(space));
  if (key.empty() || token.size() != key.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < key.size(); ++i) diff |= static_cast<unsigned char>(token[i] ^ key[i]);
  return diff == 0;
}

class HttpRoutes final : public HttpService {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  explicit HttpRoutes(std::string api_key) : api_key_(std::move(api_key)) {}

  /// `method` on `path` is answered by `handler`.
  void add(const std::string& method, const std::string& path, Handler handler) {
    routes_[path].emplace_back(method, std::move(handler));
  }

  HttpResponse handle(HttpRequest req) override {
    const auto route = routes_.find(req.path);
    const std::string label = route == routes_.end() ? "unknown" : req.path;
    HttpResponse res = dispatch(req, route);
    res.route = label;
    return res;
  }

  HttpResponse refuse(int status, std::string message, std::string code, std::string_view path) override {
    ApiError e{status, std::move(message), status < 500 ? "invalid_request_error" : "server_error", std::nullopt,
               std::move(code), status == 503 ? std::optional<int>(1) : std::nullopt};
    HttpResponse r = error_response(e);
    r.route = routes_.count(std::string(path)) ? std::string(path) : "unknown";
    return r;
  }

  void sent(const std::string& route, int status) override { counts_.add(std::to_string(status) + " " + route); }

  /// Responses sent so far: {"STATUS ROUTE": count}.
  [[nodiscard]] std::map<std::string, std::uint64_t> counts() const { return counts_.snapshot(); }

 private:
  using Table = std::map<std::string, std::vector<std::pair<std::string, Handler>>>;

  HttpResponse dispatch(const HttpRequest& req, Table::const_iterator route) const {
    if (!api_key_.empty() && req.path.rfind("/v1/", 0) == 0) {
      const auto auth = req.header("Authorization");
      if (!auth || !bearer_matches(*auth, api_key_))
        return error_response(ApiError::unauthorized(auth ? "Incorrect API key provided"
                                                 : "Missing API key: send it as 'Authorization: Bearer <key>'"));
    }
    if (route == routes_.end())
      return error_response(ApiError::not_found(infer::detail::cat("Not found: ", req.method, " ", req.path), std::nullopt,
                                       "unknown_url"));
    std::string allowed;
    for (const auto& [method, handler] : route->second) {
      if (method == req.method || (method == "GET" && req.method == "HEAD")) {  // HEAD: GET's head (the transport drops the body)
        try {
          return handler(req);
        } catch (const std::exception& e) {
          return error_response(to_api_error(e));
        }
      }
      allowed += (allowed.empty() ? "" : ", ") + method;
    }
    HttpResponse r = error_response({405, infer::detail::cat("Method ", req.method, " is not allowed on ", req.path, "; use ", allowed),
                            "invalid_request_error", std::nullopt, "method_not_allowed", std::nullopt});
    r.header("Allow", allowed);
    return r;
  }

  std::string api_key_;
  Table routes_;
  LabeledCounter counts_;
};

}  // namespace infer::serve
