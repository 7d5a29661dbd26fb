#pragma once
/// \file
/// Runtime options of an `Engine`: what vLLM exposes as engine arguments. Everything that is a
/// template parameter (block size, static shape, policies) is chosen by the Engine's type instead.

#include <cstddef>
#include <cstdint>

#include "infer/core/error.hpp"
#include "infer/sched/scheduler_config.hpp"

namespace infer {

struct EngineOptions {
  /// Bytes of KV cache to allocate (K and V of every layer). The paged engine cuts it into blocks; the
  /// static engine needs max_batch slots of max_input + max_output tokens and refuses to start when this
  /// is less. 0 = automatic: `default_paged_kv_bytes` for the paged engine, exactly what the shape needs
  /// for the static one.
  std::size_t kv_cache_bytes = 0;
  static constexpr std::size_t default_paged_kv_bytes = std::size_t{512} << 20;
  /// Longest sequence (prompt + output) accepted; 0 = the model's context length.
  std::int32_t max_model_len = 0;
  bool enable_prefix_caching = true;
  SchedulerConfig scheduler;

  void validate() const {
    require<InvalidArgument>(max_model_len >= 0, "max_model_len = ", max_model_len, " must be >= 0 (0 = the model's)");
    scheduler.validate();
  }
};

}  // namespace infer
