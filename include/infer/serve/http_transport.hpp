#pragma once
/// \file
/// `HttpTransport`: HTTP/1.1 over TCP on one Boost.Asio event loop, requests parsed by Boost.Beast. It owns
/// the sockets and nothing else: what a request means is the `HttpService`'s business (http_routes.hpp).
///
/// Why an event loop. A thread per connection (cpp-httplib's model, which this replaced) bounds open
/// streams by the pool, lets a slow client hold a thread for as long as it likes, and notices a client that
/// hung up only at the next write. Here a connection is a coroutine on one loop thread: a thousand open
/// streams cost a thousand sockets and buffers, not a thousand threads, and each connection keeps a read
/// pending while its response waits, so a hang-up is seen when it happens.
///
/// What a connection may take, each a deadline of its own:
///   - `header_timeout` for the request line and headers, counted from their first byte (a new connection
///     that sends nothing is closed at the same deadline). Bytes trickling in do not extend it: 200 clients
///     sending a byte a second are all cut at the deadline (408) and cost the others nothing.
///   - `body_timeout` for the body; a Content-Length the client never fills is cut there (408).
///   - `keep_alive_timeout` idle between requests; then the connection closes quietly.
///   - `write_timeout` for each write: a client that stops reading its stream is cut.
///   - beyond `max_connections` open, a new connection is answered 503 at once and closed.
/// Oversized requests are refused from their headers: a Content-Length beyond `max_body_bytes` is 413
/// before a byte of the body is stored, a target beyond `max_target_bytes` 414, headers beyond
/// `max_header_bytes` 431. After a refusal the connection reads and drops what the client still sends for
/// up to `linger` before closing, so the client reads the answer instead of a reset.
///
/// Handlers run on `handler_threads` (parsing, validation, tokenization: CPU work that must not stall the
/// loop). A handler never waits on an engine: a response that depends on one is a `ResponseSource`
/// (http_message.hpp), which the loop polls when it is woken. While such a response is pending, the loop
/// watches the socket: a reset, or an end of input that a probe shows to be a full close, cancels the
/// source at once — waiting, prefilling or decoding, streaming or not. A client that only half-closed
/// (shutdown(SHUT_WR) after a complete request) is still answered: the probe (`100 Continue` before the
/// head, an SSE comment inside a stream) reaches it, where a closed socket answers with a reset, which
/// TCP_INFO then shows.
///
/// The listen backlog is the system's maximum (net.core.somaxconn): a burst of connections waits in the
/// kernel's queue instead of overflowing it into SYN cookies and resets.

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_set>
#include <utility>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include "infer/serve/http_message.hpp"

namespace infer::serve {

struct TransportOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  ///< 0: any free port (HttpTransport::port() says which)
  std::size_t max_connections = 4096;
  std::size_t max_body_bytes = std::size_t{4} << 20;
  std::size_t max_header_bytes = std::size_t{64} << 10;  ///< request line + headers: 431 beyond
  std::size_t max_target_bytes = std::size_t{8} << 10;   ///< the request target: 414 beyond
  std::chrono::milliseconds header_timeout{5000};
  std::chrono::milliseconds body_timeout{30000};
  std::chrono::milliseconds keep_alive_timeout{5000};
  std::chrono::milliseconds write_timeout{30000};
  std::chrono::milliseconds linger{2000};      ///< after a refusal: how long to drop what the client still sends
  std::chrono::milliseconds stop_grace{5000};  ///< stop(): how long responses in progress may take
  std::size_t handler_threads = 4;
};

class HttpTransport {
 public:
  using Clock = std::chrono::steady_clock;

  HttpTransport(TransportOptions options, HttpService& service)
      : o_(std::move(options)), service_(service), pool_(o_.handler_threads ? o_.handler_threads : 1),
        acceptor_(ioc_), work_(boost::asio::make_work_guard(ioc_)) {}
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;
  ~HttpTransport() {
    stop();
    pool_.join();
    destroying_ = true;  // what the loop still holds goes with it, after the members declared after it
  }

  /// Opens, binds and listens; false (with the reason in `error`) when the address is taken or invalid.
  bool bind(std::string* error = nullptr) {
    namespace net = boost::asio;
    boost::system::error_code ec;
    const auto address = net::ip::make_address(o_.host, ec);
    if (!ec) {
      const net::ip::tcp::endpoint at(address, static_cast<unsigned short>(o_.port));
      acceptor_.open(at.protocol(), ec);
      if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
      if (!ec) acceptor_.bind(at, ec);
      if (!ec) acceptor_.listen(listen_backlog(), ec);
      if (!ec) port_ = acceptor_.local_endpoint(ec).port();
    }
    if (ec && error) *error = ec.message();
    return !ec;
  }
  [[nodiscard]] int port() const noexcept { return port_; }
  /// The backlog bind() listens with: the kernel's maximum (net.core.somaxconn), SOMAXCONN if unreadable.
  static int listen_backlog() {
    std::ifstream f("/proc/sys/net/core/somaxconn");
    int n = 0;
    return f >> n && n > 0 ? n : SOMAXCONN;
  }

  /// Runs the event loop on the calling thread until stop() has ended every connection.
  void serve() {
    boost::asio::co_spawn(ioc_, accept_loop(), boost::asio::detached);
    ioc_.run();
  }

  /// Closes the listener and idle connections; responses in progress may finish within stop_grace, then
  /// every connection is closed and serve() returns. Any thread; idempotent.
  void stop() {
    if (stopping_.exchange(true)) return;
    boost::asio::post(ioc_, [this] { begin_stop(); });
  }

  [[nodiscard]] std::size_t open_connections() const noexcept { return open_.load(); }
  [[nodiscard]] const TransportOptions& options() const noexcept { return o_; }

 private:
  class Connection;
  using Awaitable = boost::asio::awaitable<void>;

  boost::asio::awaitable<void> accept_loop();
  void begin_stop();
  void maybe_finish_stop() {
    if (!stopping_ || !connections_.empty()) return;
    if (grace_) grace_->cancel();
    work_.reset();  // serve() returns once the loop has run what is left
  }
  /// The handler, on the pool; its response comes back on the loop.
  template <class Token>
  auto async_handle(HttpRequest request, Token&& token) {
    namespace net = boost::asio;
    return net::async_initiate<Token, void(HttpResponse)>(
        [this](auto handler, HttpRequest req) {
          auto ex = net::get_associated_executor(handler, ioc_.get_executor());
          net::post(pool_, [this, req = std::move(req), handler = std::move(handler), ex]() mutable {
            HttpResponse res = call_service(std::move(req));
            net::post(ex, [handler = std::move(handler), res = std::move(res)]() mutable { std::move(handler)(std::move(res)); });
          });
        },
        token, std::move(request));
  }
  HttpResponse call_service(HttpRequest request) {
    try {
      return service_.handle(std::move(request));
    } catch (const std::exception& e) {
      return service_.refuse(500, e.what(), "internal_error", {});
    }
  }

  TransportOptions o_;
  HttpService& service_;
  std::atomic<bool> stopping_{false};
  std::atomic<std::size_t> open_{0};
  // The loop thread's (declared before the loop: connections the loop never ran are destroyed with it).
  std::unordered_set<Connection*> connections_;  ///< open, serving or being refused
  std::size_t serving_ = 0;                      ///< connections served (not refused)
  bool destroying_ = false;
  boost::asio::thread_pool pool_;
  boost::asio::io_context ioc_{1};
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::optional<boost::asio::steady_timer> grace_;
  int port_ = 0;
};

// ---- one connection ---------------------------------------------------------------------------------------
//
// The coroutines below never take a temporary as an argument: GCC 12 destroyed a prvalue argument of a
// co_awaited coroutine a second time (free(): invalid pointer in write(), a crash in refuse_with()), so
// every such argument is a named local moved in, and no co_await sits inside a condition or a ?:.

class HttpTransport::Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(HttpTransport& t, boost::asio::ip::tcp::socket socket)
      : t_(t), socket_(std::move(socket)), deadline_timer_(socket_.get_executor()), wake_timer_(socket_.get_executor()) {
    t_.connections_.insert(this);
    t_.open_.fetch_add(1);
    boost::system::error_code ec;
    socket_.set_option(boost::asio::ip::tcp::no_delay(true), ec);  // a head and its body, or an SSE event, go at once
  }
  ~Connection() {
    t_.connections_.erase(this);
    t_.open_.fetch_sub(1);
    if (!t_.destroying_) t_.maybe_finish_stop();
  }

  /// The connection's life: requests in turn until the client or a deadline ends it.
  static Awaitable run(std::shared_ptr<Connection> self) {
    self->start_deadline_watch();
    co_await self->serve_requests();
    self->close();
    --self->t_.serving_;
  }

  /// A refused connection (beyond max_connections): 503 at once, then close.
  static Awaitable refuse(std::shared_ptr<Connection> self) {
    self->start_deadline_watch();
    HttpResponse r = self->t_.service_.refuse(503, "the server has too many open connections; retry later",
                                              "too_many_connections", {});
    co_await self->refuse_with(std::move(r));
    self->close();
  }

  /// stop(): an idle connection closes now; one in the middle of a request finishes it and then closes.
  void on_stop() {
    keep_alive_ = false;
    if (phase_ == Phase::idle) cancel_io();
  }
  /// stop_grace passed: whatever is left closes.
  void force_close() {
    forced_ = true;
    cancel_io();
    wake();
  }

 private:
  using tcp = boost::asio::ip::tcp;
  using error_code = boost::system::error_code;
  enum class Phase { idle, reading, handling, responding };
  static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";

  static auto ec_token(error_code& ec) { return boost::asio::redirect_error(boost::asio::use_awaitable, ec); }
  template <class View>
  static std::string str(const View& v) {
    return std::string(v.data(), v.size());
  }

  // ---- deadlines: one timer; when it fires past deadline_ the socket's operations are cancelled ------

  void start_deadline_watch() {
    deadline_timer_.expires_at(Clock::time_point::max());
    deadline_timer_.async_wait([self = shared_from_this()](error_code) { self->on_deadline_timer(); });
  }
  void on_deadline_timer() {
    if (closed_) return;
    if (Clock::now() >= deadline_) {
      timed_out_ = true;
      deadline_ = Clock::time_point::max();
      cancel_io();
    }
    deadline_timer_.expires_at(deadline_);
    deadline_timer_.async_wait([self = shared_from_this()](error_code) { self->on_deadline_timer(); });
  }
  /// The next socket operations must complete by `at` (max(): no deadline).
  void arm(Clock::time_point at) {
    timed_out_ = false;
    deadline_ = at;
    deadline_timer_.expires_at(at);  // cancels the pending wait, whose handler waits again for `at`
  }
  void disarm() { arm(Clock::time_point::max()); }
  void cancel_io() {
    error_code ec;
    socket_.cancel(ec);
  }
  void close() {
    closed_ = true;
    error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    deadline_timer_.cancel();
    wake_timer_.cancel();
  }

  // ---- wake-ups: from a response source (any thread, through the loop) or the socket watch ---------

  /// What a source's waker holds: posting at most one wake at a time, the connection by weak reference.
  struct Signal {
    std::atomic<bool> pending{false};
    std::weak_ptr<Connection> conn;
  };
  void wake() {
    woken_ = true;
    wake_timer_.cancel();
  }
  /// Returns at a wake, or at `until`.
  Awaitable wait_wake(Clock::time_point until) {
    if (!woken_) {
      error_code ec;
      wake_timer_.expires_at(until);
      co_await wake_timer_.async_wait(ec_token(ec));
    }
    woken_ = false;
  }

  // ---- requests ------------------------------------------------------------------------------------

  Awaitable serve_requests() {
    namespace http = boost::beast::http;
    for (bool first = true; !forced_; first = false) {
      // Idle until a request starts: the header deadline on a new connection, keep-alive after a response.
      phase_ = Phase::idle;
      head_only_ = false;
      if (!keep_alive_) co_return;
      error_code ec;
      if (buffer_.size() == 0) {
        arm(Clock::now() + (first ? t_.o_.header_timeout : t_.o_.keep_alive_timeout));
        const std::size_t n = co_await socket_.async_read_some(buffer_.prepare(4096), ec_token(ec));
        if (ec) co_return;  // closed, reset, or quiet past the deadline: nothing to answer
        buffer_.commit(n);
      }
      phase_ = Phase::reading;
      arm(Clock::now() + t_.o_.header_timeout);
      http::request_parser<http::string_body> parser;
      parser.header_limit(static_cast<std::uint32_t>(t_.o_.max_header_bytes));
      parser.body_limit(t_.o_.max_body_bytes);
      co_await http::async_read_header(socket_, buffer_, parser, ec_token(ec));
      if (ec) {
        std::string unknown;
        co_await refuse_read(ec, std::move(unknown));
        co_return;
      }
      auto& msg = parser.get();
      version_ = msg.version();
      const std::string_view target(msg.target().data(), msg.target().size());
      const std::string_view path = target.substr(0, target.find('?'));
      if (target.size() > t_.o_.max_target_bytes) {
        HttpResponse r = t_.service_.refuse(414, "the request target is longer than the server's limit of " +
                                                     std::to_string(t_.o_.max_target_bytes) + " bytes",
                                            "uri_too_long", {});
        co_await refuse_with(std::move(r));
        co_return;
      }
      if (!parser.is_done()) {
        if (iequals(std::string_view(msg[http::field::expect].data(), msg[http::field::expect].size()), "100-continue") &&
            version_ >= 11) {
          std::string cont(kContinue);
          const bool ok = co_await write(std::move(cont));
          if (!ok) co_return;
        }
        arm(Clock::now() + t_.o_.body_timeout);
        co_await http::async_read(socket_, buffer_, parser, ec_token(ec));
        if (ec) {
          std::string p(path);
          co_await refuse_read(ec, std::move(p));
          co_return;
        }
      }
      disarm();
      keep_alive_ = keep_alive_ && msg.keep_alive() && !t_.stopping_;
      head_only_ = msg.method() == http::verb::head;
      HttpRequest req;
      req.method = str(msg.method_string());
      req.path = std::string(path);
      if (path.size() < target.size()) req.query = std::string(target.substr(path.size() + 1));
      for (const auto& f : msg) req.headers.emplace_back(str(f.name_string()), str(f.value()));
      req.body = std::move(msg.body());

      phase_ = Phase::handling;
      HttpResponse res = co_await t_.async_handle(std::move(req), boost::asio::use_awaitable);
      phase_ = Phase::responding;
      bool ok = false;
      if (res.source) ok = co_await respond_from(std::move(res.source), res.route);
      else ok = co_await respond(std::move(res));
      if (!ok) co_return;
    }
  }

  /// A request that could not be read whole: answered when the client may still be listening.
  Awaitable refuse_read(error_code ec, std::string path) {
    namespace http = boost::beast::http;
    const bool left = ec == http::error::end_of_stream || ec == http::error::partial_message ||
                      ec == boost::asio::error::eof || ec == boost::asio::error::connection_reset;
    if ((left || ec == boost::asio::error::operation_aborted) && !timed_out_) co_return;  // no one to answer
    HttpResponse r;
    if (ec == http::error::body_limit)
      r = t_.service_.refuse(413, "The request body is larger than the server's limit of " +
                                      std::to_string(t_.o_.max_body_bytes) + " bytes",
                             "request_too_large", path);
    else if (ec == http::error::header_limit)
      r = t_.service_.refuse(431, "the request's headers are longer than the server's limit of " +
                                      std::to_string(t_.o_.max_header_bytes) + " bytes",
                             "headers_too_large", path);
    else if (timed_out_)
      r = t_.service_.refuse(408,
                             path.empty() ? "the request's headers did not arrive within " +
                                                std::to_string(t_.o_.header_timeout.count()) + " ms"
                                          : "the request's body did not arrive within " +
                                                std::to_string(t_.o_.body_timeout.count()) + " ms",
                             "request_timeout", path);
    else
      r = t_.service_.refuse(400, "the request is not valid HTTP/1.1: " + ec.message(), "bad_request", path);
    co_await refuse_with(std::move(r));
  }

  /// Answers a refusal, then closes: the client's unread bytes are dropped for up to `linger` first.
  Awaitable refuse_with(HttpResponse r) {
    keep_alive_ = false;
    const bool ok = co_await respond(std::move(r));
    if (ok) co_await linger();
  }

  Awaitable linger() {
    error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    arm(Clock::now() + t_.o_.linger);
    char sink[16384];
    while (!ec) co_await socket_.async_read_some(boost::asio::buffer(sink), ec_token(ec));
  }

  // ---- responses -----------------------------------------------------------------------------------

  template <class Message>
  void fill_head(Message& m, const HttpResponse& r) {
    namespace http = boost::beast::http;
    m.version(version_);
    m.result(static_cast<unsigned>(r.status));
    m.set(http::field::content_type, r.content_type);
    for (const auto& [k, v] : r.headers) m.insert(k, v);
    m.keep_alive(keep_alive_);
  }

  /// A whole response; false when it could not be written (the connection then closes).
  boost::asio::awaitable<bool> respond(HttpResponse r) {
    namespace http = boost::beast::http;
    t_.service_.sent(r.route, r.status);
    error_code ec;
    arm(Clock::now() + t_.o_.write_timeout);
    if (head_only_) {  // HEAD: the GET response's head, Content-Length included, and no body
      http::response<http::empty_body> m;
      fill_head(m, r);
      m.content_length(r.body.size());
      co_await http::async_write(socket_, m, ec_token(ec));
    } else {
      http::response<http::string_body> m;
      fill_head(m, r);
      m.body() = std::move(r.body);
      m.prepare_payload();
      co_await http::async_write(socket_, m, ec_token(ec));
    }
    disarm();
    co_return !ec;
  }

  /// A response from a source: polled at each wake until done, the client watched meanwhile. `route`
  /// labels its status.
  boost::asio::awaitable<bool> respond_from(std::shared_ptr<ResponseSource> src, std::string route) {
    namespace http = boost::beast::http;
    auto signal = std::make_shared<Signal>();
    signal->conn = weak_from_this();
    src->set_waker([signal, ex = socket_.get_executor()] {
      if (signal->pending.exchange(true)) return;  // a wake is on its way already
      boost::asio::post(ex, [signal] {
        if (auto c = signal->conn.lock()) c->wake();
      });
    });
    watch();
    bool head_sent = false, ok = true;
    for (;;) {
      signal->pending.store(false);  // before poll(): what arrives during it wakes us again
      ResponseSource::Progress p;
      if (!gone_ && !forced_) p = src->poll();
      if (p.head && !head_sent) {
        head_sent = true;
        p.head->route = route;
        if (!p.chunked) {
          ok = co_await respond(std::move(*p.head));
          break;
        }
        t_.service_.sent(route, p.head->status);
      }
      // What this poll brought goes out in one write: the head (once), a chunk, the last chunk.
      std::string out;
      if (p.head) {
        http::response<http::empty_body> m;
        fill_head(m, *p.head);
        m.chunked(true);
        std::ostringstream os;
        os << m.base();
        out = os.str();
      }
      if (!p.data.empty()) out += chunk(p.data);
      if (p.done) out += "0\r\n\r\n";
      if (!out.empty()) ok = co_await write(std::move(out));
      if (ok && p.done) break;
      if (!ok || gone_ || forced_) {
        src->cancel();
        ok = false;
        break;
      }
      if (half_closed_ && !probed_) {
        // The client ended its side: a half-close, or a close. A probe tells them apart: a closed socket
        // answers it with a reset. HTTP/1.0 has no interim responses to probe with.
        probed_ = true;
        if (version_ < 11) {
          gone_ = true;
          continue;
        }
        std::string probe = head_sent ? src->probe() : std::string(kContinue);
        if (head_sent && !probe.empty()) probe = chunk(probe);
        if (!probe.empty()) {
          ok = co_await write(std::move(probe));
          if (!ok) continue;
        }
      }
      auto until = src->deadline();
      if (probed_) until = std::min(until, Clock::now() + std::chrono::milliseconds(20));
      co_await wait_wake(until);
      if (probed_ && peer_reset()) gone_ = true;
    }
    co_await stop_watch();
    co_return ok && !gone_;
  }

  static std::string chunk(const std::string& data) {
    char size[24];
    const int n = std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    std::string out;
    out.reserve(static_cast<std::size_t>(n) + data.size() + 2);
    out.append(size, static_cast<std::size_t>(n)).append(data).append("\r\n");
    return out;
  }

  /// One write under write_timeout; false when it failed or timed out (the client is then gone).
  boost::asio::awaitable<bool> write(std::string bytes) {
    error_code ec;
    arm(Clock::now() + t_.o_.write_timeout);
    co_await boost::asio::async_write(socket_, boost::asio::buffer(bytes), ec_token(ec));
    disarm();
    if (ec) gone_ = true;
    co_return !ec;
  }

  // ---- watching the client while its response is pending ----------------------------------------------

  /// Keeps one read pending: a reset means the client is gone, an end of input that it half-closed or
  /// closed (a probe decides), bytes are the next request pipelined (kept, up to a bound).
  void watch() {
    if (watching_ || half_closed_ || gone_ || buffer_.size() >= t_.o_.max_header_bytes) return;
    watching_ = true;
    socket_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](const error_code& ec, std::size_t n) {
      self->watching_ = false;
      if (!ec) {
        self->buffer_.commit(n);
        if (!self->unwatch_) self->watch();
      } else if (ec == boost::asio::error::eof) {
        self->half_closed_ = true;
      } else if (ec != boost::asio::error::operation_aborted) {
        self->gone_ = true;
      }
      self->wake();
    });
  }
  Awaitable stop_watch() {
    unwatch_ = true;
    if (watching_) cancel_io();
    while (watching_) co_await wait_wake(Clock::time_point::max());
    unwatch_ = false;
    if (half_closed_) keep_alive_ = false;  // nothing more will come
  }
  /// Whether the connection was reset (what a closed peer answers a probe with).
  bool peer_reset() {
    tcp_info info{};
    socklen_t len = sizeof info;
    if (::getsockopt(socket_.native_handle(), IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return true;
    return info.tcpi_state == TCP_CLOSE;
  }

  HttpTransport& t_;
  tcp::socket socket_;
  boost::beast::flat_buffer buffer_;
  boost::asio::steady_timer deadline_timer_, wake_timer_;
  Clock::time_point deadline_ = Clock::time_point::max();
  Phase phase_ = Phase::idle;
  unsigned version_ = 11;
  bool keep_alive_ = true;
  bool head_only_ = false;  ///< the request is a HEAD
  bool timed_out_ = false;
  bool closed_ = false;
  bool forced_ = false;
  bool woken_ = false;
  bool watching_ = false, unwatch_ = false;
  bool half_closed_ = false, probed_ = false, gone_ = false;
};

// ---- the listener --------------------------------------------------------------------------------------

inline boost::asio::awaitable<void> HttpTransport::accept_loop() {
  namespace net = boost::asio;
  net::steady_timer backoff(ioc_);
  for (;;) {
    boost::system::error_code ec;
    net::ip::tcp::socket socket = co_await acceptor_.async_accept(net::redirect_error(net::use_awaitable, ec));
    if (ec) {
      if (!acceptor_.is_open()) co_return;  // stop()
      // Out of descriptors or buffers: wait a little rather than spin; the backlog holds the rest.
      backoff.expires_after(std::chrono::milliseconds(50));
      co_await backoff.async_wait(net::redirect_error(net::use_awaitable, ec));
      continue;
    }
    if (serving_ < o_.max_connections) {
      ++serving_;  // until Connection::run ends
      auto c = std::make_shared<Connection>(*this, std::move(socket));
      net::co_spawn(ioc_, Connection::run(std::move(c)), net::detached);
    } else if (connections_.size() - serving_ < o_.max_connections) {
      auto c = std::make_shared<Connection>(*this, std::move(socket));
      net::co_spawn(ioc_, Connection::refuse(std::move(c)), net::detached);
    } else {
      socket.close(ec);  // refusals pile up too: beyond as many again, close without a word
    }
  }
}

inline void HttpTransport::begin_stop() {
  boost::system::error_code ec;
  acceptor_.close(ec);
  for (Connection* c : connections_) c->on_stop();
  if (connections_.empty()) return maybe_finish_stop();
  grace_.emplace(ioc_, o_.stop_grace);
  grace_->async_wait([this](const boost::system::error_code& cancelled) {
    if (cancelled) return;
    for (Connection* c : connections_) c->force_close();
  });
}

}  // namespace infer::serve
