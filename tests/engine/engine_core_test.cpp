// The step loop on its own, with a fake worker: what a driver sends and hears.
#include <algorithm>
#include <catch2/catch.hpp>
#include <deque>
#include <iterator>
#include <map>
#include <numeric>

#include "engine/engine_core.hpp"

using namespace troupe;
using namespace troupe::engine;

namespace {

constexpr TokenId kEos = 2;

SchedulerConfig small_config() {
  SchedulerConfig c;
  c.max_num_batched_tokens = 64;
  c.max_num_seqs = 8;
  c.max_model_len = 64;
  c.num_blocks = 32;
  c.block_size = 4;
  return c;
}

CoreRequest request(SeqId id, std::int32_t max_tokens, std::int32_t prompt_len = 5) {
  CoreRequest r;
  r.id = id;
  r.prompt.resize(static_cast<std::size_t>(prompt_len));
  std::iota(r.prompt.begin(), r.prompt.end(), 10);
  r.params.max_tokens = max_tokens;
  r.reply_to = static_cast<int>(id * 100);  // what a driver keeps for the listener
  return r;
}

// A worker that samples `token` for every row.
StepOutput answer(const StepWork& work, TokenId token = 7) {
  StepOutput out;
  out.step_id = work.step_id;
  out.tokens.assign(work.sampled_ids.size(), model::SampledToken{token, -0.5f, {}});
  return out;
}

// Runs steps until nothing is left, collecting each request's tokens and end.
struct Run {
  std::map<SeqId, std::vector<TokenId>> tokens;
  std::map<SeqId, FinishReason> ends;
};
Run run_all(EngineCore& core, TokenId token = 7) {
  Run run;
  while (auto work = core.next_step()) {
    for (const auto& u : core.apply(answer(*work, token)).updates) {
      if (u.token.id != kNoToken) run.tokens[u.id].push_back(u.token.id);
      if (u.finish_reason != FinishReason::none) run.ends[u.id] = u.finish_reason;
    }
  }
  return run;
}

}  // namespace

TEST_CASE("a request's tokens come back as updates and it ends on max_tokens", "[engine][core]") {
  EngineCore core(small_config(), {kEos});
  REQUIRE(core.add(request(1, 3)).has_value());
  REQUIRE(core.add(request(2, 5)).has_value());
  const auto run = run_all(core);
  CHECK(run.tokens.at(1) == std::vector<TokenId>{7, 7, 7});
  CHECK(run.tokens.at(2).size() == 5u);
  CHECK(run.ends.at(1) == FinishReason::length);
  CHECK(run.ends.at(2) == FinishReason::length);
  CHECK(core.num_requests() == 0u);
  CHECK_FALSE(core.has_work());
  CHECK(core.scheduler().kv_cache().usage() == 0.0);
  CHECK(core.stats().num_steps == 5);
}

TEST_CASE("the updates carry the driver's handle, the cached count and the first step",
          "[engine][core]") {
  EngineCore core(small_config(), {kEos});
  REQUIRE(core.add(request(4, 1)).has_value());
  auto work = core.next_step();
  REQUIRE(work.has_value());
  const auto applied = core.apply(answer(*work));
  REQUIRE(applied.updates.size() == 1u);
  const auto& u = applied.updates[0];
  CHECK(std::any_cast<int>(u.reply_to) == 400);
  CHECK(u.token.logprob == -0.5f);
  CHECK(u.first_scheduled.time_since_epoch().count() != 0);
  CHECK(applied.num_tokens == 5);
}

TEST_CASE("end-of-generation and stop ids end a request with stop, ignore_eos does not",
          "[engine][core]") {
  EngineCore core(small_config(), {kEos});
  REQUIRE(core.add(request(1, 10)).has_value());
  auto ignoring = request(2, 4);
  ignoring.params.ignore_eos = true;
  REQUIRE(core.add(ignoring).has_value());
  auto stop_id = request(3, 10);
  stop_id.params.stop_token_ids = {kEos};
  stop_id.params.ignore_eos = true;
  REQUIRE(core.add(stop_id).has_value());
  auto at_least = request(4, 10);
  at_least.params.min_tokens = 3;
  REQUIRE(core.add(at_least).has_value());
  const auto run = run_all(core, kEos);
  CHECK(run.tokens.at(1).size() == 1u);
  CHECK(run.ends.at(1) == FinishReason::stop);
  CHECK(run.tokens.at(2).size() == 4u);
  CHECK(run.ends.at(2) == FinishReason::length);
  CHECK(run.ends.at(3) == FinishReason::stop);
  CHECK(run.tokens.at(4).size() == 3u);  // not before min_tokens
  CHECK(run.ends.at(4) == FinishReason::stop);
}

TEST_CASE("a worker hears of a sequence once, of its end once, and of all again after a reset",
          "[engine][core]") {
  EngineCore core(small_config(), {kEos});
  auto r = request(1, 10);
  r.params.temperature = 0.5f;
  r.params.seed = 99;
  REQUIRE(core.add(r).has_value());
  REQUIRE(core.add(request(2, 10)).has_value());
  auto first = core.next_step();
  REQUIRE(first.has_value());
  REQUIRE(first->new_sequences.size() == 2u);
  CHECK(first->new_sequences[0].id == 1);
  CHECK(first->new_sequences[0].prompt == r.prompt);
  CHECK(first->new_sequences[0].params == r.params);
  core.apply(answer(*first));
  auto second = core.next_step();
  REQUIRE(second.has_value());
  CHECK(second->new_sequences.empty());
  core.apply(answer(*second));

  const auto cancelled = core.cancel(2, FinishReason::abort);
  REQUIRE(cancelled.has_value());
  CHECK(cancelled->finish_reason == FinishReason::abort);
  CHECK_FALSE(core.cancel(2, FinishReason::abort).has_value());  // once
  auto third = core.next_step();
  REQUIRE(third.has_value());
  CHECK(third->removed == std::vector<std::uint64_t>{2});
  core.apply(answer(*third));

  core.reset_worker();
  auto fourth = core.next_step();
  REQUIRE(fourth.has_value());
  REQUIRE(fourth->new_sequences.size() == 1u);
  CHECK(fourth->new_sequences[0].id == 1);
  CHECK(fourth->new_sequences[0].prompt == r.prompt);  // the prompt, then what it generated
  CHECK(fourth->new_sequences[0].generated == std::vector<TokenId>{7, 7, 7});
  CHECK(fourth->step.num_tokens() == 5 + 3);  // its KV is recomputed
  CHECK(core.stats().num_worker_restarts == 1);
}

TEST_CASE("a request cancelled while its step runs gets no token from that step",
          "[engine][core]") {
  EngineCore core(small_config(), {kEos});
  REQUIRE(core.add(request(1, 10)).has_value());
  REQUIRE(core.add(request(2, 10)).has_value());
  auto work = core.next_step();
  REQUIRE(work.has_value());
  CHECK_FALSE(core.next_step().has_value());  // one step in flight at a time
  REQUIRE(core.cancel(1, FinishReason::abort).has_value());
  const auto applied = core.apply(answer(*work));
  REQUIRE(applied.updates.size() == 1u);
  CHECK(applied.updates[0].id == 2);
  REQUIRE(core.scheduler().check_invariants().has_value());
}

TEST_CASE("a failed step ends its sequences with the error, and the others go on",
          "[engine][core]") {
  auto config = small_config();
  config.max_num_batched_tokens = 5;  // one prompt per step
  EngineCore core(config, {kEos});
  REQUIRE(core.add(request(1, 4)).has_value());
  REQUIRE(core.add(request(2, 4)).has_value());
  auto work = core.next_step();
  REQUIRE(work.has_value());
  REQUIRE(work->sampled_ids == std::vector<std::uint64_t>{1});
  const auto applied =
      core.apply(failed_step(work->step_id, {ErrorCode::out_of_range, "no room", false}));
  REQUIRE(applied.updates.size() == 1u);
  CHECK(applied.updates[0].id == 1);
  CHECK(applied.updates[0].finish_reason == FinishReason::error);
  CHECK(applied.updates[0].error == "no room");
  CHECK_FALSE(applied.worker_lost);
  const auto run = run_all(core);
  CHECK(run.tokens.at(2).size() == 4u);
  CHECK(core.scheduler().kv_cache().usage() == 0.0);
}

TEST_CASE(
    "a worker that answers another step, or fails fatally, is lost: its requests resume "
    "on the next one",
    "[engine][core]") {
  EngineCore core(small_config(), {kEos});
  REQUIRE(core.add(request(1, 4)).has_value());
  auto work = core.next_step();
  REQUIRE(work.has_value());
  core.apply(answer(*work));  // one token sent
  work = core.next_step();
  REQUIRE(work.has_value());
  auto wrong = answer(*work);
  wrong.step_id += 1;
  const auto applied = core.apply(wrong);
  CHECK(applied.worker_lost);
  CHECK(applied.updates.empty());  // no error: it moves to the next worker
  CHECK(core.reset_worker() == 1);
  work = core.next_step();
  REQUIRE(work.has_value());
  REQUIRE(work->new_sequences.size() == 1u);
  CHECK(work->new_sequences[0].generated == std::vector<TokenId>{7});
  core.apply(answer(*work));
  const auto run = run_all(core);
  CHECK(run.tokens.at(1).size() == 2u);  // 1 before, 1 just now, 2 here: max_tokens 4
  CHECK(run.ends.at(1) == FinishReason::length);

  // A request under which every worker is lost ends with the error after kMaxMigrations.
  REQUIRE(core.add(request(2, 4)).has_value());
  std::vector<AddressedEvent> ends;
  for (int i = 0; i <= EngineCore::kMaxMigrations; ++i) {
    work = core.next_step();
    REQUIRE(work.has_value());
    auto lost = core.apply(failed_step(work->step_id, {ErrorCode::internal, "boom", true}));
    CHECK(lost.worker_lost);
    core.reset_worker();
    for (auto& u : lost.updates) ends.push_back(std::move(u));
    CHECK(ends.size() == (i == EngineCore::kMaxMigrations ? 1u : 0u));
  }
  REQUIRE(ends.size() == 1u);
  CHECK(ends[0].finish_reason == FinishReason::error);
  CHECK(ends[0].error.find("boom") != std::string::npos);
  CHECK(ends[0].error.find("lost under it") != std::string::npos);
  CHECK(core.num_requests() == 0u);
}

TEST_CASE("end_all ends every request with the reason, a refused request is not kept",
          "[engine][core]") {
  EngineCore core(small_config(), {kEos});
  REQUIRE(core.add(request(1, 4)).has_value());
  REQUIRE(core.add(request(2, 4)).has_value());
  CHECK_FALSE(core.add(request(2, 4)).has_value());      // a duplicate id
  CHECK_FALSE(core.add(request(3, 4, 64)).has_value());  // no room to generate
  const auto ended = core.end_all(FinishReason::abort, "shutting down");
  REQUIRE(ended.size() == 2u);
  for (const auto& u : ended) {
    CHECK(u.finish_reason == FinishReason::abort);
    CHECK(u.error == "shutting down");
  }
  CHECK(core.num_requests() == 0u);
  CHECK_FALSE(core.has_work());
}

TEST_CASE("a lost worker hands back every request, the started ones with their tokens",
          "[engine][core]") {
  SchedulerConfig config = small_config();
  config.max_num_seqs = 2;  // request 3 waits
  EngineCore core(config, {kEos});
  REQUIRE(core.add(request(1, 8)).has_value());
  REQUIRE(core.add(request(2, 8, 9)).has_value());
  auto first = core.next_step();
  REQUIRE(first);
  core.apply(answer(*first));  // 1 and 2 have a token each
  auto r3 = request(3, 4, 6);
  r3.params.temperature = 0.25f;
  r3.priority = 5;
  REQUIRE(core.add(r3).has_value());
  auto second = core.next_step();
  REQUIRE(second);
  CHECK(core.step_in_flight_id() == second->step_id);

  auto lost = core.lose_worker("node a was lost");
  REQUIRE(lost.unstarted.size() == 3u);
  CHECK(lost.ended.empty());
  CHECK(lost.num_resumed == 2);
  for (SeqId id : {1, 2}) {
    const CoreRequest& moved = lost.unstarted[id - 1];
    CHECK(moved.id == id);
    CHECK(moved.resumed == std::vector<TokenId>{7});  // the token it sent
    CHECK(std::any_cast<int>(moved.reply_to) == static_cast<int>(id * 100));
  }
  const CoreRequest& back = lost.unstarted.back();
  CHECK(back.id == 3);
  CHECK(back.prompt == r3.prompt);
  CHECK(back.resumed.empty());
  CHECK(back.params.temperature == 0.25f);
  CHECK(back.priority == 5);
  CHECK(std::any_cast<int>(back.reply_to) == 300);
  // Nothing is left: no step in flight, no blocks, nothing cached, nothing to tell a
  // new worker.
  CHECK_FALSE(core.step_in_flight());
  CHECK(core.step_in_flight_id() == 0u);
  CHECK(core.num_requests() == 0u);
  CHECK(core.scheduler().kv_cache().usage() == 0.0);
  CHECK(core.scheduler().kv_cache().prefix_cache().size() == 0u);
  CHECK(core.scheduler().check_invariants().has_value());
  REQUIRE(core.add(request(4, 2)).has_value());
  auto next = core.next_step();
  REQUIRE(next);
  CHECK(next->removed.empty());
  core.apply(answer(*next));
  CHECK(run_all(core).ends.at(4) == FinishReason::length);
}

TEST_CASE("a draining core hands back its waiting requests and keeps the running ones",
          "[engine][core]") {
  SchedulerConfig config = small_config();
  config.max_num_seqs = 1;  // 2 and 3 wait
  EngineCore core(config, {kEos});
  REQUIRE(core.add(request(1, 8)).has_value());
  auto first = core.next_step();
  REQUIRE(first);
  REQUIRE(core.add(request(2, 4)).has_value());
  REQUIRE(core.add(request(3, 4)).has_value());
  // The step in flight stays: only the queue leaves.
  auto taken = core.take_waiting();
  REQUIRE(taken.unstarted.size() == 2u);
  CHECK(taken.ended.empty());
  CHECK(taken.num_resumed == 0);
  CHECK(taken.unstarted[0].id == 2);
  CHECK(taken.unstarted[1].id == 3);
  CHECK(std::any_cast<int>(taken.unstarted[1].reply_to) == 300);
  CHECK(core.num_requests() == 1u);
  CHECK(core.step_in_flight_id() == first->step_id);
  core.apply(answer(*first));
  CHECK(core.scheduler().check_invariants().has_value());
  const auto ends = run_all(core).ends;
  CHECK(ends.at(1) == FinishReason::length);
  CHECK_FALSE(ends.contains(2));
  CHECK(core.num_requests() == 0u);
  CHECK(core.take_waiting().unstarted.empty());
}

namespace {

// A worker whose step costs 10 ms + 2 ms a token.
double fake_seconds(std::int32_t num_tokens) {
  return 0.010 + 0.002 * num_tokens;
}

}  // namespace

TEST_CASE("without a token budget sized to the machine the budget is the number given",
          "[engine][core][token_budget]") {
  EngineCore core(small_config(), {kEos});
  CHECK(core.token_budget() == nullptr);
  REQUIRE(core.add(request(1, 4, 40)).has_value());
  REQUIRE(core.add(request(2, 4, 40)).has_value());
  while (auto work = core.next_step()) {
    CHECK(core.scheduler().token_budget() == 64);
    auto out = answer(*work);
    out.seconds = 5.0;  // slow steps change nothing
    core.apply(out);
  }
  CHECK(core.scheduler().token_budget() == 64);
}

TEST_CASE("a token budget sized to the machine keeps each step beside decodes within the target",
          "[engine][core][token_budget]") {
  SchedulerConfig config;
  config.max_num_batched_tokens = 512;
  config.max_num_seqs = 8;
  config.max_model_len = 512;
  config.num_blocks = 512;
  config.block_size = 4;
  TokenBudgetConfig budget;
  budget.target_step_seconds = 0.150;
  budget.max_tokens = 512;
  budget.granularity = 4;
  budget.initial_tokens = 64;
  EngineCore core(config, {kEos}, budget);
  REQUIRE(core.token_budget() != nullptr);
  core.calibrate(std::vector<StepCost>{{256, 0, fake_seconds(256)}, {1, 1, fake_seconds(1)}});
  for (SeqId id = 1; id <= 4; ++id) REQUIRE(core.add(request(id, 20, 200)).has_value());
  int num_steps = 0, num_mixed = 0, num_decode_only = 0;
  double decode_only_seconds = 0.0;
  while (auto work = core.next_step()) {
    const model::StepInput& step = work->step;
    INFO("step " << num_steps << ": " << step.num_tokens() << " tokens");
    CHECK(step.num_tokens() <= core.scheduler().token_budget());
    // Decodes (one token each) come first, then prefill chunks.
    std::int32_t num_decodes = 0;
    bool prefill_seen = false;
    for (std::int32_t s = 0; s < step.num_seqs(); ++s) {
      const std::int32_t n = step.query_start[s + 1] - step.query_start[s];
      if (n == 1) {
        CHECK_FALSE(prefill_seen);
        ++num_decodes;
      } else {
        prefill_seen = true;
      }
    }
    if (num_steps == 0) CHECK(step.num_tokens() == 512);  // nothing decodes yet: all it can
    if (num_decodes > 0) CHECK(fake_seconds(step.num_tokens()) <= 0.150 + 1e-9);
    if (num_decodes > 0 && prefill_seen) ++num_mixed;
    auto out = answer(*work);
    out.seconds = fake_seconds(step.num_tokens());
    if (num_decodes > 0 && !prefill_seen) {
      ++num_decode_only;
      decode_only_seconds += out.seconds;
    }
    core.apply(out);
    ++num_steps;
  }
  CHECK(num_mixed > 0);
  // The stats count the decode-only steps apart (what bench throughput compares TPOT with).
  CHECK(num_decode_only > 0);
  CHECK(core.stats().num_decode_steps == num_decode_only);
  CHECK(core.stats().decode_step_seconds == Approx(decode_only_seconds));
  CHECK(core.stats().num_steps == num_steps);
  CHECK(core.token_budget()->model().seconds_per_token == Approx(0.002));
  CHECK(core.num_requests() == 0u);
}

TEST_CASE("a core calibrated three times too slow gives its steps the true budget soon",
          "[engine][core][token_budget]") {
  // Long prompts wait (16 of 600 tokens, a seat each), so every step beside decodes is as
  // large as the budget lets it: the load that kept a wrong slope for good (issue 35).
  SchedulerConfig config;
  config.max_num_batched_tokens = 512;
  config.max_num_seqs = 16;
  config.max_model_len = 1024;
  config.num_blocks = 1024;
  config.block_size = 4;
  TokenBudgetConfig budget;
  budget.target_step_seconds = 0.150;
  budget.max_tokens = 512;
  budget.granularity = 4;
  EngineCore core(config, {kEos}, budget);
  auto slow = [](std::int32_t n) { return 3 * fake_seconds(n); };
  core.calibrate(std::vector<StepCost>{{256, 0, slow(256)}, {1, 1, slow(1)}});
  TokenBudget truth(budget);
  truth.calibrate(std::vector<StepCost>{{256, 0, fake_seconds(256)}, {1, 1, fake_seconds(1)}});
  for (SeqId id = 1; id <= 16; ++id) {
    auto r = request(id, 40, 600);
    r.prompt[0] = static_cast<TokenId>(1000 + id);  // no prefix shared: each is prefilled
    REQUIRE(core.add(std::move(r)).has_value());
  }
  int num_steps = 0, num_near = 0, num_mixed = 0;
  for (;;) {
    const std::int32_t decodes = core.scheduler().num_decoding();
    auto work = core.next_step();
    if (!work) break;
    auto out = answer(*work);
    out.seconds = fake_seconds(work->step.num_tokens());
    const auto applied = core.apply(out);
    ++num_steps;
    if (num_steps <= 20 || decodes == 0 || applied.num_tokens == applied.num_decodes) continue;
    // Past 20 steps: the steady budget is the true one, within a block.
    ++num_mixed;
    const std::int32_t want = truth.budget(decodes);
    const std::int32_t got = core.token_budget()->budget(decodes);
    INFO("step " << num_steps << ", " << decodes << " decodes: budget " << got << ", true "
                 << want);
    CHECK(got >= want - 4);
    CHECK(got <= want + 4);
    if (got >= want - 4 && got <= want + 4) ++num_near;
  }
  CHECK(num_mixed > 20);
  CHECK(num_near == num_mixed);
  CHECK(core.num_requests() == 0u);
}

TEST_CASE("a TPOT objective sizes the steps beside decodes by the streams' slack",
          "[engine][core][token_budget][slo]") {
  // No timing is asserted: an objective of an hour leaves every stream all the slack (the
  // whole budget), one of a microsecond none (a granule of prefill).
  auto run = [](double tpot_seconds) {
    SchedulerConfig config;
    config.max_num_batched_tokens = 256;
    config.max_num_seqs = 8;
    config.max_model_len = 1024;
    config.num_blocks = 1024;
    config.block_size = 4;
    TokenBudgetConfig budget;
    budget.max_tokens = 256;
    budget.granularity = 4;
    budget.probe_period = 0;  // the steady budget alone
    budget.target_tpot_seconds = tpot_seconds;
    EngineCore core(config, {kEos}, budget);
    core.calibrate(std::vector<StepCost>{{256, 0, fake_seconds(256)}, {1, 1, fake_seconds(1)}});
    for (SeqId id = 1; id <= 8; ++id) {
      auto r = request(id, 20, 400);
      r.prompt[0] = static_cast<TokenId>(1000 + id);
      REQUIRE(core.add(std::move(r)).has_value());
    }
    std::vector<std::int32_t> beside_decodes;  // the budgets of steps with decodes
    for (;;) {
      const std::int32_t decodes = core.scheduler().num_decoding();
      auto work = core.next_step();
      if (!work) break;
      if (decodes > 0) beside_decodes.push_back(core.scheduler().token_budget() - decodes);
      auto out = answer(*work);
      out.seconds = fake_seconds(work->step.num_tokens());
      core.apply(out);
    }
    CHECK(core.num_requests() == 0u);
    return beside_decodes;
  };
  const auto lax = run(3600.0);
  const auto strict = run(1e-6);
  REQUIRE_FALSE(lax.empty());
  REQUIRE_FALSE(strict.empty());
  for (const std::int32_t prefill : strict) CHECK(prefill == 4);
  // With all the slack, the whole budget less the decodes.
  CHECK(*std::min_element(lax.begin(), lax.end()) >= 256 - 8);
}

TEST_CASE("a queue that waits lifts the decodes' bound: the step beside them takes the target",
          "[engine][core][token_budget]") {
  // No timing is asserted: a wait of 0 makes every waiting request a queue, -1 none.
  TokenBudgetConfig budget;
  budget.target_step_seconds = 0.150;
  budget.decode_step_multiple = 2.0;
  budget.max_tokens = 256;
  budget.granularity = 4;
  budget.probe_period = 0;  // the steady budget alone
  TokenBudget truth(budget);
  truth.calibrate(std::vector<StepCost>{{256, 0, fake_seconds(256)}, {1, 1, fake_seconds(1)}});
  auto run = [&](double backlog_wait_seconds) {
    SchedulerConfig config;
    config.max_num_batched_tokens = 256;
    config.max_num_seqs = 8;
    config.max_model_len = 1024;
    config.num_blocks = 1024;
    config.block_size = 4;
    TokenBudgetConfig b = budget;
    b.backlog_wait_seconds = backlog_wait_seconds;
    EngineCore core(config, {kEos}, b);
    core.calibrate(std::vector<StepCost>{{256, 0, fake_seconds(256)}, {1, 1, fake_seconds(1)}});
    // Two streams start, then six long prompts queue behind them.
    for (SeqId id = 1; id <= 2; ++id) REQUIRE(core.add(request(id, 40, 8)).has_value());
    auto first = core.next_step();
    REQUIRE(first);
    auto first_out = answer(*first);
    first_out.seconds = fake_seconds(first->step.num_tokens());
    core.apply(first_out);
    for (SeqId id = 3; id <= 8; ++id) {
      auto r = request(id, 4, 200);
      r.prompt[0] = static_cast<TokenId>(1000 + id);
      REQUIRE(core.add(std::move(r)).has_value());
    }
    std::int32_t num_queued_steps = 0;
    for (;;) {
      const std::int32_t decodes = core.scheduler().num_decoding();
      const bool queued = core.scheduler().num_waiting() > 0;
      auto work = core.next_step();
      if (!work) break;
      if (decodes > 0 && queued) {
        ++num_queued_steps;
        const std::int32_t want = backlog_wait_seconds >= 0
                                      ? truth.budget_within(decodes, budget.target_step_seconds)
                                      : truth.budget(decodes);
        // Within a granule: the fitted line may round either side of a granule's edge.
        INFO(decodes << " decodes, a queue waiting: budget " << core.scheduler().token_budget()
                     << ", want " << want);
        CHECK(std::abs(core.scheduler().token_budget() - want) <= budget.granularity);
      }
      auto out = answer(*work);
      out.seconds = fake_seconds(work->step.num_tokens());
      core.apply(out);
    }
    CHECK(core.num_requests() == 0u);
    return num_queued_steps;
  };
  // Held to twice the decodes' step, the queue waits through more steps than with the target.
  const std::int32_t held = run(-1.0);
  const std::int32_t lifted = run(0.0);
  CHECK(lifted > 0);
  CHECK(held > lifted);
  // With two decodes the target leaves far more room than twice their step.
  CHECK(truth.budget_within(2, 0.150) > 4 * truth.budget(2));
}

TEST_CASE("a row with no token runs its position again, and the output is the same",
          "[engine][core]") {
  // A worker that withholds the token of request 1 at every second step it is sampled
  // in (its grammar's mask late), and samples 7 otherwise.
  EngineCore core(small_config(), {kEos});
  REQUIRE(core.add(request(1, 4, 6)).has_value());
  REQUIRE(core.add(request(2, 4, 3)).has_value());
  std::map<SeqId, std::vector<TokenId>> tokens;
  std::map<SeqId, FinishReason> ends;
  int withheld = 0, steps = 0;
  std::int32_t withheld_position = -1;  // where request 1's row had no token
  while (auto work = core.next_step()) {
    REQUIRE(++steps < 50);
    StepOutput out = answer(*work);
    for (std::size_t i = 0; i < work->sampled_ids.size(); ++i) {
      if (work->sampled_ids[i] != 1) continue;
      const std::int32_t position = work->step.positions[work->step.logit_rows[i]];
      // The position without a token runs again, next.
      if (withheld_position >= 0) CHECK(position == withheld_position);
      withheld_position = -1;
      if (steps % 2 == 1) {
        out.tokens[i] = model::SampledToken{};  // kNoToken, no error: late
        withheld_position = position;
        ++withheld;
      }
    }
    for (const auto& u : core.apply(out).updates) {
      if (u.token.id != kNoToken) tokens[u.id].push_back(u.token.id);
      if (u.finish_reason != FinishReason::none) ends[u.id] = u.finish_reason;
    }
  }
  CHECK(withheld >= 3);
  CHECK(tokens[1] == std::vector<TokenId>{7, 7, 7, 7});
  CHECK(tokens[2] == std::vector<TokenId>{7, 7, 7, 7});
  CHECK(ends[1] == FinishReason::length);
  CHECK(ends[2] == FinishReason::length);
  CHECK(core.stats().kv_usage == 0.0);
  CHECK(core.stats().num_generated_tokens == 8);  // the withheld rows are not counted
}

TEST_CASE("a row whose worker says it cannot go on ends with the error, the request's fault",
          "[engine][core]") {
  EngineCore core(small_config(), {kEos});
  REQUIRE(core.add(request(1, 8)).has_value());
  REQUIRE(core.add(request(2, 3)).has_value());
  auto work = core.next_step();
  REQUIRE(work.has_value());
  StepOutput out = answer(*work);
  for (std::size_t i = 0; i < work->sampled_ids.size(); ++i) {
    if (work->sampled_ids[i] == 1)
      out.tokens[i] = model::SampledToken{kNoToken, 0, {}, "too costly"};
  }
  bool ended = false;
  for (const auto& u : core.apply(out).updates) {
    if (u.id != 1) continue;
    ended = true;
    CHECK(u.finish_reason == FinishReason::error);
    CHECK(u.error == "too costly");
    CHECK(u.error_code == ErrorCode::invalid_argument);
    CHECK(u.token.id == kNoToken);
  }
  CHECK(ended);
  const Run rest = run_all(core);
  CHECK(rest.tokens.count(1) == 0);
  CHECK(rest.ends.at(2) == FinishReason::length);
  CHECK(core.stats().kv_usage == 0.0);
}

TEST_CASE("a request's LoRA adapter slot reaches its rows of the step, and only its own",
          "[engine][core][lora]") {
  EngineCore core(small_config(), {kEos});
  auto base = request(1, 2, 9);
  auto adapted = request(2, 2, 9);  // the same prompt: two full blocks the cache could share
  adapted.adapter = 3;
  REQUIRE(core.add(base).has_value());
  auto work = core.next_step();
  REQUIRE(work.has_value());
  CHECK(work->step.adapters.empty());  // the base model alone: no slots
  core.apply(answer(*work));
  REQUIRE(core.add(adapted).has_value());
  // The per-adapter counts the metrics read: the base's sequence runs, the adapter's waits.
  auto counts = core.scheduler().adapter_counts();
  CHECK(counts.running == std::vector<std::int64_t>{1});
  CHECK(counts.waiting == std::vector<std::int64_t>{0, 0, 0, 1});
  auto negative = request(3, 2);
  negative.adapter = -1;
  CHECK_FALSE(core.add(negative).has_value());
  work = core.next_step();
  REQUIRE(work.has_value());
  // The base sequence decodes one token; the adapter's prompt runs whole, none of it taken
  // from the base's cached blocks.
  CHECK(work->step.adapters == std::vector<std::int32_t>{0, 3});
  CHECK(work->step.query_start == std::vector<std::int32_t>{0, 1, 10});
  const auto updates = core.apply(answer(*work)).updates;
  for (const auto& u : updates) {
    if (u.id == 2) CHECK(u.num_cached_tokens == 0);
  }
  counts = core.scheduler().adapter_counts();  // the base's sequence ended at its 2 tokens
  CHECK(counts.running == std::vector<std::int64_t>{0, 0, 0, 1});
  CHECK(counts.waiting.empty());
  run_all(core);
  CHECK(core.scheduler().adapter_counts().running.empty());
}

namespace {

// A fake worker whose token depends on the sequence's tokens so far (as a model's does):
// a step applied out of order, or a sequence run twice at once, would change them.
StepOutput history_answer(const EngineCore& core, const StepWork& work) {
  StepOutput out;
  out.step_id = work.step_id;
  for (const std::uint64_t id : work.sampled_ids) {
    const Sequence* seq = core.scheduler().find(id);
    TokenId token = 3;
    if (seq != nullptr) {
      for (const TokenId t : seq->tokens) token = static_cast<TokenId>((token * 31 + t) % 97 + 3);
    }
    out.tokens.push_back({token, -0.5f, {}});
  }
  return out;
}

std::vector<std::uint64_t> sorted(std::vector<std::uint64_t> ids) {
  std::sort(ids.begin(), ids.end());
  return ids;
}

// Runs every request with up to `in_flight` steps at once: each round issues steps until
// the core has no more, then applies the oldest. Checks that the steps in flight hold
// disjoint sequences; `most_in_flight` is the most that were.
Run run_in_flight(EngineCore& core, std::size_t& most_in_flight) {
  Run run;
  std::deque<StepWork> flight;
  most_in_flight = 0;
  for (;;) {
    while (auto work = core.next_step()) {
      for (const StepWork& other : flight) {
        std::vector<std::uint64_t> shared;
        std::set_intersection(other.sampled_ids.begin(), other.sampled_ids.end(),
                              work->sampled_ids.begin(), work->sampled_ids.end(),
                              std::back_inserter(shared));
        CHECK(shared.empty());
      }
      for (const std::uint64_t id : work->sampled_ids) CHECK(core.scheduler().in_flight(id));
      flight.push_back(std::move(*work));
      flight.back().sampled_ids = sorted(flight.back().sampled_ids);
    }
    most_in_flight = std::max(most_in_flight, flight.size());
    REQUIRE(core.scheduler().check_invariants().has_value());
    if (flight.empty()) break;
    REQUIRE(core.step_in_flight_id() == flight.front().step_id);
    auto output = history_answer(core, flight.front());
    flight.pop_front();
    for (const auto& u : core.apply(output).updates) {
      if (u.token.id != kNoToken) run.tokens[u.id].push_back(u.token.id);
      if (u.finish_reason != FinishReason::none) run.ends[u.id] = u.finish_reason;
    }
  }
  return run;
}

}  // namespace

TEST_CASE("two steps in flight hold disjoint sequences, apply in order and give one step's tokens",
          "[engine][core][pp]") {
  auto config = small_config();
  config.max_num_batched_tokens = 16;
  const auto add_all = [](EngineCore& core) {
    for (SeqId id = 1; id <= 7; ++id) {
      REQUIRE(core.add(request(id, 3 + static_cast<std::int32_t>(id) * 2,
                               2 + static_cast<std::int32_t>(id * 3 % 11)))
                  .has_value());
    }
  };
  EngineCore one(config, {kEos});
  add_all(one);
  std::size_t most = 0;
  const Run expected = run_in_flight(one, most);
  CHECK(most == 1u);
  config.max_steps_in_flight = 2;
  EngineCore two(config, {kEos});
  add_all(two);
  const Run got = run_in_flight(two, most);
  CHECK(most == 2u);
  CHECK(got.tokens == expected.tokens);
  CHECK(got.ends == expected.ends);
  CHECK(two.num_requests() == 0u);
  CHECK(two.scheduler().kv_cache().usage() == 0.0);
  CHECK(two.scheduler().num_in_flight() == 0u);
  // Each step carried its share: about half the sequences, so more steps than one at a time.
  CHECK(two.stats().num_steps > one.stats().num_steps);
  CHECK(two.stats().num_generated_tokens == one.stats().num_generated_tokens);
}

TEST_CASE("a later step's output applied first is another step's: the worker is lost",
          "[engine][core][pp]") {
  auto config = small_config();
  config.max_steps_in_flight = 2;
  EngineCore core(config, {kEos});
  REQUIRE(core.add(request(1, 6)).has_value());
  REQUIRE(core.add(request(2, 6)).has_value());
  auto first = core.next_step();
  auto second = core.next_step();
  REQUIRE(first.has_value());
  REQUIRE(second.has_value());
  CHECK_FALSE(core.next_step().has_value());  // two at most
  CHECK(first->sampled_ids == std::vector<std::uint64_t>{1});
  CHECK(second->sampled_ids == std::vector<std::uint64_t>{2});
  CHECK(core.step_in_flight_id() == first->step_id);
  CHECK(core.in_flight(second->step_id));
  const auto applied = core.apply(answer(*second));
  CHECK(applied.worker_lost);
  CHECK_FALSE(core.step_in_flight());  // both lost
  CHECK_FALSE(core.in_flight(second->step_id));
  CHECK(core.reset_worker() == 2);
  const auto run = run_all(core);
  CHECK(run.tokens.at(1).size() == 6u);
  CHECK(run.tokens.at(2).size() == 6u);
  CHECK(core.scheduler().kv_cache().usage() == 0.0);
}

TEST_CASE(
    "with two steps in flight a cancel frees its blocks at once and a fatal failure loses both "
    "steps: their requests resume",
    "[engine][core][pp]") {
  auto config = small_config();
  config.max_num_batched_tokens = 16;
  config.max_steps_in_flight = 2;
  EngineCore expected_core(small_config(), {kEos});
  EngineCore core(config, {kEos});
  for (SeqId id = 1; id <= 4; ++id) {
    REQUIRE(core.add(request(id, 8, 3 + static_cast<std::int32_t>(id))).has_value());
    REQUIRE(expected_core.add(request(id, 8, 3 + static_cast<std::int32_t>(id))).has_value());
  }
  std::size_t most = 0;
  const Run expected = run_in_flight(expected_core, most);
  Run run;
  const auto take = [&run](const AppliedStep& applied) {
    for (const auto& u : applied.updates) {
      if (u.token.id != kNoToken) run.tokens[u.id].push_back(u.token.id);
      if (u.finish_reason != FinishReason::none) run.ends[u.id] = u.finish_reason;
    }
  };
  auto a = core.next_step();
  auto b = core.next_step();
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  take(core.apply(history_answer(core, *a)));
  a = core.next_step();  // beside b
  REQUIRE(a.has_value());
  // Sequence 4 is cancelled in its step in flight: its blocks go now, and its step's
  // output brings it nothing.
  const SeqId cancelled = b->sampled_ids.back();
  const double before = core.scheduler().kv_cache().usage();
  REQUIRE(core.cancel(cancelled, FinishReason::abort).has_value());
  CHECK(core.scheduler().kv_cache().usage() < before);
  CHECK_FALSE(core.scheduler().in_flight(cancelled));
  REQUIRE(core.scheduler().check_invariants().has_value());
  const auto applied = core.apply(history_answer(core, *b));
  for (const auto& u : applied.updates) CHECK(u.id != cancelled);
  take(applied);
  // The worker fails the older step in flight fatally: the newer one is lost with it.
  auto c = core.next_step();
  REQUIRE(c.has_value());
  const auto lost = core.apply(failed_step(a->step_id, {ErrorCode::internal, "boom", true}));
  CHECK(lost.worker_lost);
  CHECK(lost.updates.empty());
  CHECK_FALSE(core.step_in_flight());
  CHECK(core.scheduler().num_in_flight() == 3u);  // until the worker is replaced
  CHECK(core.reset_worker() == 3);
  CHECK(core.scheduler().num_in_flight() == 0u);
  REQUIRE(core.scheduler().check_invariants().has_value());
  const Run rest = run_in_flight(core, most);
  for (const auto& [id, tokens] : rest.tokens) {
    run.tokens[id].insert(run.tokens[id].end(), tokens.begin(), tokens.end());
  }
  for (const auto& [id, end] : rest.ends) run.ends[id] = end;
  for (SeqId id = 1; id <= 4; ++id) {
    INFO("request " << id);
    if (id == cancelled) {
      CHECK(run.ends.count(id) == 0u);
      continue;
    }
    CHECK(run.tokens[id] == expected.tokens.at(id));
    CHECK(run.ends.at(id) == FinishReason::length);
  }
  CHECK(core.scheduler().kv_cache().usage() == 0.0);
  CHECK(core.num_requests() == 0u);
}
