#pragma once
/// \file
/// `Shape`: the sizes a static-shape engine is built for. It is a structural type, so a shape is a
/// template argument (`ContiguousAllocator<Shape{.max_batch = 8, .max_input = 1024, .max_output = 512}>`)
/// and every buffer, kernel launch and captured graph of that engine can depend on it at compile time.

#include <cstdint>

namespace infer {

struct Shape {
  std::int32_t max_batch = 1;   ///< sequences resident at once (one KV slot each)
  std::int32_t max_input = 0;   ///< longest prompt, in tokens
  std::int32_t max_output = 0;  ///< most tokens generated per sequence

  /// Tokens one sequence can hold: its whole prompt and every generated token.
  [[nodiscard]] constexpr std::int64_t capacity() const noexcept {
    return static_cast<std::int64_t>(max_input) + max_output;
  }
  friend constexpr bool operator==(const Shape&, const Shape&) = default;
};

}  // namespace infer
