#pragma once
/// \file
/// The flags every program that loads a model shares (infer-generate, infer-chat, infer-offline-batch,
/// infer-serve, the bench programs), so that each means the same everywhere: what to load and where
/// (`ModelSpec`: --model or --dummy with --tokenizer, --backend), the static engine's shape, and the
/// rule that a backend that is not there ends the program with exit code 2 and a message.

#include <CLI/CLI.hpp>

#include <cstdio>
#include <optional>
#include <string>

#include "infer/engine/engine_registry.hpp"

namespace infer::programs {

/// --model / --dummy (one of them), --dummy-seed, --tokenizer, --backend cpu|cuda|auto into `spec`.
inline void add_model_flags(CLI::App& app, ModelSpec& spec) {
  auto* model = app.add_option("--model,-m", spec.model, "a .gguf file or a Hugging Face model folder");
  auto* dummy = app.add_option("--dummy", spec.dummy,
                               std::string("or a model shape with seeded random weights (vLLM's --load-format dummy): ") +
                                   std::string(kDummyPresets) + ", or a config.json");
  model->excludes(dummy);
  app.add_option("--dummy-seed", spec.dummy_seed, "seed of the dummy weights");
  app.add_option("--tokenizer", spec.tokenizer,
                 "--dummy: a model file (its tokenizer) or an HF tokenizer.json that turns text into ids");
  app.add_option("--backend", spec.backend, "cpu, cuda, or auto (the GPU when one is present)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
}

/// --max-batch, --max-input, --max-output: the static engine's shape.
inline void add_shape_flags(CLI::App& app, Shape& shape) {
  app.add_option("--max-batch", shape.max_batch, "static engine: slots (sequences at once)")->capture_default_str();
  app.add_option("--max-input", shape.max_input, "static engine: longest prompt")->capture_default_str();
  app.add_option("--max-output", shape.max_output, "static engine: most tokens generated")->capture_default_str();
}

/// Resolves `backend` ("auto" → cpu or cuda) in place; when the backend asked for is not there, prints
/// "program: why" and returns the exit code 2.
inline std::optional<int> resolve_backend_or_exit(const char* program, std::string& backend) {
  try {
    backend = resolve_backend(backend);
    return std::nullopt;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 2;
  }
}

}  // namespace infer::programs
