#pragma once
/// \file
/// What the HTTP transport (http_transport.hpp) and the service above it hand each other: a request read
/// whole, a response, a `ResponseSource` for a response that an engine produces over time, and the
/// `HttpService` interface the transport calls. Plain types,
/// no socket and no Boost: routing (http_routes.hpp) and the OpenAI endpoints are written and unit-tested
/// without a network.
///
/// A `ResponseSource` is how a response waits without holding a thread. The transport's event loop calls
/// `poll()` (which never blocks) when the source has woken it through the waker it was given, or when the
/// source's `deadline()` passes; `poll()` hands back the response's head once (its status and headers: a
/// whole response, or the start of a chunked one) and then body bytes as they are ready. When the client
/// goes away the transport calls `cancel()`, whatever stage the response is in.

#include <algorithm>
#include <cctype>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace infer::serve {

/// ASCII case-insensitive equality (header names, auth schemes).
inline bool iequals(std::string_view a, std::string_view b) noexcept {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

using Headers = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;   ///< as sent: GET, POST, ...
  std::string path;     ///< the target up to '?'
  std::string query;    ///< after '?', without it
  Headers headers;      ///< in the order sent
  std::string body;

  /// The first header named `name` (case-insensitive), if any.
  [[nodiscard]] std::optional<std::string_view> header(std::string_view name) const {
    for (const auto& [k, v] : headers)
      if (iequals(k, name)) return std::string_view(v);
    return std::nullopt;
  }
};

class ResponseSource;

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  Headers headers;               ///< beyond Content-Type, Content-Length / Transfer-Encoding and Connection
  std::string route = "unknown"; ///< the `route` label it is counted under in infer:http_requests_total
  /// Set: the response comes from this source (its status and body too); the fields above are unused.
  std::shared_ptr<ResponseSource> source;

  HttpResponse& header(std::string name, std::string value) {
    headers.emplace_back(std::move(name), std::move(value));
    return *this;
  }
};

/// A response produced over time. All calls come from the transport's event-loop thread except the
/// waker's, which the source calls from any thread.
class ResponseSource {
 public:
  using Clock = std::chrono::steady_clock;

  struct Progress {
    /// Once: the response's status and headers. When `chunked` is false this is the whole response
    /// (its body included) and `done` is true.
    std::optional<HttpResponse> head;
    bool chunked = false;
    std::string data;   ///< chunked: body bytes ready to send now
    bool done = false;  ///< nothing more will come
  };

  virtual ~ResponseSource() = default;

  /// Takes whatever is ready, without blocking.
  virtual Progress poll() = 0;
  /// `wake`, callable from any thread, tells the transport that poll() has something new. Called once,
  /// before the first poll(); events before it are seen by that poll.
  virtual void set_waker(std::function<void()> wake) = 0;
  /// When poll() must run even without a wake (an admission deadline); max() for never.
  [[nodiscard]] virtual Clock::time_point deadline() const { return Clock::time_point::max(); }
  /// Bytes that may go inside the chunked body without changing its meaning (an SSE comment), sent to
  /// learn whether a client that half-closed its side is still there; empty when there are none.
  [[nodiscard]] virtual std::string probe() const { return {}; }
  /// The client is gone: abort what is in progress. poll() is not called after it.
  virtual void cancel() noexcept = 0;
};

/// What the transport serves.
class HttpService {
 public:
  virtual ~HttpService() = default;
  /// A request read whole → its response. On a handler thread: may take CPU time, must not wait on an engine.
  virtual HttpResponse handle(HttpRequest request) = 0;
  /// The response to a request the transport refuses itself (400 unreadable, 408 too slow, 413, 414, 431,
  /// 503 too many connections). On the loop thread; `path` is empty when the request line was not read.
  virtual HttpResponse refuse(int status, std::string message, std::string code, std::string_view path) = 0;
  /// Every response's status as its head goes out, under HttpResponse::route. On the loop thread.
  virtual void sent(const std::string& route, int status) = 0;
};

}  // namespace infer::serve
