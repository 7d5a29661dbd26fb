// The CUDA engines the registry can pick, compiled once here (engine_registry.hpp declares them extern).
// Host code: the decoder launches the kernels of this folder's .cu files.
#include "infer/engine/engine_registry.hpp"

namespace infer {

template class Engine<cuda, llama, PagedBlockAllocator<16>, PriorityScheduler, PagedAttention<>, GgufInPlace>;
template class Engine<cuda, llama, PagedBlockAllocator<16>, PriorityScheduler, PagedAttention<>, Bf16>;
template class Engine<cuda, llama, ContiguousAllocator<kShapeAtRuntime>,
                      StaticBatchScheduler<kShapeAtRuntime.max_batch>, FusedContiguousAttention<>, GgufInPlace>;
template class Engine<cuda, llama, ContiguousAllocator<kShapeAtRuntime>,
                      StaticBatchScheduler<kShapeAtRuntime.max_batch>, FusedContiguousAttention<>, Bf16>;
template class Engine<cuda, llama, PagedBlockAllocator<16>, PriorityScheduler, PagedAttention<>, Fp8>;
template class Engine<cuda, llama, ContiguousAllocator<kShapeAtRuntime>,
                      StaticBatchScheduler<kShapeAtRuntime.max_batch>, FusedContiguousAttention<>, Fp8>;
template class Engine<cuda, llama, PagedBlockAllocator<16>, PriorityScheduler, PagedAttention<>, Int8WeightOnly>;
template class Engine<cuda, llama, ContiguousAllocator<kShapeAtRuntime>,
                      StaticBatchScheduler<kShapeAtRuntime.max_batch>, FusedContiguousAttention<>, Int8WeightOnly>;
template class Engine<cuda, llama, PagedBlockAllocator<16>, PriorityScheduler, PagedAttention<>, Int4>;
template class Engine<cuda, llama, ContiguousAllocator<kShapeAtRuntime>,
                      StaticBatchScheduler<kShapeAtRuntime.max_batch>, FusedContiguousAttention<>, Int4>;

}  // namespace infer
