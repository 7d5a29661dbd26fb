#pragma once
/// Paths the tests read: committed fixtures, and the default model that scripts/setup.sh fetches.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

namespace infer::test {

inline std::filesystem::path fixture(const std::string& relative) {
  return std::filesystem::path(INFER_FIXTURES_DIR) / relative;
}

/// The default model. Tests that need it fail (not skip) when it is missing: CI fetches it first.
inline std::filesystem::path default_model() {
  auto p = std::filesystem::path(INFER_MODELS_DIR) / "SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(p)) FAIL("default model missing at " << p << ": run scripts/setup.sh");
  return p;
}

}  // namespace infer::test
