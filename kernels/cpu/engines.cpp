// The CPU engines the registry can pick, compiled once here (engine_registry.hpp declares them extern).
#include "infer/engine/engine_registry.hpp"

namespace infer {

template class Engine<cpu, llama, PagedBlockAllocator<8>, PriorityScheduler, PagedAttention<>, F32>;
template class Engine<cpu, llama, PagedBlockAllocator<16>, PriorityScheduler, PagedAttention<>, F32>;
template class Engine<cpu, llama, PagedBlockAllocator<32>, PriorityScheduler, PagedAttention<>, F32>;
template class Engine<cpu, llama, ContiguousAllocator<kShapeAtRuntime>,
                      StaticBatchScheduler<kShapeAtRuntime.max_batch>, FusedContiguousAttention<>, F32>;
template class Engine<cpu, llama, PagedBlockAllocator<16>, PriorityScheduler, PagedAttention<>, Int8WeightOnly>;
template class Engine<cpu, llama, ContiguousAllocator<kShapeAtRuntime>,
                      StaticBatchScheduler<kShapeAtRuntime.max_batch>, FusedContiguousAttention<>, Int8WeightOnly>;
template class Engine<cpu, llama, PagedBlockAllocator<16>, PriorityScheduler, PagedAttention<>, Fp8>;
template class Engine<cpu, llama, ContiguousAllocator<kShapeAtRuntime>,
                      StaticBatchScheduler<kShapeAtRuntime.max_batch>, FusedContiguousAttention<>, Fp8>;
template class Engine<cpu, llama, PagedBlockAllocator<16>, PriorityScheduler, PagedAttention<>, Int4>;
template class Engine<cpu, llama, ContiguousAllocator<kShapeAtRuntime>,
                      StaticBatchScheduler<kShapeAtRuntime.max_batch>, FusedContiguousAttention<>, Int4>;

}  // namespace infer
