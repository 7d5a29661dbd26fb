// The lockstep engine (dist/lockstep_engine.hpp): rank 0's calls carried to the other ranks' engines, so that a
// tensor-parallel server's ranks run the same steps. Ranks are threads here (support/thread_group.hpp);
// tests/programs/check_serve_tensor_parallel.py runs infer-serve over mpirun.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <memory>
#include <vector>

#include "infer/dist/lockstep_engine.hpp"
#include "infer/dist/request_wire.hpp"
#include "infer/engine/presets.hpp"
#include "infer/model/dummy.hpp"
#include "infer/model/model_source.hpp"
#include "support/split_llama.hpp"
#include "support/thread_group.hpp"

using namespace infer;
using Tokens = std::vector<std::int32_t>;
using test::run_ranks;
using test::split_llama;
using Catch::Contains;

namespace {

using CpuEngine = EngineAdapter<PagedEngine<cpu, 16>>;

std::unique_ptr<CpuEngine> engine_of(ModelSource src) {
  EngineOptions o;
  o.kv_cache_bytes = std::size_t{4} << 20;
  o.scheduler.max_num_seqs = 2;  // fewer slots than requests: some wait, and are admitted at later steps
  return std::make_unique<CpuEngine>(std::move(src), o);
}


SamplingParams greedy(std::int32_t n) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = n;
  p.ignore_eos = true;
  return p;
}

}  // namespace

TEST_CASE("SamplingParams cross the wire with every field", "[dist][lockstep]") {
  // A field added to SamplingParams changes its size: add it to dist::sampling_fields, then the size here.
  CHECK(sizeof(SamplingParams) == 168);
  SamplingParams p;
  p.n = 3;
  p.temperature = 0.7f;
  p.top_p = 0.8f;
  p.top_k = 40;
  p.min_p = 0.05f;
  p.repetition_penalty = 1.1f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = -0.25f;
  p.seed = 0xfeedbeefcafeULL;
  p.stop = {"\n\n", "END", ""};
  p.stop_token_ids = {7, 11};
  p.ignore_eos = true;
  p.max_tokens = 99;
  p.min_tokens = 4;
  p.logprobs = 5;
  p.prompt_logprobs = 0;
  p.skip_special_tokens = false;
  p.include_stop_str_in_output = true;
  p.priority = -2;
  p.tag = "batch";
  dist::WireWriter w;
  put(w, p);
  w.put(std::uint32_t{0xabcd});
  dist::WireReader r(w.bytes());
  const SamplingParams q = dist::get_sampling_params(r);
  CHECK(r.get<std::uint32_t>() == 0xabcd);
  CHECK(r.done());
  CHECK((q.n == 3 && q.temperature == 0.7f && q.top_p == 0.8f && q.top_k == 40 && q.min_p == 0.05f));
  CHECK((q.repetition_penalty == 1.1f && q.presence_penalty == 0.5f && q.frequency_penalty == -0.25f));
  CHECK((q.seed == p.seed && q.stop == p.stop && q.stop_token_ids == p.stop_token_ids && q.ignore_eos));
  CHECK((q.max_tokens == 99 && q.min_tokens == 4 && q.logprobs == 5 && q.prompt_logprobs == 0));
  CHECK((!q.skip_special_tokens && q.include_stop_str_in_output && q.priority == -2 && q.tag == "batch"));
  dist::WireWriter again;
  put(again, q);
  CHECK(std::vector<std::byte>(again.bytes().begin(), again.bytes().end()) ==
        std::vector<std::byte>(w.bytes().begin(), w.bytes().end() - 4));

  SECTION("bytes that end early, or a length beyond them, are refused") {
    dist::WireReader short_read(w.bytes().first(w.size() / 2));
    CHECK_THROWS_AS(dist::get_sampling_params(short_read), DistributedError);
    dist::WireWriter lie;
    lie.put(std::uint64_t{1} << 40);  // a vector of 2^40 ints in 8 bytes
    dist::WireReader lying(lie.bytes());
    CHECK_THROWS_WITH(lying.get<Tokens>(), Contains("beyond its 8 bytes"));
  }
}

TEST_CASE("a lockstep leader's requests, aborts and steps run on every rank of a tensor-parallel group",
          "[dist][lockstep]") {
  const std::vector<Tokens> prompts = {{5, 9, 2, 44, 17, 3}, {1, 2, 3}, {80, 81, 82, 83}, {60, 61}};
  // Alone, the whole model: what the greedy requests must give.
  std::vector<Tokens> want;
  {
    auto one = engine_of(ModelSource::dummy(split_llama(), 3));
    for (const auto& t : prompts) one->add_request(t, greedy(10));
    while (one->has_unfinished())
      for (const auto& out : one->step())
        if (out.finished) want.push_back(out.outputs.at(0).token_ids);
    REQUIRE(want.size() == prompts.size());
  }

  for (int size : {2, 4}) {
    INFO("TP = " << size);
    std::vector<RequestOutput> done;
    std::size_t leader_steps = 0;
    std::vector<std::size_t> follower_steps(static_cast<std::size_t>(size), 0);
    std::vector<KvStats> kv_after(static_cast<std::size_t>(size));
    // A long prompt: its record is past one broadcast's inline bytes (4096), so it takes the second broadcast.
    const Tokens long_prompt(1500, 42);
    run_ranks(size, [&](int rank, dist::Group& g) {
      auto mine = engine_of(ModelSource::shard(ModelSource::dummy(split_llama(), 3), g));
      CpuEngine& engine = *mine;
      if (rank != 0) {
        follower_steps[static_cast<std::size_t>(rank)] = dist::follow_leader(engine, g);
        kv_after[static_cast<std::size_t>(rank)] = engine.kv_stats();
        return;
      }
      {
        dist::LockstepLeader leader(std::move(mine), g);
        // Requests arrive between steps, as a server's do; one is refused here (and so never sent), one aborted.
        const RequestId a = leader.add_request(prompts[0], greedy(10));
        leader.add_request(prompts[1], greedy(10));
        auto step = [&] {
          ++leader_steps;
          for (auto& out : leader.step())
            if (out.finished) done.push_back(std::move(out));
        };
        step();
        SamplingParams bad = greedy(10);
        bad.top_p = 0;
        CHECK_THROWS_AS(leader.add_request(prompts[2], bad), InvalidArgument);
        leader.add_request(prompts[2], greedy(10));
        SamplingParams sampled;  // no seed: the leader gives one, so every rank samples the same tokens
        sampled.temperature = 0.9f;
        sampled.max_tokens = 12;
        sampled.ignore_eos = true;
        const RequestId s = leader.add_request(prompts[0], sampled);
        const RequestId gone = leader.add_request(prompts[3], greedy(30));
        const RequestId lng = leader.add_request(long_prompt, greedy(2));
        step();
        step();
        leader.abort(gone);
        leader.add_request(prompts[3], greedy(10));
        while (leader.has_unfinished()) step();
        CHECK(a == 0);
        CHECK(s > a);
        CHECK(lng > s);
        kv_after[0] = leader.kv_stats();
      }  // the leader's destructor sends stop: the followers return
    });
    std::vector<Tokens> got;
    for (const auto& out : done) {
      INFO("request " << out.id << ": " << out.error);
      CHECK(out.error.empty());
      if (out.id == 4) CHECK(out.outputs.at(0).finish_reason == FinishReason::abort);
      if (out.id == 3) CHECK(out.outputs.at(0).token_ids.size() == 12);  // sampled: the ranks agreed every step
      if (out.id == 5) CHECK(out.outputs.at(0).token_ids.size() == 2);
      if (out.id <= 2 || out.id == 6) got.push_back(out.outputs.at(0).token_ids);
    }
    CHECK(done.size() == 7);
    CHECK(got.size() == 4);
    std::sort(got.begin(), got.end());
    std::vector<Tokens> sorted_want = want;
    std::sort(sorted_want.begin(), sorted_want.end());
    CHECK(got == sorted_want);
    for (int r = 1; r < size; ++r) CHECK(follower_steps[static_cast<std::size_t>(r)] == leader_steps);
    for (const KvStats& kv : kv_after) CHECK(kv.used_blocks == 0);
  }
}

TEST_CASE("a follower that cannot do what the leader did stops the job, naming it", "[dist][lockstep]") {
  // Rank 1's engine has a shorter context, so it refuses a prompt rank 0 accepts: a DistributedError there, never
  // a quiet divergence.
  std::string error;
  run_ranks(2, [&](int rank, dist::Group& g) {
    ModelConfig c = split_llama();
    if (rank == 1) c.max_position_embeddings = 16;
    auto mine = engine_of(ModelSource::dummy(c, 3));
    if (rank == 1) {
      try {
        dist::follow_leader(*mine, g);
      } catch (const DistributedError& e) {
        error = e.what();
        (void)dist::lockstep::receive(g);  // the leader's stop, which this group (threads, no timeout) would wait for
      }
      return;
    }
    dist::LockstepLeader leader(std::move(mine), g);
    leader.add_request(Tokens(40, 3), greedy(2));
    leader.step();
  });
  CHECK_THAT(error, Contains("rank 1 refused a request rank 0 accepted") && Contains("max_model_len"));
}
