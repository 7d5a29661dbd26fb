// Uses the installed package as a researcher does: parses a GGUF file made in memory (headers, kernels and
// their dependencies link), then writes three policies of its own — a scheduler (shortest prompt first, aged
// by waiting, at most 16 prefill tokens a step), a counting attention kernel and a counting quantizer —
// tests the scheduler without a model (infer/testing), runs all three on the default model, and checks the
// admission order, the greedy tokens against the stock engine's, and the counts.
//   consumer MODEL
#include <infer/infer.hpp>
#include <infer/testing/fake_allocator.hpp>
#if CONSUMER_HAS_MPI
#include <infer/dist/mpi.hpp>
static_assert(infer::dist::Communicator<infer::dist::Mpi>);
#endif

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

// ---- the scheduler: the policy is the idea; ContinuousBatchScheduler is the machinery ----------------
struct AgedShortestFirst {
  double age_weight = 1;  // score per step waited
  double score(const infer::Sequence& s, const infer::StepContext& ctx) const {
    return -s.prompt_len + age_weight * static_cast<double>(ctx.step - s.added_step);
  }
  std::int32_t prefill_budget(const infer::StepContext&) const { return 16; }
};
using AgedScheduler = infer::ContinuousBatchScheduler<AgedShortestFirst>;

// ---- an attention kernel and a quantizer that count what the decoder asks of them -------------------
struct CountingAttention : infer::PagedAttention<> {
  static inline long calls = 0;
  static void attend(infer::cpu, const infer::AttentionShape& shape, const float* q, float* out, std::int32_t start,
                     std::int32_t count, const view<float>& kv) {
    ++calls;
    infer::PagedAttention<>::attend(infer::cpu{}, shape, q, out, start, count, kv);
  }
};
struct CountingF32 : infer::F32 {
  static inline long loads = 0, matmuls = 0;
  template <class B>
  static linear<B> load(const infer::WeightTensor& t, infer::cpu store) {
    ++loads;
    return infer::F32::load<B>(t, store);
  }
  static void matmul(infer::cpu, const linear<infer::cpu>& w, const float* x, std::int32_t rows, float* y) {
    ++matmuls;
    infer::F32::matmul(infer::cpu{}, w, x, rows, y);
  }
};
using ResearchEngine = infer::Engine<infer::cpu, infer::llama, infer::PagedBlockAllocator<16>, AgedScheduler,
                                     CountingAttention, CountingF32>;

namespace {

int failures = 0;
void check(bool ok, const char* what) {
  std::printf("consumer: %s: %s\n", what, ok ? "ok" : "WRONG");
  failures += ok ? 0 : 1;
}

bool gguf_roundtrip() {
  std::vector<std::byte> file;
  auto put = [&](const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    file.insert(file.end(), b, b + n);
  };
  auto u32 = [&](std::uint32_t v) { put(&v, 4); };
  auto u64 = [&](std::uint64_t v) { put(&v, 8); };
  auto str = [&](const char* s) { u64(std::strlen(s)); put(s, std::strlen(s)); };
  put("GGUF", 4); u32(3); u64(1); u64(1);                    // header: 1 tensor, 1 metadata key
  str("general.architecture"); u32(8); str("llama");        // string value
  str("w"); u32(1); u64(4); u32(1); u64(0);                 // tensor w: 1 dim of 4, f16, offset 0
  while (file.size() % 32) file.push_back(std::byte{0});    // default alignment
  for (float f : {1.0f, -2.0f, 0.5f, 8.0f}) { std::uint16_t h = infer::f32_to_f16(f); put(&h, 2); }
  const auto gguf = infer::gguf::File::from_bytes(file);
  return gguf.architecture() == "llama" && gguf.dequantize(gguf.tensor("w")) == std::vector<float>{1.0f, -2.0f, 0.5f, 8.0f};
}

/// Prompts of 30, 5, 12 and 8 tokens. Step 0 scores them -30, -5, -12, -8: the 5 and the 8 are admitted and
/// the 12 gets the 3 prefill tokens left; at step 1 it takes 9 and the 30 (score -29) the last 7.
const std::vector<std::int32_t> kLengths = {30, 5, 12, 8};
const std::vector<infer::RequestId> kAdmissionOrder = {1, 3, 2, 0};

std::vector<std::vector<std::int32_t>> prompts() {
  std::vector<std::vector<std::int32_t>> out;
  for (std::size_t i = 0; i < kLengths.size(); ++i) {
    std::vector<std::int32_t> p;
    for (std::int32_t t = 0; t < kLengths[i]; ++t) p.push_back(1000 + static_cast<std::int32_t>(i) * 97 + t * 13);
    out.push_back(p);
  }
  return out;
}

template <class E>
std::vector<std::vector<std::int32_t>> generate(E& engine) {
  infer::SamplingParams params;
  params.temperature = 0;
  params.max_tokens = 4;
  params.ignore_eos = true;
  for (const auto& p : prompts()) engine.add_request(p, params);
  std::vector<std::vector<std::int32_t>> out;
  for (const auto& r : engine.run_to_completion()) out.push_back(r.outputs[0].token_ids);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::printf("consumer: infer %s\n", INFER_VERSION);
  check(gguf_roundtrip(), "a GGUF file made in memory parses and dequantizes");
  {  // dist/: the group of one that TP = 1 and DP = 1 compile to
    infer::dist::SingleRank one;
    std::vector<float> v = {1.0f, 2.0f};
    one.all_reduce_sum(v);
    check(one.size() == 1 && v[1] == 2.0f && infer::dist::split_evenly(10, 1, 3).begin == 4,
          "dist: SingleRank and split_evenly from the package");
#if CONSUMER_HAS_MPI
    int (*init)(int*, char***) = &MPI_Init;  // MPI's library links through infer::mpi
    check(init != nullptr, "dist: infer::mpi links MPI");
#endif
  }
  if (argc < 2) return failures ? 1 : 0;

  {  // The scheduler alone, on the installed test helpers: blocks only, fake tokens.
    AgedScheduler sched;
    infer::testing::FakePagedAllocator alloc(64, 16);
    infer::testing::SimEngine sim{sched, alloc};
    for (auto n : kLengths) sim.add(n, 4);
    std::vector<infer::SeqId> admitted;
    while (sched.num_running() + sched.num_waiting() > 0)
      for (const auto* s : sim.step().admitted) admitted.push_back(s->id);
    check(admitted == std::vector<infer::SeqId>{2, 4, 3, 1}, "the scheduler admits by its score (no model)");
    check(alloc.num_free_blocks() == 64, "every fake block is back");
  }

  std::vector<std::vector<std::int32_t>> stock;
  {
    infer::PagedEngine<infer::cpu, 16> engine(argv[1], infer::EngineOptions{});
    stock = generate(engine);
  }
  ResearchEngine engine(argv[1], infer::EngineOptions{});
  std::vector<infer::RequestId> admitted;
  long chunks = 0, sampling_steps = 0;
  std::int32_t most_prefill = 0;
  engine.set_step_observer([&](const infer::StepTrace& t) {
    for (const auto& a : t.admitted) admitted.push_back(a.request);
    sampling_steps += std::any_of(t.chunks.begin(), t.chunks.end(), [](const auto& c) { return c.samples; }) ? 1 : 0;
    std::int32_t prefill = 0;
    for (const auto& c : t.chunks) prefill += c.decode ? 0 : c.count;
    most_prefill = std::max(most_prefill, prefill);
    chunks += static_cast<long>(t.chunks.size());
  });
  check(generate(engine) == stock, "the research engine's greedy tokens equal the stock engine's");
  check(admitted == kAdmissionOrder, "admission order: shortest first, aged");
  check(most_prefill == 16, "at most 16 prefill tokens a step");
  const long layers = static_cast<long>(engine.config().num_layers), steps = engine.stats().steps;
  // Every linear layer goes through the Quantizer: seven per decoder layer (q, k, v, o, gate, up, down) and
  // the LM head. SmolLM2 ties its head to the embedding, and CountingF32 (an F32) can serve embedding rows,
  // so the embedding is loaded through it once and is the head; the head runs on the steps that sample.
  check(CountingF32::loads == 7 * layers + 1, "the quantizer loaded 7 weights per layer and the embedding / LM head");
  check(CountingF32::matmuls == 7 * layers * steps + sampling_steps,
        "the quantizer ran 7 matmuls per layer per step, and the LM head on each step that samples");
  check(CountingAttention::calls == layers * chunks, "the attention kernel ran once per layer per chunk");
  std::printf("consumer: %ld layers, %ld steps (%ld sampling), %ld chunks; %ld loads, %ld matmuls, %ld attention calls\n",
              layers, steps, sampling_steps, chunks, CountingF32::loads, CountingF32::matmuls, CountingAttention::calls);
  return failures ? 1 : 0;
}
