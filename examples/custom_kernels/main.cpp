// An AttentionKernel and a Quantizer of your own, as a researcher starts one: wrap the stock policy and
// count what the decoder asks of it. Both are static interfaces (the decoder calls `Attn::attend` and
// `Q::matmul` directly, no virtual call per layer), so the counters are static too.
//
//   infer-custom-kernels MODEL [--prompt TEXT] [--max-tokens N]
// Prints what each policy saw: the weights the quantizer loaded and the matmuls it ran, the attention calls,
// and the decoder's layers, steps and chunks they should add up to.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <string>

#include "infer/engine/presets.hpp"

// 1. An AttentionKernel: the paged kernel, counting its calls (one per layer and chunk on the CPU).
struct CountingAttention : infer::PagedAttention<> {
  static inline std::int64_t calls = 0;
  static void attend(infer::cpu, const infer::AttentionShape& shape, const float* q, float* out, std::int32_t start,
                     std::int32_t count, const view<float>& kv) {
    ++calls;
    infer::PagedAttention<>::attend(infer::cpu{}, shape, q, out, start, count, kv);
  }
};

// 2. A Quantizer: F32 (weights decoded to f32 at load, OpenBLAS GEMMs), counting loads and matmuls. It sees
//    every linear layer and the LM head; as an F32 it also serves the embedding's rows (F32::embed), so a
//    tied head is the embedding, loaded once.
struct CountingF32 : infer::F32 {
  static inline std::int64_t loads = 0, matmuls = 0;
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

// 3. The engine composed with both; allocator and scheduler are the PagedEngine preset's.
using CountingEngine = infer::Engine<infer::cpu, infer::llama, infer::PagedBlockAllocator<16>,
                                     infer::PriorityScheduler, CountingAttention, CountingF32>;

int main(int argc, char** argv) {
  CLI::App app{"Count what the decoder asks of an attention kernel and a quantizer", "infer-custom-kernels"};
  std::string model, prompt = "The capital of France is";
  infer::SamplingParams params;
  params.temperature = 0;
  params.max_tokens = 8;
  params.ignore_eos = true;
  app.add_option("model", model, "a .gguf file or a Hugging Face model folder")->required();
  app.add_option("--prompt", prompt, "the text to continue");
  app.add_option("--max-tokens", params.max_tokens, "tokens to generate");
  CLI11_PARSE(app, argc, argv);
  try {
    CountingEngine engine(model, infer::EngineOptions{});
    std::int64_t chunks = 0;
    engine.set_step_observer([&](const infer::StepTrace& t) { chunks += static_cast<std::int64_t>(t.chunks.size()); });
    engine.add_request(prompt, params);
    const auto out = engine.run_to_completion();
    std::printf("%s%s\n", prompt.c_str(), out.at(0).outputs.at(0).text.c_str());
    std::printf("decoder: %lld layers, %lld steps, %lld chunks\n",
                static_cast<long long>(engine.config().num_layers), static_cast<long long>(engine.stats().steps),
                static_cast<long long>(chunks));
    std::printf("quantizer: %lld weights loaded, %lld matmuls\n", static_cast<long long>(CountingF32::loads),
                static_cast<long long>(CountingF32::matmuls));
    std::printf("attention: %lld calls\n", static_cast<long long>(CountingAttention::calls));
    return 0;
  } catch (const infer::Error& e) {
    std::fprintf(stderr, "infer-custom-kernels: %s\n", e.what());
    return 1;
  }
}
