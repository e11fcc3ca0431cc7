#include <catch2/catch.hpp>
#include <deque>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "engine/scheduler.hpp"
#include "engine/step_builder.hpp"

using namespace troupe;
using namespace troupe::engine;

namespace {

std::vector<TokenId> range(TokenId first, int n) {
  std::vector<TokenId> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

SchedulerConfig small_config() {
  SchedulerConfig c;
  c.max_num_batched_tokens = 8;
  c.max_num_seqs = 4;
  c.max_model_len = 64;
  c.num_blocks = 16;
  c.block_size = 4;
  return c;
}

// Runs one iteration with a fake model that samples token 7 for everyone.
std::vector<FinishedSequence> step(Scheduler& s, BatchPlan& plan) {
  plan = s.schedule();
  std::vector<SampledResult> sampled;
  for (const auto& c : plan.chunks) {
    if (c.samples) sampled.push_back({7});
  }
  auto finished = s.update(plan, sampled);
  REQUIRE(s.check_invariants().has_value());
  return finished;
}

std::vector<std::pair<SeqId, int>> chunks_of(const BatchPlan& plan) {
  std::vector<std::pair<SeqId, int>> v;
  for (const auto& c : plan.chunks) v.emplace_back(c.id, c.num_new_tokens);
  return v;
}

using Chunks = std::vector<std::pair<SeqId, int>>;

}  // namespace

TEST_CASE("prompts are cut into chunks that fill the token budget", "[engine][scheduler]") {
  Scheduler s(small_config());
  REQUIRE(s.add({1, range(0, 10), 3}).has_value());
  REQUIRE(s.add({2, range(100, 5), 3}).has_value());
  BatchPlan plan;
  step(s, plan);
  CHECK(chunks_of(plan) == Chunks{{1, 8}});
  step(s, plan);
  CHECK(chunks_of(plan) == Chunks{{1, 2}, {2, 5}});  // 1 finishes its prompt and samples
  CHECK(plan.chunks[0].samples);
  CHECK(plan.chunks[1].samples);
  step(s, plan);
  CHECK(chunks_of(plan) == Chunks{{1, 1}, {2, 1}});  // both decode
  CHECK(plan.num_decodes == 2);
}

TEST_CASE("running decodes go first, a long prompt never stalls them", "[engine][scheduler]") {
  Scheduler s(small_config());
  REQUIRE(s.add({1, range(0, 3), 10}).has_value());
  BatchPlan plan;
  step(s, plan);  // prefill 1
  REQUIRE(s.add({2, range(100, 30), 3}).has_value());
  for (int i = 0; i < 4; ++i) {
    step(s, plan);
    CHECK(plan.chunks.front().id == 1);  // sequence 1 decodes every iteration
    CHECK(plan.chunks.front().num_new_tokens == 1);
    CHECK(plan.num_tokens == 8);  // and the budget is never exceeded
  }
}

TEST_CASE("max_num_seqs bounds the running set", "[engine][scheduler]") {
  auto config = small_config();
  config.max_num_seqs = 2;
  config.max_num_batched_tokens = 64;
  Scheduler s(config);
  for (SeqId id = 1; id <= 3; ++id) REQUIRE(s.add({id, range(0, 2), 2}).has_value());
  BatchPlan plan;
  step(s, plan);
  CHECK(chunks_of(plan) == Chunks{{1, 2}, {2, 2}});
  CHECK(s.num_waiting() == 1);
  const auto finished = step(s, plan);  // both reach max_tokens 2
  CHECK(finished.size() == 2);
  step(s, plan);
  CHECK(chunks_of(plan) == Chunks{{3, 2}});
}

TEST_CASE("out of blocks, the latest arrival is preempted and later recomputes",
          "[engine][scheduler]") {
  auto config = small_config();
  config.num_blocks = 4;  // 16 tokens
  config.max_num_batched_tokens = 64;
  Scheduler s(config);
  REQUIRE(s.add({1, range(0, 7), 20}).has_value());   // 2 blocks
  REQUIRE(s.add({2, range(50, 7), 20}).has_value());  // 2 blocks
  BatchPlan plan;
  step(s, plan);
  CHECK(chunks_of(plan) == Chunks{{1, 7}, {2, 7}});
  step(s, plan);  // both now have 9 tokens: 8 computed, in 2 full blocks
  // Next, both need a third block: only one can get it... none is free, so 2 goes.
  step(s, plan);
  CHECK(plan.preempted == std::vector<SeqId>{2});
  CHECK(chunks_of(plan) == Chunks{{1, 1}});
  CHECK(s.find(2)->status == SequenceStatus::preempted);
  CHECK(s.find(2)->num_computed_tokens == 0);
  CHECK(s.find(2)->num_tokens() == 9);  // keeps what it generated
  CHECK(s.num_preemptions() == 1);
}

TEST_CASE("priority policy admits the most urgent first and preempts the least",
          "[engine][scheduler]") {
  auto config = small_config();
  config.policy = SchedulingPolicy::priority;
  config.max_num_seqs = 1;
  Scheduler s(config);
  REQUIRE(s.add({1, range(0, 2), 1, /*priority=*/5}).has_value());
  REQUIRE(s.add({2, range(0, 2), 1, /*priority=*/0}).has_value());
  REQUIRE(s.add({3, range(0, 2), 1, /*priority=*/5}).has_value());
  BatchPlan plan;
  step(s, plan);
  CHECK(chunks_of(plan) == Chunks{{2, 2}});
  step(s, plan);
  CHECK(chunks_of(plan) == Chunks{{1, 2}});  // same priority: earlier arrival
  step(s, plan);
  CHECK(chunks_of(plan) == Chunks{{3, 2}});
}

TEST_CASE("a more urgent arrival takes the seat of the least urgent running sequence",
          "[engine][scheduler]") {
  for (const auto policy : {SchedulingPolicy::priority, SchedulingPolicy::fcfs}) {
    INFO((policy == SchedulingPolicy::priority ? "priority" : "fcfs"));
    auto config = small_config();
    config.policy = policy;
    config.max_num_seqs = 2;
    Scheduler s(config);
    REQUIRE(s.add({1, range(0, 2), 20, /*priority=*/5}).has_value());
    REQUIRE(s.add({2, range(0, 2), 20, /*priority=*/3}).has_value());
    BatchPlan plan;
    step(s, plan);
    CHECK(chunks_of(plan) ==
          (policy == SchedulingPolicy::fcfs ? Chunks{{1, 2}, {2, 2}} : Chunks{{2, 2}, {1, 2}}));
    // Both seats taken; a request more urgent than both arrives.
    REQUIRE(s.add({3, range(0, 2), 20, /*priority=*/0}).has_value());
    step(s, plan);
    if (policy == SchedulingPolicy::fcfs) {
      CHECK(chunks_of(plan) == Chunks{{1, 1}, {2, 1}});  // it waits its turn
      CHECK(s.num_preemptions() == 0);
      continue;
    }
    // 1 (priority 5) gives way; 2 (3) keeps decoding; 3 starts its prompt.
    CHECK(chunks_of(plan) == Chunks{{2, 1}, {3, 2}});
    CHECK(plan.preempted == std::vector<SeqId>{1});
    CHECK(s.num_preemptions() == 1);
    CHECK(s.find(1)->num_tokens() == 3);  // keeps what it generated, recomputed later
    // An arrival as urgent as the least urgent running one (priority 3, later) waits.
    REQUIRE(s.add({4, range(0, 2), 20, /*priority=*/3}).has_value());
    step(s, plan);
    CHECK(chunks_of(plan) == Chunks{{2, 1}, {3, 1}});
    CHECK(s.num_preemptions() == 1);
  }
}

TEST_CASE("a more urgent arrival that finds no free blocks preempts the least urgent",
          "[engine][scheduler]") {
  auto config = small_config();
  config.policy = SchedulingPolicy::priority;
  config.num_blocks = 4;  // 16 tokens in all
  config.max_num_batched_tokens = 16;
  Scheduler s(config);
  REQUIRE(s.add({1, range(0, 12), 20, /*priority=*/5}).has_value());  // 3 of the 4 blocks
  BatchPlan plan;
  step(s, plan);
  REQUIRE(chunks_of(plan) == Chunks{{1, 12}});
  REQUIRE(s.add({2, range(100, 8), 4, /*priority=*/0}).has_value());  // needs 2 blocks
  step(s, plan);
  CHECK(plan.preempted == std::vector<SeqId>{1});
  CHECK(chunks_of(plan) == Chunks{{2, 8}});
  // Once 2 is done, 1 comes back and recomputes what it had.
  for (int i = 0; i < 4 && s.find(2) != nullptr; ++i) step(s, plan);
  CHECK(s.find(2) == nullptr);
  step(s, plan);
  REQUIRE_FALSE(plan.chunks.empty());
  CHECK(plan.chunks.front().id == 1);
}

TEST_CASE("static batching admits a batch only when the last one is done", "[engine][scheduler]") {
  auto config = small_config();
  config.mode = BatchingMode::static_batch;
  config.max_num_seqs = 2;
  Scheduler s(config);
  REQUIRE(s.add({1, range(0, 10), 1}).has_value());
  REQUIRE(s.add({2, range(0, 3), 3}).has_value());
  REQUIRE(s.add({3, range(0, 3), 1}).has_value());
  BatchPlan plan;
  step(s, plan);
  CHECK(chunks_of(plan) == Chunks{{1, 10}, {2, 3}});  // whole prompts, past the budget
  step(s, plan);                                      // 1 is done; 3 must still wait for 2
  CHECK(chunks_of(plan) == Chunks{{2, 1}});
  step(s, plan);
  CHECK(chunks_of(plan) == Chunks{{2, 1}});
  step(s, plan);
  CHECK(chunks_of(plan) == Chunks{{3, 3}});
}

TEST_CASE("abort frees a sequence's blocks at once", "[engine][scheduler]") {
  Scheduler s(small_config());
  REQUIRE(s.add({1, range(0, 8), 10}).has_value());
  BatchPlan plan;
  step(s, plan);
  CHECK(s.kv_cache().num_free_blocks() < 16);
  CHECK(s.abort(1));
  CHECK(s.kv_cache().num_free_blocks() == 16);
  CHECK_FALSE(s.abort(1));
  CHECK_FALSE(s.has_unfinished());
  SECTION("a result for an aborted sequence is ignored") {
    REQUIRE(s.add({2, range(0, 3), 10}).has_value());
    plan = s.schedule();
    REQUIRE(s.abort(2));
    const std::vector<SampledResult> sampled = {{7}};
    CHECK(s.update(plan, sampled).empty());
    CHECK(s.check_invariants().has_value());
  }
}

TEST_CASE("bad requests are refused with the lengths", "[engine][scheduler]") {
  Scheduler s(small_config());
  CHECK(s.add({1, {}, 3}).error().message == "the prompt is empty");
  CHECK(s.add({1, range(0, 64), 3}).error().message ==
        "the prompt has 64 tokens; the model's context is 64 tokens, which leaves no room to "
        "generate");
  REQUIRE(s.add({1, range(0, 3), 3}).has_value());
  CHECK_FALSE(s.add({1, range(0, 3), 3}).has_value());
}

TEST_CASE("the step input holds each chunk's tokens at its positions", "[engine][step]") {
  Scheduler s(small_config());
  REQUIRE(s.add({1, range(10, 5), 3}).has_value());
  REQUIRE(s.add({2, range(20, 2), 3}).has_value());
  auto plan = s.schedule();
  std::vector<SeqId> sampled;
  const auto step = build_step_input(plan, s, &sampled);
  CHECK(step.tokens == std::vector<TokenId>{10, 11, 12, 13, 14, 20, 21});
  CHECK(step.positions == std::vector<std::int32_t>{0, 1, 2, 3, 4, 0, 1});
  CHECK(step.query_start == std::vector<std::int32_t>{0, 5, 7});
  CHECK(step.context_lens == std::vector<std::int32_t>{5, 2});
  CHECK(step.logit_rows == std::vector<std::int32_t>{4, 6});
  CHECK(sampled == std::vector<SeqId>{1, 2});
  CHECK(step.block_table(0)[0] == 0);
  CHECK(step.block_table(0)[1] == 1);
  CHECK(step.block_table(1)[0] == 2);
}

// Random workloads: the invariants hold after every iteration and everyone finishes.
TEST_CASE("randomized workloads keep every invariant and finish every request",
          "[engine][scheduler][slow]") {
  std::int64_t total_preemptions = 0, total_hit_tokens = 0;
  for (std::uint32_t seed = 1; seed <= 24; ++seed) {
    std::mt19937 rng(seed);
    SchedulerConfig config;
    config.block_size = 1 + static_cast<std::int32_t>(rng() % 8);
    config.num_blocks = 16 + static_cast<std::int32_t>(rng() % 48);
    config.max_num_batched_tokens = 4 + static_cast<std::int32_t>(rng() % 60);
    config.max_num_seqs = 1 + static_cast<std::int32_t>(rng() % 12);
    config.max_model_len = config.num_blocks * config.block_size;
    config.enable_prefix_caching = rng() % 4 != 0;
    config.policy = rng() % 3 == 0 ? SchedulingPolicy::priority : SchedulingPolicy::fcfs;
    config.mode = rng() % 5 == 0 ? BatchingMode::static_batch : BatchingMode::continuous;
    INFO("seed " << seed << " blocks " << config.num_blocks << "x" << config.block_size
                 << " budget " << config.max_num_batched_tokens << " seqs " << config.max_num_seqs);
    Scheduler s(config);
    // Prompts share prefixes (a few system prompts) so the cache has work to do.
    const std::vector<TokenId> system = range(1000, 40);
    std::map<SeqId, int> expected_length;
    std::map<SeqId, std::uint64_t> admitted_at;
    SeqId next_id = 1;
    std::uint64_t iteration = 0;
    std::set<SeqId> finished;
    auto submit = [&] {
      const int max_len = std::min(30, config.max_model_len / 2);
      std::vector<TokenId> prompt(system.begin(),
                                  system.begin() + rng() % std::min<int>(40, max_len));
      const int own =
          1 + static_cast<int>(rng() % std::max(1, max_len - static_cast<int>(prompt.size())));
      for (int i = 0; i < own; ++i) prompt.push_back(static_cast<TokenId>(rng() % 50));
      const int max_tokens = 1 + static_cast<int>(rng() % 12);
      const auto added = s.add({next_id, prompt, max_tokens, static_cast<std::int32_t>(rng() % 3)});
      if (!added) return;  // refused for length: fine, counted nowhere
      expected_length[next_id] =
          std::min<int>(static_cast<int>(prompt.size()) + max_tokens, config.max_model_len);
      admitted_at[next_id] = iteration;
      ++next_id;
    };
    for (int i = 0; i < 8; ++i) submit();
    while (s.has_unfinished() || next_id < 60) {
      if (next_id < 60 && rng() % 2 == 0) submit();
      if (rng() % 17 == 0 && !expected_length.empty()) {  // a client goes away
        const SeqId victim = 1 + rng() % (next_id - 1);
        if (s.abort(victim)) {
          expected_length.erase(victim);
          finished.insert(victim);
        }
      }
      const BatchPlan plan = s.schedule();
      REQUIRE(plan.num_tokens <= (config.mode == BatchingMode::continuous
                                      ? config.max_num_batched_tokens
                                      : std::numeric_limits<std::int32_t>::max()));
      std::int32_t counted = 0;
      for (const auto& c : plan.chunks) counted += c.num_new_tokens;
      REQUIRE(counted == plan.num_tokens);
      const auto step_input = build_step_input(plan, s);
      const auto valid = model::validate_step(
          step_input, model::KvCacheShape{1, config.num_blocks, config.block_size, 1, 2}, 1 << 20);
      if (!valid) FAIL(valid.error().message);
      std::vector<SampledResult> sampled;
      for (const auto& c : plan.chunks) {
        if (c.samples) sampled.push_back({static_cast<TokenId>(rng() % 50)});
      }
      for (const auto& f : s.update(plan, sampled)) {
        CHECK(f.reason == FinishReason::length);
        finished.insert(f.id);
      }
      const auto ok = s.check_invariants();
      if (!ok) FAIL(ok.error().message);
      ++iteration;
      REQUIRE(iteration < 20000);  // everyone finishes: nobody starves forever
    }
    CHECK(finished.size() == next_id - 1);
    CHECK(s.kv_cache().num_free_blocks() == config.num_blocks);
    total_preemptions += s.num_preemptions();
    total_hit_tokens += s.kv_cache().prefix_stats().num_hit_tokens;
  }
  // The workloads did press on memory and did share prefixes.
  CHECK(total_preemptions > 0);
  CHECK(total_hit_tokens > 0);
}

TEST_CASE("a token budget set between iterations bounds the next plan, decodes first",
          "[engine][scheduler]") {
  Scheduler s(small_config());
  CHECK(s.token_budget() == 8);
  REQUIRE(s.add({1, range(10, 5), 10}).has_value());
  BatchPlan plan;
  step(s, plan);
  REQUIRE(plan.num_tokens == 5);
  CHECK(s.num_decoding() == 1);
  REQUIRE(s.add({2, range(20, 12), 10}).has_value());
  s.set_token_budget(4);
  step(s, plan);
  CHECK(plan.num_tokens == 4);
  REQUIRE(plan.chunks.size() == 2u);
  CHECK(plan.chunks[0].id == 1);  // the decode
  CHECK(plan.chunks[0].num_new_tokens == 1);
  CHECK(plan.chunks[1].id == 2);
  CHECK(plan.chunks[1].num_new_tokens == 3);
  CHECK(s.num_decoding() == 1);  // 2 is still prefilling
  SECTION("the budget stays within one token and max_num_batched_tokens") {
    s.set_token_budget(1000);
    CHECK(s.token_budget() == 8);
    s.set_token_budget(0);
    CHECK(s.token_budget() == 1);
    step(s, plan);
    CHECK(plan.num_tokens == 1);
  }
}

TEST_CASE("static batching ignores the token budget", "[engine][scheduler]") {
  auto config = small_config();
  config.mode = BatchingMode::static_batch;
  Scheduler s(config);
  REQUIRE(s.add({1, range(10, 6), 2}).has_value());
  REQUIRE(s.add({2, range(20, 6), 2}).has_value());
  s.set_token_budget(2);
  BatchPlan plan;
  step(s, plan);
  CHECK(plan.num_tokens == 12);
}

TEST_CASE(
    "plans in flight together never share a sequence, and preemption never takes one in flight",
    "[engine][scheduler][pp]") {
  // Tight KV: the sequences outgrow the pool and preempt each other while two plans are
  // out at once (a pipeline's micro-batches), each applied in the order it was made.
  for (const std::int32_t in_flight : {2, 3}) {
    INFO(in_flight << " plans in flight");
    auto config = small_config();
    config.max_num_batched_tokens = 12;
    config.max_num_seqs = 6;
    config.num_blocks = 12;
    config.max_steps_in_flight = in_flight;
    Scheduler s(config);
    for (SeqId id = 1; id <= 6; ++id) {
      REQUIRE(s.add({id, range(static_cast<TokenId>(10 * id), 3 + static_cast<int>(id)), 9})
                  .has_value());
    }
    std::deque<BatchPlan> flight;
    std::set<SeqId> finished;
    std::size_t most = 0;
    for (int round = 0; round < 500 && s.has_unfinished(); ++round) {
      while (flight.size() < static_cast<std::size_t>(in_flight)) {
        BatchPlan plan = s.schedule();
        if (plan.chunks.empty()) break;
        for (const auto& other : flight) {
          for (const auto& chunk : plan.chunks) {
            for (const auto& theirs : other.chunks) CHECK(chunk.id != theirs.id);
          }
          for (SeqId victim : plan.preempted) {
            for (const auto& theirs : other.chunks) CHECK(victim != theirs.id);
          }
        }
        for (const auto& chunk : plan.chunks) CHECK_FALSE(s.in_flight(chunk.id));
        s.start(plan);
        REQUIRE(s.check_invariants().has_value());
        flight.push_back(std::move(plan));
      }
      most = std::max(most, flight.size());
      REQUIRE_FALSE(flight.empty());
      const BatchPlan plan = std::move(flight.front());
      flight.pop_front();
      std::vector<SampledResult> sampled;
      for (const auto& c : plan.chunks) {
        if (c.samples) sampled.push_back({7});
      }
      for (const auto& f : s.update(plan, sampled)) finished.insert(f.id);
      for (const auto& c : plan.chunks) CHECK_FALSE(s.in_flight(c.id));
      REQUIRE(s.check_invariants().has_value());
    }
    CHECK(finished.size() == 6u);
    CHECK(most == static_cast<std::size_t>(in_flight));
    CHECK(s.num_preemptions() > 0);
    CHECK(s.kv_cache().usage() == 0.0);
    CHECK(s.num_in_flight() == 0u);
  }
}

TEST_CASE("a plan takes its share of the live sequences, a static batch all of them",
          "[engine][scheduler][pp]") {
  auto config = small_config();
  config.max_num_batched_tokens = 64;
  config.max_num_seqs = 8;
  config.num_blocks = 64;
  config.max_steps_in_flight = 2;
  for (const auto mode : {BatchingMode::continuous, BatchingMode::static_batch}) {
    config.mode = mode;
    Scheduler s(config);
    for (SeqId id = 1; id <= 5; ++id) REQUIRE(s.add({id, range(1, 4), 3}).has_value());
    const BatchPlan first = s.schedule();
    s.start(first);
    const BatchPlan second = s.schedule();
    s.start(second);
    if (mode == BatchingMode::continuous) {
      CHECK(chunks_of(first) == Chunks{{1, 4}, {2, 4}, {3, 4}});  // 5 live: 3 and 2
      CHECK(chunks_of(second) == Chunks{{4, 4}, {5, 4}});
    } else {
      CHECK(first.chunks.size() == 5u);
      CHECK(second.chunks.empty());
    }
    REQUIRE(s.check_invariants().has_value());
    CHECK(s.num_in_flight() == 5u);
  }
}
