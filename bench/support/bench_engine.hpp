#pragma once
/// \file
/// What infer-bench-latency and infer-bench-throughput share: the model and engine flags (a file or a
/// `--dummy` shape, backend, KV and scheduler limits), building the model source, the options and the
/// engine type from them, random prompts, the run's identity for the JSON record (commit, device,
/// settings), percentiles, and writing the record.

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "infer/engine/engine_options.hpp"
#include "infer/engine/engine_registry.hpp"
#include "program_flags.hpp"
#include "tensor_parallel_job.hpp"
#include "infer/model/dummy.hpp"
#include "infer/model/model_source.hpp"

#if defined(INFER_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace infer::bench {

/// Process start as main() sees it: the origin of the cold-start figures.
inline const auto kProcessStart = std::chrono::steady_clock::now();

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct ModelFlags {
  ModelSpec spec{.backend = "auto"};  ///< --model or --dummy, --backend (cpu, cuda, or auto: the GPU when present)
  std::string engine = "paged";     ///< paged, or static (StaticEngine of `shape`)
  Shape shape = default_static_shape;  ///< the static engine's slots
  std::string quantizer = "auto";  ///< int8, fp8 or int4 on either backend; cuda: auto (GGUF blocks in place) or bf16; cpu: auto (f32)
  bool enforce_eager = false;
  KvCacheDtype kv_cache_dtype = KvCacheDtype::automatic;
  double gpu_memory_utilization = 0.9;
  std::int32_t max_model_len = 0;
  std::int32_t max_num_seqs = 256;
  std::int32_t max_num_batched_tokens = 8192;
  std::string output_json;
  programs::EngineFileFlags engine_file;  ///< --engine-file (and --build-if-missing, --rebuild)
  int tensor_parallel_size = 1;           ///< ranks the model is split over (mpirun -np N; cpu, or cuda over NCCL)

  void add_to(CLI::App& app) {
    programs::add_model_flags(app, spec);
    programs::add_engine_file_flags(app, engine_file);
    app.add_option("--engine", engine, "paged (vLLM's way) or static (TensorRT-LLM's way: fixed slots)")
        ->check(CLI::IsMember({"paged", "static"}));
    programs::add_shape_flags(app, shape);
    app.add_option("--quantizer", quantizer, "int8 (W8A16), fp8 (W8A8) or int4 (W4A16) on either backend; cuda: auto (GGUF blocks used in place) or bf16 (everything bf16); cpu: auto (f32)")
        ->check(CLI::IsMember({"auto", "bf16", "int8", "fp8", "int4"}));
    app.add_flag("--enforce-eager", enforce_eager, "cuda: run every step eagerly (no CUDA graphs)");
    programs::add_kv_cache_dtype_flag(app, kv_cache_dtype);
    app.add_option("--gpu-memory-utilization", gpu_memory_utilization, "cuda: fraction of device memory to use")
        ->check(CLI::Range(0.01, 1.0));
    app.add_option("--max-model-len", max_model_len, "longest sequence (0 = the model's)");
    app.add_option("--max-num-seqs", max_num_seqs, "sequences per step at most");
    app.add_option("--max-num-batched-tokens", max_num_batched_tokens, "tokens per step at most");
    app.add_option("--output-json", output_json, "also write the results to this JSON file (e.g. under bench/results/)");
    app.add_option("--tensor-parallel-size", tensor_parallel_size,
                   "ranks the model is split over, one process each (mpirun -np N; cpu, or cuda over NCCL): every rank runs the "
                   "same requests, rank 0 prints and writes the record")
        ->check(CLI::Range(1, 64));
  }

  /// The model to load. InvalidArgument when neither or both of --model / --dummy are given.
  [[nodiscard]] ModelSource source() const {
    spec.validate();
    return spec.open();
  }
  [[nodiscard]] const std::string& backend() const noexcept { return spec.backend; }
  /// "cpu", "CUDA graphs" or "eager", for the table's title.
  [[nodiscard]] std::string mode() const { return backend() == "cpu" ? "cpu" : enforce_eager ? "eager" : "CUDA graphs"; }
  [[nodiscard]] std::string model_label() const { return spec.dummy.empty() ? spec.model.string() : "dummy:" + spec.dummy; }

  [[nodiscard]] EngineOptions options(std::int32_t needed_len) const {
    EngineOptions o;
    // The static engine's slots are its Shape's; the context must hold one (0: the model's own).
    o.max_model_len = max_model_len ? max_model_len : engine == "static" ? 0 : needed_len;
    o.enable_prefix_caching = false;  // random prompts share nothing; the benchmark measures compute
    o.gpu_memory_utilization = gpu_memory_utilization;
    o.enforce_eager = enforce_eager;
    o.kv_cache_dtype = kv_cache_dtype;
    o.scheduler.max_num_seqs = max_num_seqs;
    o.scheduler.max_num_batched_tokens = std::max(max_num_batched_tokens, o.max_model_len);
    o.static_shape = shape;
    return o;
  }

  [[nodiscard]] nlohmann::json settings() const {
    return {{"model", model_label()},          {"backend", backend()}, {"engine", engine},
            {"static_shape", engine == "static" ? nlohmann::json{{"max_batch", shape.max_batch},
                                                                  {"max_input", shape.max_input},
                                                                  {"max_output", shape.max_output}}
                                                : nlohmann::json(nullptr)},
            {"quantizer", quantizer},          {"cuda_graphs", backend() == "cuda" && !enforce_eager},
            {"kv_cache_dtype", std::string(to_string(kv_cache_dtype))},
            {"gpu_memory_utilization", gpu_memory_utilization},
            {"max_num_seqs", max_num_seqs},    {"max_num_batched_tokens", max_num_batched_tokens},
            {"prefix_caching", false},         {"tensor_parallel_size", tensor_parallel_size}};
  }
};

/// `n` random token ids in [vocab / 16, vocab): no special tokens, no accidental EOS (EOS is ignored anyway).
inline std::vector<std::int32_t> random_prompt(std::size_t n, std::int64_t vocab, std::mt19937_64& rng) {
  std::uniform_int_distribution<std::int32_t> d(static_cast<std::int32_t>(vocab / 16), static_cast<std::int32_t>(vocab - 1));
  std::vector<std::int32_t> p(n);
  for (auto& t : p) t = d(rng);
  return p;
}

/// The device the run used, the commit (INFER_COMMIT from the environment, else "unknown") and the date.
inline nlohmann::json run_identity(const std::string& backend) {
  nlohmann::json j;
  const char* commit = std::getenv("INFER_COMMIT");
  j["commit"] = commit ? commit : "unknown";
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  j["date"] = date;
  j["device"] = "cpu";
#if defined(INFER_HAVE_CUDA)
  if (backend == "cuda") {
    cudaDeviceProp prop{};
    int dev = 0, driver = 0;
    if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&prop, dev) == cudaSuccess) {
      j["device"] = prop.name;
      j["device_memory_bytes"] = prop.totalGlobalMem;
    }
    if (cudaDriverGetVersion(&driver) == cudaSuccess) j["cuda_driver"] = driver;
  }
#else
  (void)backend;
#endif
  return j;
}

/// The q-quantile (0..1) of `v` by nearest rank; 0 for an empty list.
inline double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(std::clamp(q, 0.0, 1.0) * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

inline double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

/// Calls `body.template operator()<E>()` with the engine the flags name (engine_registry.hpp: paged or static,
/// on cpu or cuda, GGUF blocks in place or everything bf16) and returns its exit code. A backend that is
/// not there (a CUDA-less build or a machine without a GPU asked for cuda) exits 2; any other exception is
/// printed as "program: message" (exit 1). `mf.backend` becomes the backend resolved ("auto" → cpu/cuda).
template <class Body>
int with_engine(const char* program, ModelFlags& mf, Body&& body) {
  // Tensor parallel: every rank builds its shard and runs the same (seeded) requests, so the collectives pair up;
  // the others' tables and records would repeat rank 0's, so only rank 0 prints and writes. The job starts first:
  // it picks the rank's GPU (CUDA_VISIBLE_DEVICES), which only counts before anything touches CUDA.
  programs::TensorParallelJob tp(program, mf.tensor_parallel_size);
  if (!tp.ok()) return tp.fail(2);
  // An engine file fixes the engine, quantizer and shape: the flags take its values (or are refused).
  LlmOptions choice;
  choice.engine = mf.engine;
  choice.quantizer = mf.quantizer;
  choice.engine_options.static_shape = mf.shape;
  if (const auto code = programs::prepare_engine_file(program, mf.engine_file, mf.spec, choice,
                                                      tp.place()))
    return tp.fail(*code);
  mf.engine = choice.engine;
  mf.quantizer = choice.quantizer;
  mf.shape = choice.engine_options.static_shape;
  if (const auto code = programs::resolve_backend_or_exit(program, mf.spec.backend)) return *code;
  if (!tp.attach(program, mf.spec)) return tp.fail(2);
  if (tp.rank() != 0) {
    if (std::freopen("/dev/null", "w", stdout) == nullptr) return tp.fail(1);
    mf.output_json.clear();
  }
  try {
    return with_engine_type(mf.backend(), choice, std::forward<Body>(body));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s%s\n", program, tp.who().c_str(), e.what());
    return tp.fail(1);
  }
}

/// Writes `doc` to `path` (creating its folder); no-op for an empty path.
inline void write_json(const std::string& path, const nlohmann::json& doc) {
  if (path.empty()) return;
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  std::ofstream out(p);
  if (!out) throw IoError("cannot write " + path);
  out << doc.dump(2) << "\n";
}

}  // namespace infer::bench
