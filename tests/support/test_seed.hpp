#pragma once
/// Seeds of randomized tests: fixed by default, so that every run checks the same inputs and a failure
/// replays as it happened; `INFER_TEST_SEED=<n>` (any 32-bit number) runs the suite on other inputs.
/// Each call site mixes the base with its own name, so two tests never share a random stream. Printed
/// either way, with the command that replays it.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace infer::test {

/// The base seed: INFER_TEST_SEED when set (decimal), else the suite's default.
inline std::uint32_t base_seed() {
  constexpr std::uint32_t kDefault = 20261204;
  const char* env = std::getenv("INFER_TEST_SEED");
  if (env == nullptr || *env == '\0') return kDefault;
  char* end = nullptr;
  const unsigned long v = std::strtoul(env, &end, 10);
  if (*end != '\0') {
    std::fprintf(stderr, "INFER_TEST_SEED='%s' is not a decimal number; using the default %u\n", env, kDefault);
    return kDefault;
  }
  return static_cast<std::uint32_t>(v);
}

/// The seed for the randomized test `who`: the base mixed with the name (FNV-1a, then a finaliser).
inline std::uint32_t test_seed(std::string_view who) {
  const std::uint32_t base = base_seed();
  std::uint64_t h = 0xcbf29ce484222325ull ^ base;
  for (char c : who) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  const auto seed = static_cast<std::uint32_t>(h);
  std::printf("%s: seed %u (replay: INFER_TEST_SEED=%u)\n", std::string(who).c_str(), seed, base);
  return seed;
}

}  // namespace infer::test
