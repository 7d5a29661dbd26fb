#pragma once
/// \file
/// `LlmOptions`: the engine a program or the offline API asks for (engine kind, block size, quantizer,
/// cache and scheduler limits, chat template), shared by infer::LLM, infer-generate, infer-chat,
/// infer-serve and router configs, and `parse_memory_size` for their --kv-cache-memory.

#include <cstdint>
#include <exception>
#include <string>

#include "infer/core/error.hpp"
#include "infer/engine/engine_options.hpp"

namespace infer {

/// "512M", "2G", "1048576" → bytes: the --kv-cache-memory syntax of infer-generate, infer-serve and router
/// configs. InvalidArgument names `what` and the text.
inline std::size_t parse_memory_size(const std::string& s, const std::string& what = "--kv-cache-memory") {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = s.substr(used);
  const double mult = unit.empty() ? 1 : unit == "K" || unit == "KiB" ? 1024.0
                                   : unit == "M" || unit == "MiB" ? 1048576.0
                                   : unit == "G" || unit == "GiB" ? 1073741824.0 : -1;
  if (used == 0 || mult < 0 || v <= 0)
    throw InvalidArgument(detail::cat(what, " '", s, "' is not a size like 512M or 2G"));
  return static_cast<std::size_t>(v * mult);
}

/// Which compiled engine runs a model and how (engine_registry.hpp maps these to a type), and what the
/// offline API does around it.
struct LlmOptions {
  std::string engine = "paged";    ///< "paged" (PagedEngine) or "static" (StaticEngine of engine_options.static_shape)
  std::int32_t block_size = 16;    ///< paged engine: 8, 16 or 32 on the CPU; 16 on CUDA
  std::string quantizer = "auto";  ///< "int8" (Int8WeightOnly), "fp8" (Fp8) or "int4" (Int4) on either backend; cuda: "auto" (GGUF blocks used in place, else bf16) or "bf16"; cpu: "auto" (f32)
  EngineOptions engine_options;
  std::string chat_template;       ///< a built-in template (chatml, llama3, llama3.1, mistral) instead of the model's
  bool progress = true;            ///< draw a progress bar when stderr is a terminal
  bool summary = true;             ///< print the run's summary to stderr at the end
};

}  // namespace infer
