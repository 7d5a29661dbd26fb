#pragma once
/// What the engine-file tests of both backends share (tests/unit/engine/test_engine_file.cpp,
/// tests/cuda/test_cuda_engine_file.cpp): a scratch path per test binary, and greedy tokens of a batch of
/// prompts through an EngineHandle.
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "infer/engine/engine_build.hpp"

namespace infer::test {

/// `name` in a scratch folder of the system's temporary directory (`folder` keeps test binaries apart).
inline std::filesystem::path engine_temp_path(const std::string& folder, const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / folder;
  std::filesystem::create_directories(dir);
  return dir / name;
}

/// Greedy tokens of every prompt (EOS ignored, `max_tokens` each), all submitted at once.
inline std::vector<std::vector<std::int32_t>> engine_greedy(EngineHandle& engine,
                                                            const std::vector<std::vector<std::int32_t>>& prompts,
                                                            std::int32_t max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  std::map<RequestId, std::size_t> index;
  for (std::size_t i = 0; i < prompts.size(); ++i) index[engine.add_request(prompts[i], p)] = i;
  std::vector<std::vector<std::int32_t>> out(prompts.size());
  while (engine.has_unfinished())
    for (const auto& r : engine.step())
      if (r.finished) out[index.at(r.id)] = r.outputs.at(0).token_ids;
  return out;
}

}  // namespace infer::test
