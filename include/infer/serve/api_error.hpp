#pragma once
/// \file
/// Errors as the OpenAI API reports them: `{"error": {"message", "type", "param", "code"}}` with an HTTP
/// status. Clients (the `openai` package, LangChain, curl scripts) branch on the status and read
/// `message`; `param` tells a user which field to fix. Every status the server answers with — 400, 401,
/// 404, 405, 413, 500, 503 — goes through `ApiError`, so no response body has another shape.
///
/// Inside the library a problem is a typed exception (core/error.hpp). Request parsing adds two kinds:
/// `ParamError`, an `InvalidArgument` that knows which request field was wrong, and `ServiceError`,
/// for refusals that are not the client's fault (queue full, loading, draining). `to_api_error` maps
/// any exception onto a status: a user's bad input is never a 5xx.

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "infer/core/error.hpp"
#include "infer/serve/http_message.hpp"

namespace infer::serve {

/// One error response: status, OpenAI's four fields, and for 503 how long to wait.
struct ApiError {
  int status = 500;
  std::string message;
  std::string type = "server_error";  ///< invalid_request_error, authentication_error, server_error
  std::optional<std::string> param;   ///< the request field at fault, when one is
  std::optional<std::string> code;    ///< a machine-readable reason (model_not_found, ...)
  std::optional<int> retry_after_s;   ///< 503: the Retry-After header

  [[nodiscard]] nlohmann::json to_json() const {
    return {{"error",
             {{"message", message},
              {"type", type},
              {"param", param ? nlohmann::json(*param) : nlohmann::json(nullptr)},
              {"code", code ? nlohmann::json(*code) : nlohmann::json(nullptr)}}}};
  }
  /// The body as text. A message may quote the client's bytes (a JSON parse error shows where it
  /// stopped), which need not be UTF-8: they are replaced, so answering an error never throws.
  [[nodiscard]] std::string body() const {
    return to_json().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }

  static ApiError bad_request(std::string message, std::optional<std::string> param = std::nullopt,
                              std::optional<std::string> code = std::nullopt) {
    return {400, std::move(message), "invalid_request_error", std::move(param), std::move(code), std::nullopt};
  }
  static ApiError unauthorized(std::string message) {
    return {401, std::move(message), "authentication_error", std::nullopt, "invalid_api_key", std::nullopt};
  }
  static ApiError not_found(std::string message, std::optional<std::string> param = std::nullopt,
                            std::optional<std::string> code = std::nullopt) {
    return {404, std::move(message), "invalid_request_error", std::move(param), std::move(code), std::nullopt};
  }
  static ApiError unavailable(std::string message, std::string code, int retry_after_s) {
    return {503, std::move(message), "server_error", std::nullopt, std::move(code), retry_after_s};
  }
  static ApiError internal(std::string message) {
    return {500, std::move(message), "server_error", std::nullopt, "internal_error", std::nullopt};
  }
};

/// A request field with a wrong type or an out-of-range value. An InvalidArgument, so code that does not
/// care about the field catches it as one; the server puts `param()` in the error body.
class ParamError : public InvalidArgument {
 public:
  ParamError(std::string param, const std::string& message) : InvalidArgument(message), param_(std::move(param)) {}
  [[nodiscard]] const std::string& param() const noexcept { return param_; }

 private:
  std::string param_;
};

/// A request that names something the server does not have (a model, a route).
class NotFound : public NotFoundError {
 public:
  NotFound(std::string param, std::string code, const std::string& message)
      : NotFoundError(message), param_(std::move(param)), code_(std::move(code)) {}
  [[nodiscard]] const std::string& param() const noexcept { return param_; }
  [[nodiscard]] const std::string& code() const noexcept { return code_; }

 private:
  std::string param_, code_;
};

/// The server cannot take the request now, through no fault of the client: 503 with Retry-After.
class ServiceError : public Error {
 public:
  ServiceError(std::string code, const std::string& message, int retry_after_s = 1)
      : Error(Errc::unsupported, message), code_(std::move(code)), retry_after_s_(retry_after_s) {}
  [[nodiscard]] const std::string& reason() const noexcept { return code_; }
  [[nodiscard]] int retry_after_s() const noexcept { return retry_after_s_; }
  [[nodiscard]] ApiError to_api() const { return ApiError::unavailable(what(), code_, retry_after_s_); }

 private:
  std::string code_;
  int retry_after_s_;
};

/// An error already in its HTTP form (what a handler throws to answer with a given status).
class HttpError : public Error {
 public:
  explicit HttpError(ApiError e) : Error(Errc::invalid_argument, e.message), error_(std::move(e)) {}
  [[nodiscard]] const ApiError& error() const noexcept { return error_; }

 private:
  ApiError error_;
};

/// An ApiError as an HTTP response: its status, OpenAI's body, Retry-After for 503, WWW-Authenticate for 401.
inline HttpResponse error_response(const ApiError& e) {
  HttpResponse r;
  r.status = e.status;
  r.body = e.body();
  if (e.retry_after_s) r.header("Retry-After", std::to_string(*e.retry_after_s));
  if (e.status == 401) r.header("WWW-Authenticate", "Bearer");
  return r;
}

/// Any exception → the response a client should see. A user's input can only cause a 4xx: invalid
/// arguments, tokenizer and chat-template errors are 400; the rest of infer's errors and anything else
/// (a bug) are 500 with the message.
inline ApiError to_api_error(const std::exception& e) {
  if (const auto* h = dynamic_cast<const HttpError*>(&e)) return h->error();
  if (const auto* p = dynamic_cast<const ParamError*>(&e)) return ApiError::bad_request(p->what(), p->param());
  if (const auto* n = dynamic_cast<const NotFound*>(&e)) return ApiError::not_found(n->what(), n->param(), n->code());
  if (const auto* s = dynamic_cast<const ServiceError*>(&e)) return s->to_api();
  if (const auto* ie = dynamic_cast<const Error*>(&e)) {
    switch (ie->code()) {
      case Errc::invalid_argument:
      case Errc::tokenizer:
      case Errc::chat_template:
        return ApiError::bad_request(ie->what());
      case Errc::not_found:
        return ApiError::not_found(ie->what());
      default:
        break;
    }
  }
  return ApiError::internal(e.what());
}

/// The same for an exception_ptr (what crosses from the engine thread to a handler).
inline ApiError to_api_error(const std::exception_ptr& p) {
  try {
    std::rethrow_exception(p);
  } catch (const std::exception& e) {
    return to_api_error(e);
  } catch (...) {
    return ApiError::internal("unknown error");
  }
}

}  // namespace infer::serve
