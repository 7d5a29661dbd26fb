#pragma once
/// \file
/// Requests as bytes, for the ranks of one job to exchange over a Communicator's broadcast (the lockstep engine,
/// dist/lockstep_engine.hpp): `WireWriter` appends values, `WireReader` takes them back in the same order and
/// throws DistributedError when the bytes end early or a length is beyond what is left (a rank that read a
/// message another way, never a crash). Native byte order and sizes: both ends are ranks of one job, built from
/// one source (an MPI job across hosts of one architecture), not a file or a network protocol.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/sampling/sampling_params.hpp"

namespace infer::dist {

class WireWriter {
 public:
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void put(const T& v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void put(const std::string& s) {
    put(static_cast<std::uint64_t>(s.size()));
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    bytes_.insert(bytes_.end(), p, p + s.size());
  }
  template <class T>
  void put(const std::vector<T>& v) {
    put(static_cast<std::uint64_t>(v.size()));
    for (const T& x : v) put(x);
  }
  template <class T>
  void put(const std::optional<T>& v) {
    put(static_cast<std::uint8_t>(v.has_value()));
    if (v) put(*v);
  }

  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return bytes_; }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_.size(); }
  /// Drops what was written after size() was `n` (an entry whose operation failed).
  void truncate(std::size_t n) { bytes_.resize(n); }
  void clear() noexcept { bytes_.clear(); }

 private:
  std::vector<std::byte> bytes_;
};

class WireReader {
 public:
  explicit WireReader(std::span<const std::byte> bytes) noexcept : bytes_(bytes) {}

  template <class T>
    requires std::is_trivially_copyable_v<T>
  void get(T& v) {
    std::memcpy(&v, take(sizeof(T)), sizeof(T));
  }
  void get(std::string& s) {
    const std::size_t n = length(1);
    const std::byte* p = take(n);
    s.assign(reinterpret_cast<const char*>(p), n);
  }
  template <class T>
  void get(std::vector<T>& v) {
    // Each element takes at least its own size, or a string's or vector's 8-byte length.
    v.resize(length(std::is_trivially_copyable_v<T> ? sizeof(T) : sizeof(std::uint64_t)));
    for (T& x : v) get(x);
  }
  template <class T>
  void get(std::optional<T>& v) {
    std::uint8_t has = 0;
    get(has);
    if (!has) {
      v.reset();
      return;
    }
    get(v.emplace());
  }
  template <class T>
  [[nodiscard]] T get() {
    T v{};
    get(v);
    return v;
  }

  [[nodiscard]] bool done() const noexcept { return at_ == bytes_.size(); }

 private:
  const std::byte* take(std::size_t n) {
    if (n > bytes_.size() - at_)
      throw DistributedError(detail::cat("a message from another rank ends early: ", n, " bytes wanted at byte ", at_,
                                         " of ", bytes_.size()));
    const std::byte* p = bytes_.data() + at_;
    at_ += n;
    return p;
  }
  /// A count of elements of at least `min_bytes` each, checked against what is left before anything is allocated.
  std::size_t length(std::size_t min_bytes) {
    const auto n = get<std::uint64_t>();
    if (n > (bytes_.size() - at_) / min_bytes)
      throw DistributedError(detail::cat("a message from another rank holds a length of ", n, " at byte ", at_,
                                         ", beyond its ", bytes_.size(), " bytes"));
    return static_cast<std::size_t>(n);
  }

  std::span<const std::byte> bytes_;
  std::size_t at_ = 0;
};

/// Every field of SamplingParams, in one order for both directions: a field added there and not here is caught
/// by the round-trip test (tests/unit/dist/test_lockstep_engine.cpp checks the struct's size).
template <class Io, class P>
void sampling_fields(Io&& io, P& p) {
  io(p.n, p.temperature, p.top_p, p.top_k, p.min_p, p.repetition_penalty, p.presence_penalty, p.frequency_penalty,
     p.seed, p.stop, p.stop_token_ids, p.ignore_eos, p.max_tokens, p.min_tokens, p.logprobs, p.prompt_logprobs,
     p.skip_special_tokens, p.include_stop_str_in_output, p.priority, p.tag);
}

inline void put(WireWriter& w, const SamplingParams& p) {
  sampling_fields([&](const auto&... f) { (w.put(f), ...); }, p);
}
inline SamplingParams get_sampling_params(WireReader& r) {
  SamplingParams p;
  sampling_fields([&](auto&... f) { (r.get(f), ...); }, p);
  return p;
}

}  // namespace infer::dist
