#pragma once
/// \file
/// `StepTrace`: what one engine step did — the scheduler's plan (every chunk: request, sequence, tokens,
/// decode or prefill), who was admitted, preempted and finished, and the KV blocks and queues after it —
/// handed to the observer set with `Engine::set_step_observer` (or `LLM::set_step_observer`). It is built
/// only while an observer is set, so an engine without one pays nothing for it. `JsonlTraceWriter`
/// writes one JSON object per step: the format `infer-generate --trace FILE` writes.
///
/// ```
/// {"step":0,"chunks":[{"request":0,"seq":0,"start":0,"count":12,"kind":"prefill","samples":true}],
///  "admitted":[{"request":0,"seq":0}],"preempted":[],"finished":[],
///  "blocks":{"free":727,"used":1,"total":728},"waiting":3,"running":1}
/// ```
/// (one line per step in the file).

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <ostream>
#include <utility>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/engine/request_output.hpp"
#include "infer/sched/sequence.hpp"

namespace infer {

struct StepTrace {
  /// One sequence's share of the step, in batch order (decodes first).
  struct Chunk {
    RequestId request = 0;
    SeqId seq = 0;
    std::int32_t start = 0;  ///< first token computed
    std::int32_t count = 0;  ///< tokens computed
    bool decode = false;     ///< a running sequence's single next token (else a prefill or recompute chunk)
    bool samples = false;    ///< its last position's logits gave the sequence a token
  };
  struct SeqRef {
    RequestId request = 0;
    SeqId seq = 0;
  };
  struct Finished {
    RequestId request = 0;
    SeqId seq = 0;
    FinishReason reason = FinishReason::none;
  };

  std::int64_t step = 0;           ///< the engine's step index (EngineStats::steps before this step)
  std::vector<Chunk> chunks;
  std::vector<SeqRef> admitted;    ///< from waiting (new, or resuming after a preemption)
  std::vector<SeqRef> preempted;   ///< back to waiting, blocks freed (to be recomputed)
  std::vector<Finished> finished;  ///< sequences that ended in this step (stop, length, error)
  std::int32_t free_blocks = 0;    ///< KV blocks after the step
  std::int32_t used_blocks = 0;
  std::int32_t total_blocks = 0;
  std::size_t num_waiting = 0;     ///< after the step
  std::size_t num_running = 0;

  [[nodiscard]] std::int32_t num_tokens() const noexcept {
    std::int32_t n = 0;
    for (const auto& c : chunks) n += c.count;
    return n;
  }
};

/// Writes `t` as one line of JSON (the format above) followed by '\n'.
inline void write_jsonl(std::ostream& os, const StepTrace& t) {
  auto refs = [&os](const char* key, const std::vector<StepTrace::SeqRef>& v) {
    os << ",\"" << key << "\":[";
    for (std::size_t i = 0; i < v.size(); ++i)
      os << (i ? "," : "") << "{\"request\":" << v[i].request << ",\"seq\":" << v[i].seq << '}';
    os << ']';
  };
  os << "{\"step\":" << t.step << ",\"chunks\":[";
  for (std::size_t i = 0; i < t.chunks.size(); ++i) {
    const auto& c = t.chunks[i];
    os << (i ? "," : "") << "{\"request\":" << c.request << ",\"seq\":" << c.seq << ",\"start\":" << c.start
       << ",\"count\":" << c.count << ",\"kind\":\"" << (c.decode ? "decode" : "prefill")
       << "\",\"samples\":" << (c.samples ? "true" : "false") << '}';
  }
  os << ']';
  refs("admitted", t.admitted);
  refs("preempted", t.preempted);
  os << ",\"finished\":[";
  for (std::size_t i = 0; i < t.finished.size(); ++i)
    os << (i ? "," : "") << "{\"request\":" << t.finished[i].request << ",\"seq\":" << t.finished[i].seq
       << ",\"reason\":\"" << to_string(t.finished[i].reason) << "\"}";
  os << "],\"blocks\":{\"free\":" << t.free_blocks << ",\"used\":" << t.used_blocks << ",\"total\":" << t.total_blocks
     << "},\"waiting\":" << t.num_waiting << ",\"running\":" << t.num_running << "}\n";
}

/// A step observer that appends each step to a JSONL stream or file. Copyable (copies share the stream),
/// as std::function needs.
class JsonlTraceWriter {
 public:
  /// Writes to `os`, which must outlive every copy of the writer.
  explicit JsonlTraceWriter(std::ostream& os) : os_(std::shared_ptr<std::ostream>(), &os) {}
  /// Creates (truncates) `path`. IoError naming it when it cannot be opened.
  explicit JsonlTraceWriter(const std::filesystem::path& path) {
    auto file = std::make_shared<std::ofstream>(path);
    if (!*file) throw IoError(detail::cat("cannot write the step trace '", path.string(), "'"));
    os_ = std::move(file);
  }

  /// IoError when the stream fails (a full disk): a trace with holes would mislead.
  void operator()(const StepTrace& t) const {
    write_jsonl(*os_, t);
    if (!*os_) throw IoError(detail::cat("writing the step trace failed at step ", t.step));
  }

 private:
  std::shared_ptr<std::ostream> os_;  ///< owning for a file; aliasing (no ownership) for a caller's stream
};

}  // namespace infer
