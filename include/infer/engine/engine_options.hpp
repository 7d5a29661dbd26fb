#pragma once
/// \file
/// Runtime options of an `Engine`: what vLLM exposes as engine arguments. Everything that is a
/// template parameter (block size, policies, a static shape fixed at compile time) is chosen by the
/// Engine's type instead.

#include <cstddef>
#include <cstdint>

#include "infer/core/error.hpp"
#include "infer/memory/kv_dtype.hpp"
#include "infer/memory/shape.hpp"
#include "infer/sched/scheduler_config.hpp"

namespace infer {

struct EngineOptions {
  /// Bytes of KV cache to allocate (K and V of every layer). The paged engine cuts it into blocks; the
  /// static engine needs max_batch slots of max_input + max_output tokens and refuses to start when this
  /// is less. 0 = automatic: on the CPU `default_paged_kv_bytes` for the paged engine; on the GPU what
  /// `gpu_memory_utilization` leaves after weights and activations; for the static engine exactly what
  /// its shape needs.
  std::size_t kv_cache_bytes = 0;
  static constexpr std::size_t default_paged_kv_bytes = std::size_t{512} << 20;
  /// Longest sequence (prompt + output) accepted; 0 = the model's context length.
  std::int32_t max_model_len = 0;
  bool enable_prefix_caching = true;
  /// What the KV cache stores (vLLM's --kv-cache-dtype): `automatic`, the model's activation type (f32 on
  /// the CPU, bf16 on the GPU), or `fp8_e4m3`, e4m3 codes with a K and a V scale per layer (the checkpoint's
  /// where it ships them, else 1.0; kv_dtype.hpp): half of
  /// bf16's bytes, so twice the tokens in the same budget. Needs an attention kernel that reads it
  /// (reads_fp8_kv_cache in concepts.hpp; the built-in ones do).
  KvCacheDtype kv_cache_dtype = KvCacheDtype::automatic;
  /// GPU only: the fraction of the device's memory this engine may use in all (weights, activations and
  /// the KV pool), as vLLM's --gpu-memory-utilization. Used when kv_cache_bytes is 0.
  double gpu_memory_utilization = 0.9;
  /// GPU only: run every step eagerly instead of replaying captured CUDA graphs for decode steps
  /// (vLLM's --enforce-eager). Graphs cut the per-step launch overhead; eager starts faster.
  bool enforce_eager = false;
  /// GPU only: draw the tokens of sampled (non-greedy, penalized, min_tokens or logprobs) requests on the
  /// device and bring back ids, as greedy requests always are. false: copy such rows' logits to the host
  /// and use the CPU Sampler (for comparisons; the tokens agree but for float-rounding ties at a draw's
  /// boundary). Requests asking for top logprobs, and the row n > 1 siblings fork from, always take the
  /// host path: they need the whole row.
  bool device_sampling = true;
  SchedulerConfig scheduler;
  /// The static engine's slots when its type takes the shape at run time (StaticEngine<B, kShapeAtRuntime>:
  /// what the registry and the programs' --max-batch/--max-input/--max-output build); unused otherwise.
  Shape static_shape = default_static_shape;

  void validate() const {
    require<InvalidArgument>(max_model_len >= 0, "max_model_len = ", max_model_len, " must be >= 0 (0 = the model's)");
    require<InvalidArgument>(gpu_memory_utilization > 0.0 && gpu_memory_utilization <= 1.0,
                             "gpu_memory_utilization = ", gpu_memory_utilization, " must be in (0, 1]");
    scheduler.validate();
  }
};

}  // namespace infer
