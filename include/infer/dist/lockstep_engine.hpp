#pragma once
/// \file
/// One engine's requests driven from one rank: what a tensor-parallel server needs, where only rank 0 takes HTTP
/// requests but every rank holds a shard of the model and must run the same steps (their collectives pair up).
///
/// Rank 0's engine is a `LockstepLeader`, an EngineHandle around the real one: it records each request added and
/// each abort, and before every step broadcasts that record with the word "step"; `follow_leader()` on the other
/// ranks applies the same calls to their engines in the same order and steps them. The engines are the same
/// deterministic code over the same state, so they admit, schedule, preempt and sample alike: the model's own
/// per-step check (CPU LlamaModel::check_same_step) fails the step on every rank if they ever differ. A request the
/// leader's engine refused is not sent (its id is not taken). A request without a seed gets one from the leader
/// before it is recorded, so every rank samples the same tokens. The leader's destructor sends "stop".
///
/// The channel is any Group, broadcasting from rank 0. A follower waits there between requests for as long as the
/// leader is idle: give it a group whose waits do not time out (the server's control group), since a timeout there
/// would end an idle server. The model's collectives keep their timeouts.
///
/// A message is one broadcast of kInlineBytes (its size, then the record when it fits) and, for a larger record
/// (a long prompt), a second broadcast of the rest: one collective per step in the common case.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/dist/communicator.hpp"
#include "infer/dist/request_wire.hpp"
#include "infer/engine/engine_registry.hpp"

namespace infer::dist {

namespace lockstep {

enum class Op : std::uint8_t { add = 1, abort = 2, step = 3, stop = 4 };

/// Bytes of a message's first broadcast: its size (8 bytes), then as much of the record as fits.
inline constexpr std::size_t kInlineBytes = 4096;

inline void send(Group& g, std::span<const std::byte> record) {
  std::vector<std::byte> head(kInlineBytes);
  const auto n = static_cast<std::uint64_t>(record.size());
  std::memcpy(head.data(), &n, sizeof n);
  const std::size_t inline_n = std::min(record.size(), kInlineBytes - sizeof n);
  std::memcpy(head.data() + sizeof n, record.data(), inline_n);
  g.broadcast(head, 0);
  if (inline_n < record.size()) {
    std::vector<std::byte> rest(record.begin() + static_cast<std::ptrdiff_t>(inline_n), record.end());
    g.broadcast(rest, 0);
  }
}

inline std::vector<std::byte> receive(Group& g) {
  std::vector<std::byte> head(kInlineBytes);
  g.broadcast(head, 0);
  std::uint64_t n = 0;
  std::memcpy(&n, head.data(), sizeof n);
  const std::size_t inline_n = std::min<std::uint64_t>(n, kInlineBytes - sizeof n);
  std::vector<std::byte> record(head.begin() + sizeof n, head.begin() + static_cast<std::ptrdiff_t>(sizeof n + inline_n));
  if (inline_n < n) {
    std::vector<std::byte> rest(n - inline_n);
    g.broadcast(rest, 0);
    record.insert(record.end(), rest.begin(), rest.end());
  }
  return record;
}

}  // namespace lockstep

/// Rank 0's engine in a lockstep group (see the file comment). `control` must outlive it.
class LockstepLeader final : public EngineHandle {
 public:
  LockstepLeader(std::unique_ptr<EngineHandle> engine, Group& control)
      : engine_(std::move(engine)), control_(control), seeds_(std::random_device{}()) {
    require<InvalidArgument>(engine_ != nullptr, "LockstepLeader: no engine");
    require<InvalidArgument>(control_.rank() == 0, "LockstepLeader: the leader is rank 0 of its group, not rank ",
                             control_.rank());
  }
  LockstepLeader(const LockstepLeader&) = delete;
  LockstepLeader& operator=(const LockstepLeader&) = delete;
  ~LockstepLeader() override {
    try {
      record_.put(lockstep::Op::stop);
      lockstep::send(control_, record_.bytes());
    } catch (...) {  // a follower gone already: nothing is left to stop
    }
  }

  RequestId add_request(std::vector<std::int32_t> prompt, SamplingParams params) override {
    if (!params.seed) params.seed = seeds_();
    const std::size_t before = record_.size();
    record_.put(lockstep::Op::add);
    record_.put(prompt);
    put(record_, params);
    try {
      const RequestId id = engine_->add_request(std::move(prompt), std::move(params));
      record_.put(id);
      return id;
    } catch (...) {
      record_.truncate(before);  // refused here, so never sent: the followers' next id stays this one's
      throw;
    }
  }
  void abort(RequestId id) override {
    engine_->abort(id);
    record_.put(lockstep::Op::abort);
    record_.put(id);
  }
  std::vector<RequestOutput> step() override {
    record_.put(lockstep::Op::step);
    lockstep::send(control_, record_.bytes());
    record_.clear();
    return engine_->step();
  }

  [[nodiscard]] bool has_unfinished() const override { return engine_->has_unfinished(); }
  [[nodiscard]] std::size_t num_waiting() const override { return engine_->num_waiting(); }
  [[nodiscard]] std::size_t num_running() const override { return engine_->num_running(); }
  [[nodiscard]] KvStats kv_stats() const override { return engine_->kv_stats(); }
  [[nodiscard]] EngineStats stats() const override { return engine_->stats(); }
  [[nodiscard]] const ModelConfig& config() const override { return engine_->config(); }
  [[nodiscard]] const Tokenizer* tokenizer() const override { return engine_->tokenizer(); }
  [[nodiscard]] EngineInfo info() const override { return engine_->info(); }
  void set_step_observer(std::function<void(const StepTrace&)> observer) override {
    engine_->set_step_observer(std::move(observer));
  }

 private:
  std::unique_ptr<EngineHandle> engine_;
  Group& control_;
  WireWriter record_;        ///< the calls since the last step, sent with the next step (or stop)
  std::mt19937_64 seeds_;    ///< seeds for requests that come without one
};

/// A follower's loop (see the file comment): applies the leader's calls to `engine` and steps it, until the leader
/// stops. Returns the number of steps run. DistributedError when this engine does not do what the leader's did
/// (a request it refuses, another id), which would leave the ranks' collectives unpaired.
inline std::size_t follow_leader(EngineHandle& engine, Group& control) {
  require<InvalidArgument>(control.rank() != 0, "follow_leader: rank 0 of the group is the leader");
  std::size_t steps = 0;
  for (;;) {
    const std::vector<std::byte> message = lockstep::receive(control);
    WireReader r(message);
    for (;;) {
      const auto op = r.get<lockstep::Op>();
      if (op == lockstep::Op::stop) return steps;
      if (op == lockstep::Op::step) {
        if (!r.done()) throw DistributedError("lockstep: the leader's message goes on after its step");
        (void)engine.step();
        ++steps;
        break;
      }
      if (op == lockstep::Op::abort) {
        engine.abort(r.get<RequestId>());
      } else if (op == lockstep::Op::add) {
        auto prompt = r.get<std::vector<std::int32_t>>();
        SamplingParams params = get_sampling_params(r);
        RequestId id = 0;
        try {
          id = engine.add_request(std::move(prompt), std::move(params));
        } catch (const std::exception& e) {
          throw DistributedError(detail::cat("lockstep: rank ", control.rank(),
                                             " refused a request rank 0 accepted: ", e.what()));
        }
        const auto want = r.get<RequestId>();
        if (id != want)
          throw DistributedError(detail::cat("lockstep: rank ", control.rank(), " gave request id ", id,
                                             " where rank 0 gave ", want));
      } else {
        throw DistributedError(detail::cat("lockstep: unknown operation ", static_cast<int>(op), " from rank 0"));
      }
    }
  }
}

}  // namespace infer::dist
