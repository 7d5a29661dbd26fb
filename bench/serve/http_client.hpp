#pragma once
// infer-bench-serve's HTTP/1.1 client: Boost.Asio coroutines on one event loop (Boost.Beast parses the
// responses), so a run holds as many requests in flight as it asks for without a thread each, as vLLM's
// benchmark does with asyncio and aiohttp.
//
// Connections are kept alive and reused by default (a pool of idle ones, as aiohttp's session keeps):
// the benchmark then measures the server's serving, not its TCP handshakes. `keep_alive = false` opens a
// new connection per request and sends `Connection: close` (the benchmark's old way). A request that
// fails on a reused connection before any byte of the response came back is sent once more on a new
// one: the server may have closed the idle connection just as it was picked.
//
// Every failure is classified by cause — connect, reset, closed (the server ended the connection before
// the response did), timeout, http (a status other than 200), stream (a malformed event stream) — so a
// run reports what went wrong, not only how often.
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace bench {

namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using error_code = boost::system::error_code;

/// Why a request failed.
enum class Cause { none, connect, reset, closed, timeout, http, stream };

inline const char* to_string(Cause c) {
  switch (c) {
    case Cause::none: return "none";
    case Cause::connect: return "connect";
    case Cause::reset: return "reset";
    case Cause::closed: return "closed";
    case Cause::timeout: return "timeout";
    case Cause::http: return "http";
    case Cause::stream: return "stream";
  }
  return "?";
}

/// What one exchange came to. The body callback has seen the 200 body as it arrived.
struct Reply {
  Cause cause = Cause::none;
  std::string error;   ///< what failed, for the record
  int status = 0;
  std::string body;    ///< a status other than 200: its body (for the error message)
  std::string engine;  ///< the X-Infer-Engine header, when the server sends one
};

struct ClientOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  bool keep_alive = true;
  std::chrono::milliseconds connect_timeout{10000};
  std::chrono::milliseconds timeout{600000};  ///< one request, from its start to its last byte
};

class Client {
 public:
  /// `on_body(bytes)` receives a 200 response's body as it arrives; returning false ends the request
  /// (its Reply is then what the callback says went wrong: set through fail()).
  using BodyCallback = std::function<bool(std::string_view)>;

  Client(net::io_context& ioc, ClientOptions o) : ioc_(ioc), o_(std::move(o)) {}

  /// Sends one request and reads its response.
  net::awaitable<Reply> request(std::string method, std::string target, std::string body, BodyCallback on_body) {
    Reply reply;
    for (int attempt = 0; attempt < 2; ++attempt) {
      bool reused = false;
      // The resend opens a new connection: when the server hung up on one idle connection it has often
      // hung up on the others too (llama-server closes after nearly every reply, without saying so).
      std::optional<tcp::socket> sock = co_await acquire(reply, reused, /*fresh=*/attempt > 0);
      if (!sock) co_return reply;
      bool any_byte = false;
      reply = co_await exchange(*sock, method, target, body, on_body, any_byte);
      if (reply.cause == Cause::none || !reused || any_byte ||
          (reply.cause != Cause::closed && reply.cause != Cause::reset))
        co_return reply;
      ++retried_;  // a kept-alive connection the server had just closed: once more on a new one
    }
    co_return reply;
  }

  /// Requests sent again after a reused connection turned out closed, and connections opened.
  [[nodiscard]] std::size_t retried() const noexcept { return retried_; }
  [[nodiscard]] std::size_t connections_opened() const noexcept { return opened_; }

 private:
  /// An idle kept-alive connection (unless `fresh`), or a new one; nullopt (reply says why) when connecting
  /// failed.
  net::awaitable<std::optional<tcp::socket>> acquire(Reply& reply, bool& reused, bool fresh) {
    while (!fresh && !idle_.empty()) {
      tcp::socket s = std::move(idle_.back());
      idle_.pop_back();
      if (s.is_open()) {
        reused = true;
        co_return std::optional<tcp::socket>(std::move(s));
      }
    }
    error_code ec;
    tcp::resolver resolver(ioc_);
    const auto endpoints = co_await resolver.async_resolve(o_.host, std::to_string(o_.port),
                                                           net::redirect_error(net::use_awaitable, ec));
    if (ec) {
      reply.cause = Cause::connect;
      reply.error = "connect: cannot resolve " + o_.host + ": " + ec.message();
      co_return std::nullopt;
    }
    tcp::socket s(ioc_);
    net::steady_timer timer(ioc_, o_.connect_timeout);
    bool timed_out = false;
    timer.async_wait([&](const error_code& e) {
      if (!e) {
        timed_out = true;
        error_code ignored;
        s.close(ignored);
      }
    });
    co_await net::async_connect(s, endpoints, net::redirect_error(net::use_awaitable, ec));
    timer.cancel();
    if (ec) {
      reply.cause = Cause::connect;
      reply.error = timed_out ? "connect: timed out" : "connect: " + ec.message();
      co_return std::nullopt;
    }
    ++opened_;
    s.set_option(tcp::no_delay(true), ec);
    co_return std::optional<tcp::socket>(std::move(s));
  }

  net::awaitable<Reply> exchange(tcp::socket& s, const std::string& method, const std::string& target,
                                 const std::string& body, const BodyCallback& on_body, bool& any_byte) {
    Reply r;
    http::request<http::string_body> req{method == "GET" ? http::verb::get : http::verb::post, target, 11};
    req.set(http::field::host, o_.host);
    req.set(http::field::user_agent, "infer-bench-serve");
    if (!o_.api_key.empty()) req.set(http::field::authorization, "Bearer " + o_.api_key);
    if (!body.empty()) req.set(http::field::content_type, "application/json");
    req.keep_alive(o_.keep_alive);
    req.body() = body;
    req.prepare_payload();

    // The whole request under one deadline: a timer that closes the socket.
    bool timed_out = false;
    net::steady_timer timer(ioc_, o_.timeout);
    timer.async_wait([&](const error_code& e) {
      if (!e) {
        timed_out = true;
        error_code ignored;
        s.close(ignored);
      }
    });
    auto fail = [&](const error_code& ec, const char* stage) {
      if (timed_out) {
        r.cause = Cause::timeout;
        r.error = "timeout: no complete response within " + std::to_string(o_.timeout.count() / 1000) + " s";
      } else if (ec == net::error::connection_reset || ec == net::error::broken_pipe) {
        r.cause = Cause::reset;
        r.error = std::string("reset: the connection was reset ") + stage;
      } else if (ec == http::error::end_of_stream || ec == net::error::eof || ec == http::error::partial_message) {
        r.cause = Cause::closed;
        r.error = std::string("closed: the server closed the connection ") + stage;
      } else {
        r.cause = Cause::closed;
        r.error = std::string("closed: ") + ec.message() + " " + stage;
      }
    };

    error_code ec;
    co_await http::async_write(s, req, net::redirect_error(net::use_awaitable, ec));
    if (ec) {
      fail(ec, "while sending the request");
      co_return r;
    }
    boost::beast::flat_buffer buf;
    http::response_parser<http::string_body> parser;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());  // (boost::none: Beast 1.74 then refuses every Content-Length)
    bool stopped = false;
    auto chunk_body = [&](std::uint64_t, boost::beast::string_view data, error_code& e) -> std::size_t {
      if (r.status == 200 && !stopped && !on_body(std::string_view(data.data(), data.size()))) {
        stopped = true;
        e = http::error::end_of_chunk;  // ends the read; the reply says why from the callback
      }
      return data.size();
    };
    parser.on_chunk_body(chunk_body);  // held by reference: lives in this frame
    co_await http::async_read_header(s, buf, parser, net::redirect_error(net::use_awaitable, ec));
    any_byte = buf.size() > 0 || parser.got_some();
    if (ec) {
      fail(ec, "before the response");
      co_return r;
    }
    r.status = static_cast<int>(parser.get().result_int());
    if (auto it = parser.get().find("X-Infer-Engine"); it != parser.get().end())
      r.engine = std::string(it->value().data(), it->value().size());
    while (!parser.is_done() && !stopped) {
      co_await http::async_read_some(s, buf, parser, net::redirect_error(net::use_awaitable, ec));
      if (ec) break;
    }
    timer.cancel();
    if (stopped) {
      r.cause = Cause::stream;
      s.close(ec);
      co_return r;
    }
    if (ec) {
      fail(ec, "in the middle of the response");
      co_return r;
    }
    if (r.status != 200) {
      r.cause = Cause::http;
      r.body = std::move(parser.get().body());
    } else if (!parser.get().chunked() && !parser.get().body().empty()) {
      on_body(parser.get().body());  // a whole 200 body (not an event stream)
    }
    if (o_.keep_alive && parser.get().keep_alive()) idle_.push_back(std::move(s));
    else s.close(ec);
    co_return r;
  }

  net::io_context& ioc_;
  ClientOptions o_;
  std::vector<tcp::socket> idle_;
  std::size_t retried_ = 0, opened_ = 0;
};

}  // namespace bench
