// A researcher's own scheduling policy, plugged into the paged engine: shortest prompt first.
//
//   infer-custom-policy MODEL
// Four prompts of different lengths arrive together; with one sequence per step the engine serves them
// in the policy's order, shortest first, instead of first come, first served.
#include <cstdio>
#include <string>
#include <vector>

#include "infer/engine/presets.hpp"

// 1. The policy: a strict weak order over waiting sequences (true when `a` is admitted before `b`).
struct ShortestPromptFirst {
  bool operator()(const infer::Sequence& a, const infer::Sequence& b) const {
    return a.prompt_len != b.prompt_len ? a.prompt_len < b.prompt_len : a.arrival < b.arrival;
  }
};
static_assert(infer::WaitingOrder<ShortestPromptFirst>);

// 2. The engine composed with it; every other policy is the PagedEngine preset's.
using ShortFirstEngine =
    infer::Engine<infer::cpu, infer::llama, infer::PagedBlockAllocator<16>,
                  infer::ContinuousBatchScheduler<ShortestPromptFirst>, infer::PagedAttention<>, infer::F32>;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: infer-custom-policy MODEL\n");
    return 2;
  }
  try {
    infer::EngineOptions options;
    options.scheduler.max_num_seqs = 1;  // one at a time, so the admission order is the completion order
    ShortFirstEngine engine(argv[1], options);

    const std::vector<std::string> prompts = {
        "Explain in detail why the sky appears blue during the day and red at sunset.",
        "Hi",
        "Name three fruits that are red.",
        "Write one sentence about the ocean.",
    };
    infer::SamplingParams params;
    params.temperature = 0;
    params.max_tokens = 8;
    for (const auto& p : prompts) engine.add_request(p, params);

    // 3. Run it, printing requests as they finish.
    int order = 0;
    while (engine.has_unfinished())
      for (const auto& out : engine.step())
        if (out.finished)
          std::printf("%d. request %llu (%d prompt tokens): %s\n", ++order, static_cast<unsigned long long>(out.id),
                      out.metrics.prompt_tokens, out.outputs[0].text.c_str());
    return 0;
  } catch (const infer::Error& e) {
    std::fprintf(stderr, "infer-custom-policy: %s\n", e.what());
    return 1;
  }
}
