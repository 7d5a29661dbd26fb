#pragma once
/// \file
/// `Engine<Backend, Model, BlockAllocator, Scheduler, AttentionKernel, Quantizer>`: the composition of the
/// four policies into something that turns requests into tokens. One iteration (`step()`):
///
///   plan = scheduler.schedule(allocator)       who runs, how many tokens each, who is preempted
///   cache.copy_block(...) for plan.copies      copy-on-write decided by the allocator
///   model.forward(plan's chunks, cache)        one batched forward pass, logits of the sampling rows
///   sample, append, scheduler.update(plan)     tokens join their sequences; computed blocks are cached
///   stop checks, scheduler.finish(...)         finished sequences return their blocks at once
///
/// The engine owns requests, sequences, the KV storage and the model; policies own only decisions and
/// metadata. Everything a user can get wrong (sampling parameters, a prompt beyond the context, a shape
/// the static engine was not built for) is rejected in add_request() with a typed error before any block
/// is taken, and an aborted or failed request releases its blocks in the same call.
///
/// What a policy can get wrong is checked too (sched/invariants.hpp): a scheduler whose finish() leaves a
/// sequence holding blocks, or that plans an empty step while it holds sequences, makes the engine throw
/// PolicyError naming the scheduler, instead of leaking the cache until run_to_completion() spins.
///
/// The scheduler is built from `EngineOptions::scheduler`, or passed in built (a policy with parameters);
/// `scheduler()` reaches it, and `set_step_observer` reports every step (engine/step_trace.hpp).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "infer/concepts.hpp"
#include "infer/engine/engine_options.hpp"
#include "infer/engine/request_output.hpp"
#include "infer/engine/step_trace.hpp"
#include "infer/model/forward_batch.hpp"
#include "infer/model/kv_cache.hpp"
#include "infer/model/model_source.hpp"
#include "infer/sampling/sampler.hpp"
#include "infer/sampling/sampling_params.hpp"
#include "infer/sampling/stop_checker.hpp"
#include "infer/sched/invariants.hpp"
#include "infer/tokenizer/incremental_decoder.hpp"
#include "infer/tokenizer/tokenizer.hpp"

namespace infer {

/// Counters over the engine's life (the server's /metrics and the programs' summaries read these).
struct EngineStats {
  std::int64_t steps = 0;
  std::int64_t requests_added = 0;
  std::int64_t requests_finished = 0;
  std::int64_t prompt_tokens = 0;      ///< prompt tokens of admitted requests
  std::int64_t computed_tokens = 0;    ///< tokens run through the model (prefill chunks + decodes)
  std::int64_t generated_tokens = 0;
  std::int64_t preemptions = 0;
};

namespace engine_detail {
/// Builds an allocator from the KV budget: the paged allocator cuts it into blocks; a fixed-shape
/// allocator needs its exact size. Either way the engine refuses to start when one sequence of the
/// longest allowed length cannot fit, naming both numbers and the option to change.
template <class A>
A make_allocator(const EngineOptions& o, std::size_t kv_bytes_per_token, std::int32_t max_model_len,
                 std::size_t default_bytes) {
  using detail::cat;
  if constexpr (requires(const A& a) { a.shape(); }) {
    A alloc = [&] {
      if constexpr (requires { A(o.static_shape); }) return A(o.static_shape);
      else return A{};
    }();
    const Shape s{alloc.shape().max_batch, alloc.shape().max_input, alloc.shape().max_output};
    const std::size_t need = alloc.required_bytes(kv_bytes_per_token);
    if (o.kv_cache_bytes != 0 && o.kv_cache_bytes < need)
      throw InvalidArgument(cat("KV cache of ", o.kv_cache_bytes, " bytes is too small for this static engine: its ",
                                s.max_batch, " slots of ", s.capacity(), " tokens need ", need,
                                " bytes; raise kv_cache_bytes (--kv-cache-memory) or build a smaller Shape"));
    if (s.capacity() > max_model_len)
      throw InvalidArgument(cat("this static engine's slots hold max_input + max_output = ", s.capacity(),
                                " tokens, more than the model's context of ", max_model_len,
                                " tokens; build a Shape that fits or raise max_model_len"));
    return alloc;
  } else {
    const std::size_t bytes = o.kv_cache_bytes ? o.kv_cache_bytes : default_bytes;
    const std::int32_t blocks = A::blocks_for_budget(bytes, kv_bytes_per_token);
    A alloc(std::max<std::int32_t>(blocks, 1), o.enable_prefix_caching);
    if (!alloc.can_ever_fit(max_model_len))
      throw InvalidArgument(cat("KV cache of ", bytes, " bytes holds ", blocks, " blocks of ",
                                alloc.block_size(), " tokens (", static_cast<std::int64_t>(blocks) * alloc.block_size(),
                                " tokens), less than one sequence of max_model_len = ", max_model_len,
                                " tokens; raise kv_cache_bytes (--kv-cache-memory) or lower max_model_len "
                                "(--max-model-len)"));
    return alloc;
  }
}

template <class S>
S make_scheduler(const EngineOptions& o) {
  if constexpr (std::is_constructible_v<S, SchedulerConfig>) return S(o.scheduler);
  else return S{};
}
}  // namespace engine_detail

template <class B, class Model, class A, class S, class Attn, class Q>
class Engine {
  static_assert(Backend<B>, "infer::Engine<Backend, ...>: Backend must be infer::cpu or infer::cuda");
  // Each diagnose_* reports every missing or mistyped member of its policy first (concepts.hpp).
  static_assert(diagnose_block_allocator<A>(),
                "infer::Engine<..., BlockAllocator, ...>: this type does not satisfy infer::BlockAllocator; the "
                "errors above name each missing or mistyped member (see infer/concepts.hpp)");
  static_assert(diagnose_scheduler<S, A>(),
                "infer::Engine<..., Scheduler, ...>: this type does not satisfy infer::Scheduler for the chosen "
                "allocator; the errors above name each missing or mistyped member (see infer/concepts.hpp)");
  static_assert(diagnose_attention_kernel<Attn, B>(),
                "infer::Engine<..., AttentionKernel, ...>: this type does not satisfy infer::AttentionKernel on the "
                "chosen backend; the errors above name each missing or mistyped member (see infer/concepts.hpp)");
  static_assert(diagnose_quantizer<Q, B>(),
                "infer::Engine<..., Quantizer>: this type does not satisfy infer::Quantizer on the chosen backend; "
                "the errors above name each missing or mistyped member (see infer/concepts.hpp)");
  static_assert(A::layout == Attn::layout,
                "infer::Engine: the allocator's KV layout differs from the attention kernel's: a paged allocator "
                "needs PagedAttention, a contiguous one FusedContiguousAttention");

 public:
  using backend = B;
  using allocator_type = A;
  using scheduler_type = S;
  using quantizer_type = Q;
  using model_type = typename Model::template decoder<B, Q, Attn>;

  /// Loads the model at `path` (a .gguf file or a Hugging Face folder) and sizes the KV cache.
  explicit Engine(const std::filesystem::path& path, EngineOptions options = {})
      : Engine(ModelSource::open(path), std::move(options)) {}

  Engine(ModelSource source, EngineOptions options)
      : Engine(Build{}, std::move(source), (options.validate(), engine_detail::make_scheduler<S>(options)), options) {}

  /// With a scheduler built by the caller (e.g. `ContinuousBatchScheduler<MyPolicy>(config, MyPolicy{0.5})`);
  /// `options.scheduler` is then unused, and the step bounds the model reserves for are the scheduler's.
  Engine(const std::filesystem::path& path, EngineOptions options, S scheduler)
      : Engine(ModelSource::open(path), std::move(options), std::move(scheduler)) {}

  Engine(ModelSource source, EngineOptions options, S scheduler)
      : Engine(Build{}, std::move(source), std::move(scheduler), (options.validate(), std::move(options))) {}

 private:
  struct Build {};
  /// The one that builds; `options` are validated.
  Engine(Build, ModelSource source, S scheduler, EngineOptions options)
      : options_(std::move(options)),
        source_(std::make_unique<ModelSource>(std::move(source))),
        model_(model_type::load(*source_)),
        max_model_len_(resolve_max_len(model_.config(), options_)),
        scheduler_(std::move(scheduler)),
        alloc_(engine_detail::make_allocator<A>(options_, kv_bytes_per_token(), max_model_len_, kv_budget())),
        cache_(static_cast<std::int32_t>(model_.config().num_layers), alloc_.num_blocks(), alloc_.block_size(),
               static_cast<std::int32_t>(model_.config().num_kv_heads), static_cast<std::int32_t>(model_.config().head_dim),
               options_.kv_cache_dtype),
        sampler_(std::nullopt) {
    // EOS is the tokenizer's; a config may list more end tokens (Llama 3: <|eot_id|>, <|eom_id|>), which
    // act as stop token ids of every request.
    const Tokenizer* tok = source_->tokenizer();
    if (tok && tok->eos_id()) eos_id_ = *tok->eos_id();
    for (auto id : model_.config().eos_token_ids) {
      const auto v = static_cast<std::int32_t>(id);
      if (!eos_id_) eos_id_ = v;
      else if (v != *eos_id_) extra_eos_ids_.push_back(v);
    }
    sampler_ = Sampler(eos_id_);
    if constexpr (kBoundsFromAllocator && requires { model_.reserve(step_bounds()); }) model_.reserve(step_bounds());
    // An FP8 cache takes the checkpoint's K/V scales where it ships them (1.0 otherwise, as vLLM), before the
    // GPU model captures graphs that carry them.
    if (options_.kv_cache_dtype == KvCacheDtype::fp8_e4m3)
      for (std::int32_t l = 0; l < cache_.num_layers(); ++l)
        if (const auto s = source_->kv_cache_scales(l)) cache_.set_scales(l, s->k, s->v);
    if constexpr (requires { model_.prepare(cache_, max_model_len_, true); })
      model_.prepare(cache_, max_model_len_, !options_.enforce_eager);  // GPU: tables, workspace, graphs
  }

 public:
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  [[nodiscard]] const ModelConfig& config() const noexcept { return model_.config(); }
  [[nodiscard]] const Tokenizer* tokenizer() const noexcept { return source_->tokenizer(); }
  [[nodiscard]] const ModelSource& source() const noexcept { return *source_; }
  [[nodiscard]] std::int32_t max_model_len() const noexcept { return max_model_len_; }
  [[nodiscard]] const EngineOptions& options() const noexcept { return options_; }
  [[nodiscard]] KvStats kv_stats() const { return alloc_.stats(); }
  [[nodiscard]] const EngineStats& stats() const noexcept { return stats_; }
  [[nodiscard]] const A& allocator() const noexcept { return alloc_; }
  [[nodiscard]] const S& scheduler() const noexcept { return scheduler_; }
  /// The scheduler itself, e.g. to change its policy's parameters between runs; not for planning steps.
  [[nodiscard]] S& scheduler() noexcept { return scheduler_; }
  [[nodiscard]] const model_type& model() const noexcept { return model_; }
  /// The decoder itself, for diagnostics (e.g. LlamaModel<cuda>::set_step_timing); not for stepping it.
  [[nodiscard]] model_type& model() noexcept { return model_; }
  [[nodiscard]] const KvCache<B>& kv_cache() const noexcept { return cache_; }
  [[nodiscard]] bool has_unfinished() const noexcept { return !requests_.empty() || !pending_.empty(); }
  [[nodiscard]] std::size_t num_unfinished() const noexcept { return requests_.size(); }
  [[nodiscard]] std::size_t num_waiting() const { return scheduler_.num_waiting(); }
  [[nodiscard]] std::size_t num_running() const { return scheduler_.num_running(); }

  /// The largest step the scheduler plans; a scheduler that does not say is taken to keep to the options'
  /// token budget and sequence limit.
  [[nodiscard]] StepBounds step_bounds() const {
    if constexpr (kBoundsFromAllocator)
      return scheduler_.bounds(alloc_);
    else if constexpr (requires { { scheduler_.bounds() } -> std::same_as<StepBounds>; })
      return scheduler_.bounds();
    else
      return {options_.scheduler.max_num_batched_tokens, options_.scheduler.max_num_seqs};
  }

  /// Calls `observer` after every step that computed something, with what the step did (StepTrace); an
  /// empty function stops it. An exception from the observer leaves step() once the step is complete (its
  /// outputs are then not returned: finished requests are gone).
  void set_step_observer(std::function<void(const StepTrace&)> observer) { observer_ = std::move(observer); }

  /// Queues a request. InvalidArgument (nothing queued, nothing allocated) for invalid sampling
  /// parameters, an empty prompt, token ids outside the vocabulary, a prompt plus max_tokens beyond
  /// max_model_len, or a request this engine's shape can never run.
  RequestId add_request(std::vector<std::int32_t> prompt, SamplingParams params) {
    using detail::cat;
    const auto& cfg = model_.config();
    params.validate(static_cast<std::int32_t>(cfg.vocab_size));
    require<InvalidArgument>(!prompt.empty(), "the prompt is empty: give at least one token");
    for (std::size_t i = 0; i < prompt.size(); ++i)
      require<InvalidArgument>(prompt[i] >= 0 && prompt[i] < cfg.vocab_size, "prompt token ", prompt[i],
                               " at position ", i, " is outside the vocabulary [0, ", cfg.vocab_size, ")");
    if constexpr (A::layout == KvLayout::contiguous)
      require<InvalidArgument>(params.n == 1, "n = ", params.n, ": this static engine gives each request one slot, so "
                               "one sample; use the paged engine for n > 1");
    require<InvalidArgument>(params.stop.empty() || source_->tokenizer() != nullptr,
                             "stop strings need a tokenizer, and ", source_->describe(), " has none; use stop_token_ids");
    if constexpr (!kPromptScores)
      if (params.prompt_logprobs)
        throw UnsupportedError("prompt_logprobs: this engine's model does not compute the logprobs of prompt tokens "
                               "yet (the cpu backend does)");
    const auto plen = static_cast<std::int64_t>(prompt.size());
    require<InvalidArgument>(plen + params.max_tokens <= max_model_len_, "the prompt has ", plen,
                             " tokens and max_tokens is ", params.max_tokens, ": ", plen + params.max_tokens,
                             " tokens in all, beyond this engine's max_model_len of ", max_model_len_,
                             "; shorten the prompt or lower max_tokens");

    const RequestId id = next_request_++;
    auto req = std::make_unique<RequestState>();
    for (auto e : extra_eos_ids_)
      if (!params.ignore_eos && std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), e) ==
                                    params.stop_token_ids.end())
        params.stop_token_ids.push_back(e);
    req->params = std::move(params);
    req->output.id = id;
    req->output.prompt_token_ids = prompt;
    req->output.metrics.arrival = Clock::now();
    req->output.metrics.prompt_tokens = static_cast<std::int32_t>(plen);
    req->output.outputs.resize(static_cast<std::size_t>(req->params.n));
    req->samples.reserve(static_cast<std::size_t>(req->params.n));  // Sample references stay valid across forks
    for (std::int32_t i = 0; i < req->params.n; ++i) req->output.outputs[static_cast<std::size_t>(i)].index = i;
    // Only sample 0 is scheduled now; the others fork from it once the prompt is computed, sharing its blocks.
    auto& first = req->samples.emplace_back(make_sample(*req, 0));
    first.seq->tokens = std::move(prompt);
    first.seq->prompt_len = static_cast<std::int32_t>(plen);
    first.seq->max_len = static_cast<std::int32_t>(plen + req->params.max_tokens);
    first.seq->arrival = next_arrival_++;
    first.seq->priority = req->params.priority;
    first.seq->tag = req->params.tag;
    if (req->params.prompt_logprobs) {
      first.seq->skip_prefix_cache_hits = true;  // every prompt token must be computed to be scored
      req->output.prompt_logprobs.assign(static_cast<std::size_t>(plen), std::nullopt);
    }
    scheduler_.check(*first.seq, std::as_const(alloc_));  // throws before anything is queued
    if (req->params.prompt_logprobs) ++scoring_requests_;
    scheduler_.add(first.seq.get());
    stats_.requests_added++;
    stats_.prompt_tokens += plen;
    requests_.emplace(id, std::move(req));
    return id;
  }

  /// Convenience: tokenizes `prompt` with the model's tokenizer (special tokens parsed, BOS as the model says).
  RequestId add_request(std::string_view prompt, SamplingParams params) {
    const Tokenizer* tok = require_tokenizer();
    return add_request(tok->encode(prompt), std::move(params));
  }

  /// Cancels a request: its sequences leave the scheduler and their blocks return to the pool now; its
  /// final output (FinishReason::abort) comes with the next step(). Unknown or finished ids are ignored.
  void abort(RequestId id) {
    auto it = requests_.find(id);
    if (it == requests_.end()) return;
    RequestState& req = *it->second;
    for (auto& s : req.samples) finish_sample(req, s, FinishReason::abort);
    complete_pending_forks(req, FinishReason::abort);
    pending_.push_back(req.output);
    retire(it);
  }

  /// One iteration. Returns the requests that changed: new tokens (delta_* fields) or finished.
  std::vector<RequestOutput> step() {
    std::vector<RequestOutput> out = std::move(pending_);
    pending_.clear();
    StepPlan plan = scheduler_.schedule(alloc_);
    for (Sequence* s : plan.preempted) {
      stats_.preemptions++;
      if (auto* r = owner(s)) r->output.metrics.preemptions++;
    }
    for (const BlockCopy& c : plan.copies) cache_.copy_block(c.src, c.dst);
    require_progress<S>(plan, scheduler_.num_waiting(), scheduler_.num_running(), alloc_);
    if (plan.empty()) return out;
    if (observer_) begin_trace(plan);
    stats_.steps++;

    chunks_.clear();
    for (const ScheduledChunk& c : plan.chunks) {
      const auto tokens = std::span<const std::int32_t>(c.seq->tokens).subspan(static_cast<std::size_t>(c.start),
                                                                              static_cast<std::size_t>(c.count));
      chunks_.push_back(ForwardChunk{tokens, c.start, alloc_.block_table(*c.seq), c.samples});
      stats_.computed_tokens += c.count;
    }
    const bool scores = attach_score_targets(plan);
    const Pick pick = scores ? Pick::host : choose_pick(plan);
    try {
      if constexpr (kDeviceArgmax) {
        if (pick == Pick::device_argmax) model_.forward_greedy(chunks_, cache_, greedy_ids_);
      }
      if constexpr (kDeviceSample) {
        if (pick == Pick::device_sample) {
          sample_rows_.clear();
          for (const ScheduledChunk& c : plan.chunks) {
            if (!c.samples) continue;
            RequestState& req = *owner(c.seq);
            Sample& s = sample_of(req, c.seq);
            sample_rows_.push_back(SampleRow{&req.params, s.seq->prompt(), s.seq->output(), &s.rng});
          }
          model_.forward_sample(chunks_, cache_, sample_rows_, eos_id_, device_results_);
        }
      }
      if (pick == Pick::host) {
        if constexpr (kPromptScores) model_.forward(chunks_, cache_, logits_, scores ? &scores_ : nullptr);
        else model_.forward(chunks_, cache_, logits_);
      }
    } catch (const std::exception& e) {
      fail_plan(plan, e.what(), out);
      end_trace();
      return out;
    }
    if (scores) record_prompt_logprobs(plan);

    // Sample every row first (a row's logits are processed in place), then apply. A row that cannot be
    // sampled (non-finite logits) fails its request alone.
    const auto vocab = static_cast<std::size_t>(model_.config().vocab_size);
    std::size_t row = 0;
    touched_.clear();
    forks_.clear();
    failed_.clear();
    for (const ScheduledChunk& c : plan.chunks) {
      if (!c.samples) continue;
      RequestState* req = owner(c.seq);
      Sample& s = sample_of(*req, c.seq);
      const std::size_t r = row++;
      if (pick == Pick::device_argmax || pick == Pick::device_sample) {
        s.pending = pick == Pick::device_argmax
                        ? SampleResult{greedy_ids_[r], std::numeric_limits<float>::quiet_NaN(), {}}
                        : std::move(device_results_[r]);
        if (s.pending->token < 0) {
          s.pending.reset();
          failed_.emplace_back(req->output.id, "the model's logits for this request are not finite (NaN, +inf, or all "
                                               "-inf): no token can be drawn");
          continue;
        }
        touched_.push_back(c.seq);
        continue;
      }
      auto logits = std::span<float>(logits_).subspan(r * vocab, vocab);
      const bool forks_now = req->samples.size() == 1 && req->params.n > 1 && c.seq->num_generated() == 0;
      if (forks_now) fork_rows_.assign(logits.begin(), logits.end());  // the siblings sample from the same row
      try {
        s.pending = draw(*req, s, logits);
      } catch (const InvalidArgument& e) {  // the sampler's refusal of non-finite logits
        failed_.emplace_back(req->output.id, e.what());
        continue;
      }
      touched_.push_back(c.seq);
      if (forks_now) forks_.push_back(c.seq);
    }
    for (Sequence* seq : touched_) {
      RequestState* req = owner(seq);
      Sample& s = sample_of(*req, seq);
      seq->tokens.push_back(s.pending->token);
    }
    scheduler_.update(plan, alloc_);
    for (Sequence* parent : forks_) fork_siblings(*owner(parent), *parent);

    for (Sequence* seq : touched_) {
      RequestState* req = owner(seq);
      accept_token(*req, sample_of(*req, seq));
    }
    for (Sequence* parent : forks_) {
      RequestState* req = owner(parent);
      for (std::size_t i = 1; i < req->samples.size(); ++i) accept_token(*req, req->samples[i]);
    }

    for (const auto& [id, why] : failed_) fail_request(id, why, out);

    // Report every request that changed, then drop the finished ones.
    for (Sequence* seq : touched_) {
      const RequestState* r = owner(seq);
      if (r == nullptr) continue;  // its request was retired earlier in this loop
      auto it = requests_.find(r->output.id);
      if (it == requests_.end() || it->second->reported_step == stats_.steps) continue;
      RequestState& req = *it->second;
      req.reported_step = stats_.steps;
      out.push_back(req.output);
      for (auto& o : req.output.outputs) {
        o.delta_text.clear();
        o.delta_token_ids.clear();
      }
      if (req.output.finished) retire(it);
    }
    end_trace();
    return out;
  }

  /// Runs steps until every request has finished; returns the final outputs in request order.
  std::vector<RequestOutput> run_to_completion() {
    std::map<RequestId, RequestOutput> done;
    while (has_unfinished()) {
      for (auto& o : step())
        if (o.finished) done[o.id] = std::move(o);
    }
    std::vector<RequestOutput> out;
    out.reserve(done.size());
    for (auto& [id, o] : done) out.push_back(std::move(o));
    return out;
  }

 private:
  struct Sample {
    std::unique_ptr<Sequence> seq;
    SeqRng rng;
    StopChecker stop;
    std::optional<IncrementalDecoder> detok;  ///< absent when the model has no tokenizer (ids only)
    std::optional<SampleResult> pending;  ///< drawn this step, not yet applied
    bool done = false;
  };
  struct RequestState {
    SamplingParams params;
    std::vector<Sample> samples;
    RequestOutput output;
    std::int64_t reported_step = -1;
    std::int32_t unfinished = 0;
  };

  /// A fixed-shape allocator's bounds come from its shape (`S::bounds(alloc)`), so the allocator must exist;
  /// a paged one's from the scheduler's configuration (`S::bounds()`), known before the KV pool is sized.
  static constexpr bool kBoundsFromAllocator = requires(const S& s, const A& a) {
    { s.bounds(a) } -> std::same_as<StepBounds>;
  };

  /// KV bytes a token takes in the cache this engine builds; InvalidArgument first when an FP8 cache is asked
  /// of an attention kernel that does not read one (concepts.hpp, reads_fp8_kv_cache).
  std::size_t kv_bytes_per_token() const {
    require_kv_cache_reader<Attn, B>(options_.kv_cache_dtype, "infer::Engine");
    return model_.kv_bytes_per_token(options_.kv_cache_dtype);
  }

  /// The KV budget when options give none. A GPU model first reserves the activations of the largest
  /// step, then says what gpu_memory_utilization leaves; the CPU takes a fixed default. A fixed-shape
  /// allocator needs no budget (its shape says what it takes); its model reserves once the allocator exists.
  std::size_t kv_budget() {
    if constexpr (kBoundsFromAllocator) {
      return 0;
    } else {
      if constexpr (requires { model_.reserve(step_bounds()); }) model_.reserve(step_bounds());
      if constexpr (requires { model_.default_kv_cache_bytes(options_); })
        return model_.default_kv_cache_bytes(options_);
      else
        return EngineOptions::default_paged_kv_bytes;
    }
  }

  static constexpr bool kDeviceArgmax =
      requires(model_type& m, std::vector<ForwardChunk>& ch, KvCache<B>& kv, std::vector<std::int32_t>& ids) {
        m.forward_greedy(ch, kv, ids);
      };
  static constexpr bool kDeviceSample =
      requires(model_type& m, std::vector<ForwardChunk>& ch, KvCache<B>& kv, std::vector<SampleRow>& rows,
               std::optional<std::int32_t> eos, std::vector<SampleResult>& res) { m.forward_sample(ch, kv, rows, eos, res); };

  static constexpr bool kPromptScores =
      requires(model_type& m, std::vector<ForwardChunk>& ch, KvCache<B>& kv, std::vector<float>& l, std::vector<float>* sc) {
        m.forward(ch, kv, l, sc);
      };

  /// Gives every chunk of a request that asked for prompt logprobs its score targets: row i of a chunk at
  /// position p is scored against the prompt token at p + 1 (-1 past the prompt). Returns whether any chunk
  /// has targets.
  bool attach_score_targets(const StepPlan& plan) {
    score_targets_.clear();
    if (scoring_requests_ == 0) return false;  // no owner lookups on the steps of engines nobody asks to score
    std::vector<std::pair<std::size_t, std::size_t>> spans;  // chunk index → offset into score_targets_
    for (std::size_t k = 0; k < plan.chunks.size(); ++k) {
      const ScheduledChunk& c = plan.chunks[k];
      if (!owner(c.seq)->params.prompt_logprobs || c.start >= c.seq->prompt_len) continue;
      spans.emplace_back(k, score_targets_.size());
      for (std::int32_t i = 0; i < c.count; ++i) {
        const std::int32_t next = c.start + i + 1;
        score_targets_.push_back(next < c.seq->prompt_len ? c.seq->tokens[static_cast<std::size_t>(next)] : -1);
      }
    }
    for (const auto& [k, off] : spans)
      chunks_[k].score_targets = std::span<const std::int32_t>(score_targets_).subspan(off, chunks_[k].tokens.size());
    return !spans.empty();
  }

  /// Copies the model's scores of this step's scored rows into their requests' prompt_logprobs.
  void record_prompt_logprobs(const StepPlan& plan) {
    std::size_t row = 0;
    for (std::size_t k = 0; k < plan.chunks.size(); ++k) {
      const ForwardChunk& c = chunks_[k];
      if (!c.score_targets.empty()) {
        auto& lp = owner(plan.chunks[k].seq)->output.prompt_logprobs;
        for (std::size_t i = 0; i < c.tokens.size(); ++i)
          if (const std::int32_t t = c.score_targets[i]; t >= 0)
            lp.at(static_cast<std::size_t>(c.start) + i + 1) = TokenLogprob{t, scores_.at(row + i), {}};
      }
      row += c.tokens.size();
    }
  }

  /// Where a step's tokens are chosen: from host logits by the CPU Sampler, by the model's argmax on the
  /// device (every sampled row plain greedy), or by the model's sampler on the device.
  enum class Pick { host, device_argmax, device_sample };

  /// The cheapest way the model offers that gives every sampled row of `plan` what the CPU path would.
  /// Rows asking for top logprobs need the whole row on the host, as does the row n > 1 siblings fork
  /// from (they sample from it after the step).
  Pick choose_pick(const StepPlan& plan) const {
    bool all_plain = kDeviceArgmax, device_ok = kDeviceSample && options_.device_sampling;
    for (const ScheduledChunk& c : plan.chunks) {
      if (!c.samples) continue;
      const RequestState& req = *owner(c.seq);
      all_plain = all_plain && plain_greedy(req, *c.seq);
      const bool forks_now = req.params.n > 1 && c.seq->num_generated() == 0;
      device_ok = device_ok && !forks_now && req.params.logprobs.value_or(0) == 0;
    }
    if (all_plain) return Pick::device_argmax;
    return device_ok ? Pick::device_sample : Pick::host;
  }

  /// Whether a request's next token is the plain argmax of the raw logits (greedy, no penalties, no
  /// logprobs, no min_tokens masking, not the row its n > 1 siblings fork from): then a GPU model may
  /// take the argmax on the device and return ids only.
  static bool plain_greedy(const RequestState& req, const Sequence& seq) {
    const SamplingParams& p = req.params;
    return p.greedy() && !p.logprobs && p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f &&
           p.frequency_penalty == 0.0f && seq.num_generated() >= p.min_tokens &&
           !(p.n > 1 && seq.num_generated() == 0);
  }

  static std::int32_t resolve_max_len(const ModelConfig& c, const EngineOptions& o) {
    const auto ctx = static_cast<std::int32_t>(c.max_position_embeddings);
    if (o.max_model_len == 0) return ctx;
    require<InvalidArgument>(o.max_model_len <= ctx, "max_model_len = ", o.max_model_len,
                             " is beyond the model's context length of ", ctx);
    return o.max_model_len;
  }

  const Tokenizer* require_tokenizer() const {
    const Tokenizer* tok = source_->tokenizer();
    require<InvalidArgument>(tok != nullptr, source_->describe(),
                             " has no tokenizer: pass token ids, or add tokenizer.json to the model folder");
    return tok;
  }

  Sample make_sample(RequestState& req, std::int32_t index) {
    const Tokenizer* tok = source_->tokenizer();
    req.unfinished++;
    Sample s{std::make_unique<Sequence>(), SeqRng::for_sample(req.params, static_cast<std::uint32_t>(index)),
             StopChecker(req.params, eos_id_),
             tok ? std::optional<IncrementalDecoder>(std::in_place, *tok, req.params.skip_special_tokens) : std::nullopt,
             std::nullopt, false};
    s.seq->id = next_seq_++;
    seq_owner_[s.seq.get()] = &req;
    return s;
  }

  RequestState* owner(const Sequence* s) const {
    auto it = seq_owner_.find(s);
    return it == seq_owner_.end() ? nullptr : it->second;
  }
  static Sample& sample_of(RequestState& req, const Sequence* seq) {
    for (auto& s : req.samples)
      if (s.seq.get() == seq) return s;
    throw Error(Errc::invalid_argument, "engine: sequence not found in its request");  // unreachable
  }

  SampleResult draw(RequestState& req, Sample& s, std::span<float> logits) {
    return sampler_.sample_with_logprobs(logits, req.params, s.seq->prompt(), s.seq->output(), s.rng);
  }

  /// The prompt of `parent` is computed: the request's other samples start from its blocks (shared,
  /// copied on write) and draw their first token from the same logits row.
  void fork_siblings(RequestState& req, Sequence& parent) {
    for (std::int32_t i = 1; i < req.params.n; ++i) {
      Sample& child = req.samples.emplace_back(make_sample(req, i));
      child.seq->tokens.assign(parent.tokens.begin(), parent.tokens.end() - 1);  // without the parent's new token
      child.seq->prompt_len = parent.prompt_len;
      child.seq->max_len = parent.max_len;
      child.seq->arrival = parent.arrival;
      child.seq->priority = parent.priority;
      child.seq->tag = parent.tag;
      child.seq->num_computed = parent.num_computed;
      scheduler_.fork(&parent, child.seq.get(), alloc_);
      scratch_.assign(fork_rows_.begin(), fork_rows_.end());
      child.pending = draw(req, child, scratch_);
      child.seq->tokens.push_back(child.pending->token);
    }
  }

  /// Applies a drawn token: detokenize, stop checks, output fields; finishes the sample when it ends.
  void accept_token(RequestState& req, Sample& s) {
    const SampleResult r = *s.pending;
    s.pending.reset();
    CompletionOutput& o = req.output.outputs[static_cast<std::size_t>(&s - req.samples.data())];
    if (!req.output.metrics.first_token) req.output.metrics.first_token = Clock::now();
    if (s.seq->num_generated() == 1) req.output.metrics.cached_prompt_tokens =
        std::max(req.output.metrics.cached_prompt_tokens, s.seq->num_cached_tokens);
    stats_.generated_tokens++;
    o.token_ids.push_back(r.token);
    o.delta_token_ids.push_back(r.token);
    if (req.params.logprobs) o.logprobs.push_back(TokenLogprob{r.token, r.logprob, r.top_logprobs});
    const StopResult sr = s.stop.push(r.token, detokenize(s, r.token));
    o.text += sr.emit;
    o.delta_text += sr.emit;
    FinishReason reason = sr.reason;
    if (reason == FinishReason::none && s.seq->len() >= s.seq->max_len) reason = FinishReason::length;
    if (reason != FinishReason::none) finish_sample(req, s, reason);
  }

  /// The text `token` adds to its sample. A model's vocabulary may be larger than its tokenizer's (padded
  /// embeddings; a dummy model with a borrowed tokenizer): such ids have no text, as in HF tokenizers.
  static std::string detokenize(Sample& s, std::int32_t token) {
    if (!s.detok || static_cast<std::size_t>(token) >= s.detok->tokenizer().vocab_size()) return {};
    return s.detok->push(token);
  }

  void finish_sample(RequestState& req, Sample& s, FinishReason reason) {
    if (s.done) return;
    s.done = true;
    CompletionOutput& o = req.output.outputs[static_cast<std::size_t>(&s - req.samples.data())];
    // Text held back in case it began a stop string is the sample's own after all (empty after a stop).
    const std::string rest = s.stop.flush(s.detok ? s.detok->flush() : std::string());
    o.text += rest;
    o.delta_text += rest;
    o.finish_reason = reason;
    scheduler_.finish(s.seq.get(), alloc_);
    require_released<S>(*s.seq, alloc_);
    if (tracing_) trace_.finished.push_back({req.output.id, s.seq->id, reason});
    if (--req.unfinished == 0 && !awaits_fork(req)) complete(req);
  }

  /// A request with n > 1 whose first sample finished before its siblings were forked.
  static bool awaits_fork(const RequestState& req) {
    return req.params.n > 1 && req.samples.size() == 1;
  }
  /// Siblings that will never be forked (their parent ended during the prompt) finish with the parent's reason.
  void complete_pending_forks(RequestState& req, FinishReason reason) {
    if (!awaits_fork(req)) return;
    for (std::size_t i = 1; i < req.output.outputs.size(); ++i) req.output.outputs[i].finish_reason = reason;
    complete(req);
  }

  void complete(RequestState& req) {
    if (req.output.finished) return;
    req.output.finished = true;
    req.output.metrics.finished = Clock::now();
    stats_.requests_finished++;
  }

  /// Forgets a finished request whose final output has been handed out (or queued in pending_).
  template <class It>
  void retire(It it) {
    if (it->second->params.prompt_logprobs) --scoring_requests_;
    for (auto& s : it->second->samples) seq_owner_.erase(s.seq.get());
    requests_.erase(it);
  }

  /// Records the plan of the step about to run (the observer gets it, completed, from end_trace()).
  void begin_trace(const StepPlan& plan) {
    tracing_ = true;
    trace_.step = stats_.steps;
    trace_.chunks.clear();
    trace_.admitted.clear();
    trace_.preempted.clear();
    trace_.finished.clear();
    auto ref = [this](const Sequence* s) { return StepTrace::SeqRef{owner(s)->output.id, s->id}; };
    for (const ScheduledChunk& c : plan.chunks)
      trace_.chunks.push_back({owner(c.seq)->output.id, c.seq->id, c.start, c.count, is_decode(c), c.samples});
    for (const Sequence* s : plan.admitted) trace_.admitted.push_back(ref(s));
    for (const Sequence* s : plan.preempted) trace_.preempted.push_back(ref(s));
  }

  /// Completes the step's trace with the blocks and queues after it, and hands it to the observer.
  void end_trace() {
    if (!tracing_) return;
    tracing_ = false;
    const KvStats kv = alloc_.stats();
    trace_.free_blocks = kv.free_blocks;
    trace_.used_blocks = kv.used_blocks;
    trace_.total_blocks = kv.total_blocks;
    trace_.num_waiting = scheduler_.num_waiting();
    trace_.num_running = scheduler_.num_running();
    observer_(trace_);
  }

  /// The model failed on this step: every request in it fails with the message, and its blocks return.
  void fail_plan(const StepPlan& plan, const std::string& why, std::vector<RequestOutput>& out) {
    std::vector<RequestId> ids;
    for (const auto& c : plan.chunks)
      if (auto* r = owner(c.seq)) ids.push_back(r->output.id);
    for (RequestId id : ids) fail_request(id, why, out);
  }

  /// Request `id` fails with the message (FinishReason::error on every sample), its blocks return, and
  /// its final output joins `out`. Unknown (already retired) ids are ignored.
  void fail_request(RequestId id, const std::string& why, std::vector<RequestOutput>& out) {
    auto it = requests_.find(id);
    if (it == requests_.end()) return;
    it->second->output.error = why;
    for (auto& s : it->second->samples) finish_sample(*it->second, s, FinishReason::error);
    complete_pending_forks(*it->second, FinishReason::error);
    out.push_back(it->second->output);
    retire(it);
  }

  EngineOptions options_;
  std::unique_ptr<ModelSource> source_;
  model_type model_;
  std::int32_t max_model_len_;
  S scheduler_;  ///< before alloc_: its step bounds size the model's buffers, and what is left goes to the KV pool
  A alloc_;
  KvCache<B> cache_;
  Sampler sampler_;
  std::optional<std::int32_t> eos_id_;
  std::vector<std::int32_t> extra_eos_ids_;

  std::unordered_map<RequestId, std::unique_ptr<RequestState>> requests_;
  std::unordered_map<const Sequence*, RequestState*> seq_owner_;
  std::vector<RequestOutput> pending_;  ///< final outputs of requests retired outside step() (aborts)
  RequestId next_request_ = 0;
  SeqId next_seq_ = 0;
  std::uint64_t next_arrival_ = 0;
  EngineStats stats_;

  // Per-step buffers, reused.
  std::vector<ForwardChunk> chunks_;
  std::vector<float> logits_, fork_rows_, scratch_, scores_;
  std::vector<std::int32_t> score_targets_;  ///< this step's prompt-logprob targets, spans of chunks_ point into it
  std::size_t scoring_requests_ = 0;         ///< live requests that asked for prompt_logprobs
  std::vector<std::int32_t> greedy_ids_;
  std::vector<SampleRow> sample_rows_;
  std::vector<SampleResult> device_results_;
  std::vector<Sequence*> touched_, forks_;
  std::vector<std::pair<RequestId, std::string>> failed_;

  std::function<void(const StepTrace&)> observer_;
  StepTrace trace_;      ///< the step being traced (reused: its vectors keep their capacity)
  bool tracing_ = false;  ///< a step with an observer is under way
};

}  // namespace infer
