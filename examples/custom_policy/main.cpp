// A researcher's own scheduling policy, plugged into the paged engine: shortest prompt first, aged by the
// steps waited, at most 16 prefill tokens per step. The continuous-batching machinery (admission, chunking,
// preemption, forks) is ContinuousBatchScheduler's; the policy only scores and budgets.
//
//   infer-custom-policy MODEL [--age-weight W] [--trace FILE]
// A long prompt arrives first, then a short one every step. One request runs at a time, so the admission
// order is the whole schedule: shortest first, until the long prompt has waited long enough to overtake the
// newcomers (each step of waiting is worth W prompt tokens; W = 0 starves it until the stream ends).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "infer/engine/presets.hpp"

// 1. The policy: hooks of infer::ContinuousBatchScheduler (docs/policies.md).
struct AgedShortestFirst {
  double age_weight = 4;            // score gained per step waited
  std::int32_t prefill_tokens = 16;  // prompt tokens computed per step, over all requests
  double score(const infer::Sequence& s, const infer::StepContext& ctx) const {  // higher goes first
    return -s.prompt_len + age_weight * static_cast<double>(ctx.step - s.added_step);
  }
  std::int32_t prefill_budget(const infer::StepContext&) const { return prefill_tokens; }
};

// 2. The engine composed with it; every other policy is the PagedEngine preset's.
using AgedScheduler = infer::ContinuousBatchScheduler<AgedShortestFirst>;
using AgedEngine =
    infer::Engine<infer::cpu, infer::llama, infer::PagedBlockAllocator<16>, AgedScheduler, infer::PagedAttention<>,
                  infer::F32>;

int main(int argc, char** argv) {
  CLI::App app{"A scheduling policy of your own: shortest prompt first, aged, 16 prefill tokens per step",
               "infer-custom-policy"};
  std::string model, trace;
  double age_weight = 4;
  app.add_option("model", model, "a .gguf file or a Hugging Face model folder")->required();
  app.add_option("--age-weight", age_weight, "score gained per step waited (0: plain shortest first)");
  app.add_option("--trace", trace, "write every step as a JSON line to this file");
  CLI11_PARSE(app, argc, argv);
  try {
    // 3. Build the engine from a configured policy instance (its parameters are values, not template
    // arguments), and watch every step.
    infer::EngineOptions options;
    options.scheduler.max_num_seqs = 1;
    AgedEngine engine(model, options, AgedScheduler(options.scheduler, AgedShortestFirst{age_weight, 16}));
    std::map<infer::RequestId, std::int32_t> prompt_tokens;
    std::int32_t most_prefill = 0;
    engine.set_step_observer([&, writer = trace.empty() ? std::optional<infer::JsonlTraceWriter>()
                                                         : std::optional<infer::JsonlTraceWriter>(trace)](
                                 const infer::StepTrace& t) {
      if (writer) (*writer)(t);
      std::int32_t prefill = 0;
      for (const auto& c : t.chunks) prefill += c.decode ? 0 : c.count;
      most_prefill = std::max(most_prefill, prefill);
      for (const auto& a : t.admitted)
        std::printf("step %2lld: admitted request %llu (%d prompt tokens)\n", static_cast<long long>(t.step),
                    static_cast<unsigned long long>(a.request), prompt_tokens[a.request]);
    });

    infer::SamplingParams params;
    params.temperature = 0;
    params.max_tokens = 4;
    params.ignore_eos = true;
    const std::vector<std::string> shorts = {"Hi", "Name a fruit.", "Say yes.", "Count to three.", "Name a color.",
                                             "Hello there.", "Good morning.", "Name a tree.", "Say no.", "Thanks!"};
    auto add = [&](const std::string& text) {
      const auto id = engine.add_request(text, params);
      prompt_tokens[id] = static_cast<std::int32_t>(engine.tokenizer()->encode(text).size());
    };
    add("Explain in detail why the sky appears blue during the day and red at sunset, and what role the "
        "atmosphere plays in both.");
    for (std::size_t i = 0; engine.has_unfinished(); ++i) {
      if (i < shorts.size()) add(shorts[i]);
      engine.step();
    }
    std::printf("%lld steps, at most %d prefill tokens in one step\n",
                static_cast<long long>(engine.stats().steps), most_prefill);
    return 0;
  } catch (const infer::Error& e) {
    std::fprintf(stderr, "infer-custom-policy: %s\n", e.what());
    return 1;
  }
}
