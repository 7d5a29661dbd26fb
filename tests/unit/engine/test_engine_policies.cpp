// An engine composed with a scheduler of one's own: a scheduler that keeps a finished sequence's blocks gets
// a PolicyError naming it, instead of filling the cache until nothing is admitted.
#include "engine_test_support.hpp"

#include <random>

#include "infer/testing/tiny_model.hpp"

using namespace infer;
using namespace infer::test;
using Catch::Contains;

namespace {

/// Forgets to return a finished sequence's blocks: it takes them again after finishing it.
struct LeakingScheduler : ContinuousBatchScheduler<> {
  using ContinuousBatchScheduler<>::ContinuousBatchScheduler;
  template <class A>
  void finish(Sequence* seq, A& alloc) {
    const bool was_running = seq->status == SeqStatus::running;
    ContinuousBatchScheduler<>::finish(seq, alloc);
    if (was_running) static_cast<void>(alloc.allocate(*seq));
  }
};
using LeakingEngine = Engine<cpu, llama, PagedBlockAllocator<16>, LeakingScheduler, PagedAttention<>, F32>;

constexpr std::size_t kBytesPerToken = 3 * 2 * 2 * 64 * 4;  // small_llama: layers x (K, V) x kv heads x dim x f32

/// Random prompts of these lengths, ids in [2, 512) (small_llama's vocabulary).
std::vector<Tokens> prompts_of(std::initializer_list<std::int32_t> lengths, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Tokens> out;
  for (auto n : lengths) {
    Tokens p(static_cast<std::size_t>(n));
    for (auto& t : p) t = std::uniform_int_distribution<std::int32_t>(2, 511)(rng);
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace

TEST_CASE("a scheduler that keeps a finished sequence's blocks gets a PolicyError naming it, not a hang",
          "[engine][policy][invariants]") {
  EngineOptions o;
  o.max_model_len = 64;
  o.kv_cache_bytes = 12 * 16 * kBytesPerToken;  // 12 blocks: a few leaked requests would fill them
  LeakingEngine engine(testing::tiny_model(), o);
  for (const auto& p : prompts_of({20, 20, 20, 20, 20, 20}, 4)) engine.add_request(p, greedy_params(4));
  CHECK_THROWS_AS(engine.run_to_completion(), PolicyError);
  LeakingEngine again(testing::tiny_model(), o);
  again.add_request(prompts_of({20}, 5)[0], greedy_params(4));
  CHECK_THROWS_WITH(again.run_to_completion(),
                    Contains("scheduler (anonymous namespace)::LeakingScheduler: sequence 0 still holds 2 KV blocks "
                             "after finish()") &&
                        Contains("alloc.free(seq)"));
}
