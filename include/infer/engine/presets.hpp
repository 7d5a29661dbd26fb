#pragma once
/// \file
/// The two engines most users want, as aliases over `Engine`:
///   PagedEngine  — vLLM's way: PagedAttention over block tables, continuous batching, chunked prefill,
///                  preemption by recompute, automatic prefix caching. Runtime shapes. Requests are served
///                  by SamplingParams::priority (PriorityOrder; first come, first served among equals,
///                  which is every request that sets none).
///   StaticEngine — TensorRT-LLM's way: shapes fixed at build time (a `Shape`), one preallocated
///                  contiguous KV slot per batch entry, in-flight refill of finished slots.
/// Both read weights through the same Quantizer and run the same decoder; only the policies differ.

#include <cstdint>
#include <type_traits>

#include "infer/attention/contiguous_attention.hpp"
#include "infer/attention/paged_attention.hpp"
#include "infer/engine/engine.hpp"
#include "infer/memory/contiguous_allocator.hpp"
#include "infer/memory/paged_allocator.hpp"
#include "infer/memory/shape.hpp"
#include "infer/model/llama.hpp"
#include "infer/quant/bf16.hpp"
#include "infer/quant/f32.hpp"
#include "infer/quant/gguf_in_place.hpp"
#include "infer/quant/fp8.hpp"
#include "infer/quant/int4.hpp"
#include "infer/quant/int8_weight_only.hpp"
#include "infer/sched/continuous_batch.hpp"
#include "infer/sched/static_batch.hpp"

namespace infer {

/// The Quantizer a backend uses when none is named: F32 on the CPU (the reference); on the GPU, GGUF
/// blocks kept in place where a kernel reads them and bf16 for everything else.
template <class B>
using default_quantizer = std::conditional_t<std::is_same_v<B, cuda>, GgufInPlace, F32>;

template <class B = cpu, std::int32_t BlockSize = 16, class Q = default_quantizer<B>>
using PagedEngine = Engine<B, llama, PagedBlockAllocator<BlockSize>, PriorityScheduler, PagedAttention<>, Q>;

/// A static engine of `S` slots; `S = kShapeAtRuntime` takes its shape from EngineOptions::static_shape
/// (its scheduler then runs as many sequences as the shape has slots).
template <class B = cpu, Shape S = default_static_shape, class Q = default_quantizer<B>>
using StaticEngine =
    Engine<B, llama, ContiguousAllocator<S>, StaticBatchScheduler<S.max_batch>, FusedContiguousAttention<>, Q>;

}  // namespace infer
