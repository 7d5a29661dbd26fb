#pragma once
/// \file
/// `Shape`: the sizes a static-shape engine is built for. It is a structural type, so a shape can be a
/// template argument (`ContiguousAllocator<Shape{.max_batch = 8, .max_input = 1024, .max_output = 512}>`),
/// fixed when the program is compiled; or, with `kShapeAtRuntime` as the argument, a value the engine
/// takes when it is built (EngineOptions::static_shape: a program's --max-batch/--max-input/--max-output),
/// as TensorRT-LLM builds an engine for the shape its user names. Either way every buffer and captured
/// graph of that engine is sized once, from the shape, before the first request.

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

/// The template argument of an engine whose shape is given when it is built (EngineOptions::static_shape).
inline constexpr Shape kShapeAtRuntime{.max_batch = 0, .max_input = 0, .max_output = 0};

/// The static engine's shape when none is given: 8 slots of 1024 prompt + 512 generated tokens.
inline constexpr Shape default_static_shape{.max_batch = 8, .max_input = 1024, .max_output = 512};

}  // namespace infer
