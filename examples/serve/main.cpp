// infer-serve: an OpenAI-compatible HTTP server over infer's engines (docs/serving.md).
//
//   infer-serve --model MODEL [--engine paged|static] [--host 127.0.0.1] [--port 8000] [--api-key KEY]
//               [--served-model-name NAME]... [engine and cache flags of infer-generate]
//   infer-serve --model MODEL --router CONFIG.json     several engines behind the hybrid router
//   infer-serve --model MODEL --data-parallel-size N   N replicas (cuda: one per GPU), balanced by the router
//   mpirun -np N infer-serve --tensor-parallel-size N ...   one model split over N ranks (cpu; cuda over NCCL): rank 0
//               serves HTTP, the others run its engine's steps with it (dist/lockstep_engine.hpp)
//   infer-serve --dummy llama3-8b --tokenizer MODEL --backend cuda   a model shape with random weights
//
// The socket is open while the model loads (/health answers 503 until it is ready). SIGTERM or SIGINT
// drains: new requests get 503, running ones may finish for --drain-timeout seconds, the rest are
// aborted, and the process exits 0. A second signal stops at once.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "infer/dist/lockstep_engine.hpp"
#include "infer/model/dummy.hpp"
#include "infer/engine/engine_registry.hpp"
#include "program_flags.hpp"
#include "tensor_parallel_job.hpp"
#include "infer/serve/engine_worker.hpp"
#include "infer/serve/openai_server.hpp"
#include "infer/serve/router.hpp"

namespace {

/// SIGTERM and SIGINT reach main through a pipe: the handler writes the signal's number, signal_within()
/// reads it. Blocking the signals and waiting in sigtimedwait() is not enough: the kernel hands a process
/// signal to any thread that does not block it, and threads a library started before main() (OpenBLAS
/// starts its pool from a constructor) never had the mask set here, so whenever main was not inside
/// sigtimedwait (loading, shutting down) they took the signal and its default action killed the server
/// (exit 143) instead of stopping it. With a handler, whichever thread takes it only writes a byte.
int signal_pipe[2] = {-1, -1};

extern "C" void on_shutdown_signal(int sig) {
  const auto c = static_cast<unsigned char>(sig);
  [[maybe_unused]] const ssize_t n = write(signal_pipe[1], &c, 1);  // a full pipe already holds a signal
}

bool install_shutdown_signals() {
  if (pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return false;
  struct sigaction sa {};
  sa.sa_handler = on_shutdown_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  return sigaction(SIGTERM, &sa, nullptr) == 0 && sigaction(SIGINT, &sa, nullptr) == 0;
}

/// Waits up to `ms` for SIGTERM/SIGINT; true when one came.
bool signal_within(long ms) {
  pollfd p{signal_pipe[0], POLLIN, 0};
  (void)poll(&p, 1, static_cast<int>(ms));  // ends early on a byte, or on EINTR when main took the signal
  unsigned char sig = 0;
  if (read(signal_pipe[0], &sig, 1) != 1) return false;
  fmt::print(stderr, "infer-serve: received {}\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  return true;
}

/// Raises the open-file limit to its hard maximum (each connection is a descriptor; the soft limit is
/// often 1024) and returns how many connections fit under it, keeping 64 for the model files and the rest.
std::size_t connections_that_fit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return 1024 - 64;
  if (r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &r);
    (void)getrlimit(RLIMIT_NOFILE, &r);
  }
  return r.rlim_cur > 128 ? static_cast<std::size_t>(r.rlim_cur) - 64 : 64;
}

/// A tensor-parallel job's rank other than 0: loads its shard of the model with rank 0's settings and runs the
/// steps rank 0's engine runs (dist::follow_leader) until rank 0 stops it; no HTTP. mpirun passes SIGTERM and
/// SIGINT on to every rank: these ranks ignore them, since rank 0 drains and then stops them.
int follow_rank_zero(infer::programs::TensorParallelJob& tp, infer::ModelSpec spec, infer::LlmOptions llm,
                     const std::string& kv_memory) {
  std::signal(SIGTERM, SIG_IGN);
  std::signal(SIGINT, SIG_IGN);
  try {
    spec.validate();
    if (!kv_memory.empty()) llm.engine_options.kv_cache_bytes = infer::parse_memory_size(kv_memory);
    infer::apply_engine_file(spec, llm);
    if (const auto code = infer::programs::resolve_backend_or_exit("infer-serve", spec.backend)) return tp.fail(*code);
    if (!tp.attach("infer-serve", spec)) return tp.fail(2);
    infer::check_engine_choice(spec.backend, llm);
    llm.engine_options.validate();
    const auto engine = infer::make_engine(spec, llm);
    infer::dist::follow_leader(*engine, *tp.control());
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "infer-serve: {}error: {}\n", tp.who(), e.what());
    return tp.fail(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"OpenAI-compatible HTTP server", "infer-serve"};
  infer::ModelSpec spec;
  std::string kv_memory, router_config;
  bool no_prefix_caching = false;
  infer::LlmOptions llm;
  infer::serve::ServerOptions so;
  infer::serve::WorkerOptions wo;
  double drain_timeout_s = 30;
  double header_timeout_s = 5, body_timeout_s = 30, keep_alive_timeout_s = 5, write_timeout_s = 30;
  infer::programs::add_model_flags(app, spec);
  infer::programs::EngineFileFlags engine_file;
  infer::programs::add_engine_file_flags(app, engine_file);
  app.add_option("--gpu-memory-utilization", llm.engine_options.gpu_memory_utilization,
                 "cuda: fraction of device memory for weights, activations and the KV pool (without --kv-cache-memory)")
      ->check(CLI::Range(0.01, 1.0))
      ->capture_default_str();
  app.add_flag("--enforce-eager", llm.engine_options.enforce_eager, "cuda: run every step eagerly (no CUDA graphs)");
  infer::programs::add_kv_cache_dtype_flag(app, llm.engine_options.kv_cache_dtype);
  app.add_option("--engine", llm.engine, "paged (continuous batching) or static (fixed shape)")
      ->check(CLI::IsMember({"paged", "static"}));
  app.add_option("--block-size", llm.block_size, "paged engine: tokens per KV block (8, 16, 32 on the CPU; 16 on cuda)");
  infer::programs::add_shape_flags(app, llm.engine_options.static_shape);
  app.add_option("--kv-cache-memory", kv_memory,
                 "KV cache size, e.g. 512M, 2G (default: 512M paged on the CPU, --gpu-memory-utilization on cuda; the shape's need, static)");
  app.add_option("--max-model-len", llm.engine_options.max_model_len, "longest prompt + output (0 = the model's)");
  app.add_option("--max-num-seqs", llm.engine_options.scheduler.max_num_seqs, "sequences per step at most");
  app.add_option("--max-num-batched-tokens", llm.engine_options.scheduler.max_num_batched_tokens, "tokens per step at most");
  app.add_flag("--no-prefix-caching", no_prefix_caching, "do not reuse KV blocks of identical prompt prefixes");
  app.add_option("--chat-template", so.chat_template, "built-in template to use instead of the model's (chatml, llama3, llama3.1, mistral)");
  app.add_option("--host", so.http.host, "address to listen on")->capture_default_str();
  app.add_option("--port", so.http.port, "port to listen on (0: any free port, printed at start)")->capture_default_str();
  app.add_option("--api-key", so.api_key, "require 'Authorization: Bearer KEY' on /v1/* (also $INFER_API_KEY)")
      ->envname("INFER_API_KEY");
  app.add_option("--served-model-name", so.served_model_names, "model name(s) clients use (default: the file's name)");
  app.add_option("--max-waiting", wo.max_waiting, "requests waiting for a slot before new ones get 503")->capture_default_str();
  app.add_option("--stall-timeout", wo.stall_timeout_s, "seconds without engine progress, with work queued, before /health is 503")
      ->capture_default_str();
  app.add_option("--drain-timeout", drain_timeout_s, "seconds running requests may take to finish after SIGTERM")
      ->capture_default_str();
  app.add_option("--max-connections", so.http.max_connections,
                 "client connections open at once; beyond, a new one gets 503 (capped by the open-file limit)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--handler-threads", so.http.handler_threads,
                 "threads that parse and tokenize requests (the connections themselves are served by one event loop)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--header-timeout", header_timeout_s, "seconds a request's line and headers may take to arrive (408 beyond)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--body-timeout", body_timeout_s, "seconds a request's body may take to arrive (408 beyond)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--keep-alive-timeout", keep_alive_timeout_s, "seconds an idle connection stays open between requests")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--write-timeout", write_timeout_s, "seconds one write to a client may take (a client that stops reading is cut)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-request-body", so.http.max_body_bytes, "largest request body in bytes (413 beyond)")->capture_default_str();
  app.add_option("--max-choices", so.max_choices, "choices one request may ask for (prompts x n); 400 beyond")
      ->capture_default_str();
  app.add_option("--router", router_config, "a router config (JSON): several engines and the rules that pick one");
  int dp_size = 1;
  app.add_option("--data-parallel-size", dp_size,
                 "replicas of the engine behind the router (cuda: one per GPU, devices 0..N-1), balanced by prefix-cache "
                 "affinity and queue depth")
      ->check(CLI::Range(1, 64));
  int tp_size = 1;
  app.add_option("--tensor-parallel-size", tp_size,
                 "ranks the model is split over, one process each (mpirun -np N; cpu, or cuda over NCCL): rank 0 serves HTTP, the "
                 "others run its engine's steps with it")
      ->check(CLI::Range(1, 64));
  // Hidden from --help: the routes it adds let any client stall the server.
  app.add_flag("--enable-test-hooks", so.test_hooks, "tests only: POST /debug/hold and /debug/release park the engine loops")
      ->group("");
  CLI11_PARSE(app, argc, argv);
  llm.engine_options.enable_prefix_caching = !no_prefix_caching;
  auto ms = [](double s) { return std::chrono::milliseconds(static_cast<std::int64_t>(s * 1000)); };
  so.http.header_timeout = ms(header_timeout_s);
  so.http.body_timeout = ms(body_timeout_s);
  so.http.keep_alive_timeout = ms(keep_alive_timeout_s);
  so.http.write_timeout = ms(write_timeout_s);
  if (const std::size_t fit = connections_that_fit(); so.http.max_connections > fit) {
    fmt::print(stderr, "infer-serve: --max-connections {} is beyond the open-file limit; using {}\n",
               so.http.max_connections, fit);
    so.http.max_connections = fit;
  }
  // The tensor-parallel job starts before anything touches CUDA: it picks the rank's GPU (CUDA_VISIBLE_DEVICES).
  if (tp_size > 1 && (dp_size > 1 || !router_config.empty())) {
    fmt::print(stderr, "infer-serve: --tensor-parallel-size serves one engine; give it without --data-parallel-size "
                       "and --router\n");
    return 2;
  }
  infer::programs::TensorParallelJob tp("infer-serve", tp_size);
  if (!tp.ok()) return tp.fail(2);
  if (const auto code = infer::programs::prepare_engine_file("infer-serve", engine_file, spec, llm,
                                                             tp.place()))
    return tp.fail(*code);
  if (tp.rank() != 0) return follow_rank_zero(tp, spec, llm, kv_memory);
  if (tp.group() != nullptr) {  // rank 0 joins the device collectives where the followers do: before loading
    if (const auto code = infer::programs::resolve_backend_or_exit("infer-serve", spec.backend)) return tp.fail(*code);
    if (!tp.attach("infer-serve", spec)) return tp.fail(2);
  }
  so.model_path = spec.dummy.empty() ? spec.model.string() : spec.dummy;
  if (so.served_model_names.empty()) so.served_model_names.push_back(spec.name());

  // Request-sized buffers (a body, its JSON, a prompt: megabytes each) go straight to mmap and back to the
  // system when freed. glibc's default raises its mmap threshold to the size of the largest block freed
  // (up to 32 MiB), after which such buffers come from per-thread arenas that keep them: 100 rejected
  // 3-5 MB bodies grew the resident set by 23 MB that way, 0.9 MB with the threshold fixed at 1 MiB. The
  // engine's per-step buffers are smaller (SmolLM2, 64 sequences: 188 munmaps a run instead of 122).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);

  // The threads started below inherit a mask that blocks the shutdown signals, so none of their socket
  // calls is interrupted; main unblocks them once those threads exist and takes them through the handler.
  // A write to a closed socket must not kill the server.
  if (!install_shutdown_signals()) {
    fmt::print(stderr, "infer-serve: cannot set up the signal handlers: {}\n", std::strerror(errno));
    return tp.fail(1);
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  std::vector<std::unique_ptr<infer::serve::EngineWorker>> workers;
  std::vector<std::string> engine_models, engine_backends;  // what each worker loads and where, for the log
  std::unique_ptr<infer::serve::OpenAIServer> server;
  try {
    spec.validate();
    if (!kv_memory.empty()) llm.engine_options.kv_cache_bytes = infer::parse_memory_size(kv_memory);
    infer::serve::EngineSpec base{"default", llm, wo, spec};
    infer::serve::RouterConfig config;
    if (dp_size > 1) {
      if (!router_config.empty()) {
        fmt::print(stderr, "infer-serve: give --data-parallel-size or --router, not both (a router config lists "
                           "its replicas under \"replicas\")\n");
        return tp.fail(2);
      }
      const bool gpu = infer::resolve_backend(spec.backend) == "cuda";
      if (gpu && infer::cuda_devices() < dp_size) {
        fmt::print(stderr, "infer-serve: --data-parallel-size {} puts a replica on each of {} GPUs; this machine has {}\n",
                   dp_size, dp_size, infer::cuda_devices());
        return tp.fail(2);
      }
      config = infer::serve::replica_config(base, dp_size, gpu);
    } else if (router_config.empty()) {
      base.worker.name = llm.engine;
      base.name = llm.engine;
      config.engines.push_back(base);
      config.default_engine = base.name;
    } else {
      config = infer::serve::read_router_config(router_config, base);
    }
    std::vector<infer::serve::EngineWorker*> raw;
    for (auto& engine : config.engines) {
      infer::apply_engine_file(engine.model, engine.llm);  // a router config may name engine files too
      if (const auto code = infer::programs::resolve_backend_or_exit("infer-serve", engine.model.backend)) return tp.fail(*code);
      infer::check_engine_choice(engine.model.backend, engine.llm);
      engine.llm.engine_options.validate();
      workers.push_back(std::make_unique<infer::serve::EngineWorker>(
          [model = engine.model, options = engine.llm, control = tp.control()]() -> std::unique_ptr<infer::EngineHandle> {
            auto e = infer::make_engine(model, options);
            if (control == nullptr) return e;
            return std::make_unique<infer::dist::LockstepLeader>(std::move(e), *control);  // rank 0 of a TP job
          },
          engine.worker));
      raw.push_back(workers.back().get());
      engine_models.push_back(engine.model.name());
      engine_backends.push_back(engine.model.backend);
    }
    server = std::make_unique<infer::serve::OpenAIServer>(so, infer::serve::Router(config), raw);
    if (std::string why; !server->bind(&why)) {
      fmt::print(stderr, "infer-serve: cannot listen on {}:{}: {}\n", so.http.host, so.http.port, why);
      return tp.fail(1);
    }
  } catch (const infer::Error& e) {
    fmt::print(stderr, "infer-serve: {} error: {}\n", infer::to_string(e.code()), e.what());
    return tp.fail(1);
  } catch (const std::exception& e) {
    fmt::print(stderr, "infer-serve: error: {}\n", e.what());
    return tp.fail(1);
  }
  const std::string loading = workers.size() == 1 ? fmt::format("{} on {}", engine_models.front(), engine_backends.front())
                                                 : fmt::format("{} engines, in config order", workers.size());
  fmt::print(stderr, "infer-serve: listening on http://{}:{} (loading {}; backlog {}, up to {} connections)\n",
             so.http.host, server->port(), loading, infer::serve::HttpTransport::listen_backlog(),
             so.http.max_connections);
  if (tp.group() != nullptr)
    fmt::print(stderr, "infer-serve: tensor parallel over {} ranks; rank 0 (this process, pid {}) serves. To drain, send "
                       "it SIGTERM: mpirun's own SIGTERM or Ctrl-C ends every rank a second later (Open MPI's "
                       "odls_base_sigkill_timeout)\n", tp_size, static_cast<long>(getpid()));
  if (so.test_hooks)
    fmt::print(stderr, "infer-serve: test hooks enabled (POST /debug/hold, /debug/release): not for production\n");
  std::thread http([&] { server->serve(); });
  pthread_sigmask(SIG_UNBLOCK, &signals, nullptr);

  auto shut_down = [&](int code) {
    for (auto& w : workers) w->stop();  // aborts what is left; handlers waiting on it finish
    server->stop();
    http.join();
    fmt::print(stderr, "infer-serve: stopped\n");
    return code;
  };

  // Loading, one engine after another in config order: on the GPU each engine sizes its KV pool from
  // what the device has in use once its weights are in, the engines before it included. A signal stops
  // at once; a failed engine ends the server.
  bool stop_now = false;
  for (std::size_t k = 0; k < workers.size(); ++k) {
    auto& w = workers[k];
    w->start();
    while (!w->wait_loaded(std::chrono::milliseconds(100))) {
      if (w->state() == infer::serve::EngineWorker::State::failed) {
        fmt::print(stderr, "infer-serve: engine '{}' failed to load: {}\n", w->name(), w->load_error());
        return tp.fail(shut_down(1));
      }
      if (signal_within(0)) {
        stop_now = true;
        break;
      }
    }
    if (stop_now) break;
    const auto& i = w->info();
    fmt::print(stderr, "infer-serve: engine '{}' ready ({} on {}, {}, max_model_len {}, {} KV blocks)\n", w->name(),
               engine_models[k], i.backend, i.kind, i.max_model_len, w->snapshot().kv.total_blocks);
  }
  if (stop_now) return shut_down(0);
  // The server tokenizes a prompt once, before routing: every engine must read those ids the same way.
  for (std::size_t i = 1; i < workers.size(); ++i) {
    const infer::Tokenizer *a = workers.front()->tokenizer(), *b = workers[i]->tokenizer();
    std::optional<std::string> why;
    if ((a == nullptr) != (b == nullptr)) why = "one of them has no tokenizer";
    else if (a) why = infer::serve::tokenizer_difference(*a, *b);
    if (why) {
      fmt::print(stderr, "infer-serve: engines '{}' and '{}' read different tokenizers ({}); the router's engines "
                 "share one: give a dummy model the other's \"tokenizer\"\n", workers.front()->name(),
                 workers[i]->name(), *why);
      return tp.fail(shut_down(1));
    }
  }

  while (!signal_within(1000)) {
  }
  // Drain: refuse new requests, let running ones finish within the timeout.
  fmt::print(stderr, "infer-serve: draining ({} requests outstanding, up to {} s)\n", server->outstanding(), drain_timeout_s);
  for (auto& w : workers) w->begin_drain();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(drain_timeout_s);
  while (server->outstanding() > 0 && std::chrono::steady_clock::now() < deadline)
    if (signal_within(50)) break;
  if (server->outstanding() > 0)
    fmt::print(stderr, "infer-serve: aborting {} requests still outstanding\n", server->outstanding());
  return shut_down(0);
}
