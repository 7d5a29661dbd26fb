#pragma once
/// \file
/// Typed errors. Every problem a user can cause (a malformed file, a bad argument, an unknown chat
/// template) is reported by throwing one of these, with a message that names what was wrong and, where
/// it helps, what to change. Nothing in the library aborts the process on a user's bad input.
///
/// The header is nvcc-safe: messages are built with `detail::cat` (ostringstream), not fmt, because
/// fmt 9's compile-time format strings do not compile under nvcc in C++20.

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace infer {

/// What kind of problem an `Error` reports; lets callers branch without string matching.
enum class Errc {
  io,                ///< a file could not be opened, read or mapped
  format,            ///< a file's bytes do not follow its format (truncated, bad magic, bad offsets)
  unsupported,       ///< well-formed, but uses something this library does not implement
  invalid_argument,  ///< a caller-supplied value is out of range or malformed
  not_found,         ///< a key, tensor or token that was asked for does not exist
  tokenizer,         ///< tokenizer data is inconsistent, or text cannot be tokenized
  chat_template,     ///< a chat template is unknown or a conversation does not fit it
  device,            ///< a CUDA / cuBLAS call failed (out of memory, launch failure, no device)
  policy,            ///< a policy broke its contract (e.g. a scheduler kept a finished sequence's blocks)
  distributed,       ///< a collective among ranks failed or did not complete in time (dist/)
};

constexpr std::string_view to_string(Errc c) noexcept {
  switch (c) {
    case Errc::io: return "io";
    case Errc::format: return "format";
    case Errc::unsupported: return "unsupported";
    case Errc::invalid_argument: return "invalid_argument";
    case Errc::not_found: return "not_found";
    case Errc::tokenizer: return "tokenizer";
    case Errc::chat_template: return "chat_template";
    case Errc::device: return "device";
    case Errc::policy: return "policy";
    case Errc::distributed: return "distributed";
  }
  return "unknown";
}

/// Base of every error the library throws on purpose.
class Error : public std::runtime_error {
 public:
  Error(Errc code, const std::string& message) : std::runtime_error(message), code_(code) {}
  [[nodiscard]] Errc code() const noexcept { return code_; }

 private:
  Errc code_;
};

/// One subclass per `Errc`, so tests and callers can catch exactly the kind they expect.
#define INFER_DEFINE_ERROR(Name, code)                                  \
  class Name : public Error {                                           \
   public:                                                              \
    explicit Name(const std::string& message) : Error(code, message) {} \
  }
INFER_DEFINE_ERROR(IoError, Errc::io);
INFER_DEFINE_ERROR(FormatError, Errc::format);
INFER_DEFINE_ERROR(UnsupportedError, Errc::unsupported);
INFER_DEFINE_ERROR(InvalidArgument, Errc::invalid_argument);
INFER_DEFINE_ERROR(NotFoundError, Errc::not_found);
INFER_DEFINE_ERROR(TokenizerError, Errc::tokenizer);
INFER_DEFINE_ERROR(ChatTemplateError, Errc::chat_template);
INFER_DEFINE_ERROR(DeviceError, Errc::device);
/// A bug in a policy, found by the engine's invariant checks: the message names the policy type and what
/// it did; the engine that threw is not usable afterwards.
INFER_DEFINE_ERROR(PolicyError, Errc::policy);
/// A collective among ranks failed or timed out (dist/): another rank has stopped, hangs or called differently.
INFER_DEFINE_ERROR(DistributedError, Errc::distributed);
#undef INFER_DEFINE_ERROR

namespace detail {
/// Concatenates anything streamable into a string: the message builder for errors.
template <class... Args>
[[nodiscard]] std::string cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

/// Throws `E` with the concatenated message when `condition` is false.
template <class E, class... Args>
void require(bool condition, Args&&... message) {
  if (!condition) throw E(detail::cat(std::forward<Args>(message)...));
}

}  // namespace infer
