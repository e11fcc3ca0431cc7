// prompt_logprobs in the step loop, with a fake worker: which rows a step asks to score,
// how the scores of many chunks come together on the request's first update, and that
// the prefix cache never serves a prompt being scored.
#include <catch2/catch.hpp>
#include <numeric>

#include "engine/engine_core.hpp"

using namespace troupe;
using namespace troupe::engine;

namespace {

SchedulerConfig config(std::int32_t budget) {
  SchedulerConfig c;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = 8;
  c.max_model_len = 64;
  c.num_blocks = 32;
  c.block_size = 4;
  return c;
}

CoreRequest request(SeqId id, std::int32_t prompt_len, std::optional<std::int32_t> top_n) {
  CoreRequest r;
  r.id = id;
  r.prompt.resize(static_cast<std::size_t>(prompt_len));
  std::iota(r.prompt.begin(), r.prompt.end(), 100 + static_cast<TokenId>(id));
  r.params.max_tokens = 2;
  r.params.prompt_logprobs = top_n;
  return r;
}

// What a worker would answer: a made-up score per prompt row, named by its position.
PromptLogprob fake_score(std::int32_t position, TokenId target) {
  return {target, -0.25f * static_cast<float>(position + 1), position + 1, {{target, -0.5f}}};
}

StepOutput answer(const StepWork& work) {
  StepOutput out;
  out.step_id = work.step_id;
  out.tokens.assign(work.sampled_ids.size(), model::SampledToken{7, -0.5f, {}});
  for (const auto& rows : work.prompt_rows) {
    model::PromptLogprobs scores{rows.id, rows.first_position, {}};
    for (std::size_t i = 0; i < rows.targets.size(); ++i) {
      scores.entries.push_back(
          fake_score(rows.first_position + static_cast<std::int32_t>(i), rows.targets[i]));
    }
    out.prompt_logprobs.push_back(std::move(scores));
  }
  return out;
}

}  // namespace

TEST_CASE("a scored prompt's chunks ask logits for every row whose next token is the prompt's",
          "[engine][prompt_logprobs]") {
  EngineCore core(config(4), {2});
  REQUIRE(core.add(request(1, 10, 3)).has_value());
  std::vector<AddressedEvent> updates;
  // Chunks [0, 4), [4, 8), [8, 10): the last one's row 9 samples instead.
  const std::int32_t firsts[] = {0, 4, 8};
  const std::int32_t counts[] = {4, 4, 1};
  for (int chunk = 0; chunk < 3; ++chunk) {
    auto work = core.next_step();
    REQUIRE(work.has_value());
    REQUIRE(work->prompt_rows.size() == 1);
    const auto& rows = work->prompt_rows.front();
    CHECK(rows.id == 1u);
    CHECK(rows.first_position == firsts[chunk]);
    CHECK(rows.top_n == 3);
    REQUIRE(static_cast<std::int32_t>(rows.targets.size()) == counts[chunk]);
    for (std::int32_t i = 0; i < counts[chunk]; ++i) {
      CHECK(rows.targets[static_cast<std::size_t>(i)] == 101 + firsts[chunk] + i + 1);
    }
    // Sampled rows first, then the scoring rows in flat-batch order.
    const bool samples = chunk == 2;
    CHECK(work->sampled_ids.size() == (samples ? 1u : 0u));
    std::vector<std::int32_t> expected;
    if (samples) expected.push_back(1);  // the chunk's last row (position 9)
    for (std::int32_t i = 0; i < counts[chunk]; ++i) expected.push_back(i);
    CHECK(work->step.logit_rows == expected);
    for (auto& u : core.apply(answer(*work)).updates) updates.push_back(std::move(u));
  }
  REQUIRE(updates.size() == 1);
  const auto& first = updates.front();
  CHECK(first.token.id == 7);
  REQUIRE(first.prompt_logprobs.size() == 9);
  for (std::int32_t p = 0; p < 9; ++p) {
    const auto& s = first.prompt_logprobs[static_cast<std::size_t>(p)];
    CHECK(s.token == 101 + p + 1);
    CHECK(s.logprob == -0.25f * static_cast<float>(p + 1));
    CHECK(s.rank == p + 1);
    CHECK(s.top_logprobs == std::vector<TokenLogprob>{{s.token, -0.5f}});
  }
  // The decode after it scores nothing and carries nothing.
  auto decode = core.next_step();
  REQUIRE(decode.has_value());
  CHECK(decode->prompt_rows.empty());
  CHECK(decode->step.logit_rows.size() == 1);
  const auto last = core.apply(answer(*decode));
  REQUIRE(last.updates.size() == 1);
  CHECK(last.updates.front().prompt_logprobs.empty());
  CHECK(last.updates.front().finish_reason == FinishReason::length);
}

TEST_CASE("a request that does not score its prompt asks no extra rows and hears none",
          "[engine][prompt_logprobs]") {
  EngineCore core(config(64), {2});
  REQUIRE(core.add(request(1, 10, std::nullopt)).has_value());
  auto work = core.next_step();
  REQUIRE(work.has_value());
  CHECK(work->prompt_rows.empty());
  CHECK(work->step.logit_rows == std::vector<std::int32_t>{9});
  const auto applied = core.apply(answer(*work));
  REQUIRE(applied.updates.size() == 1);
  CHECK(applied.updates.front().prompt_logprobs.empty());
}

TEST_CASE("the prefix cache does not serve a prompt being scored, and still learns it",
          "[engine][prompt_logprobs][prefix]") {
  EngineCore core(config(64), {2});
  auto run = [&](SeqId id, std::optional<std::int32_t> top_n) {
    auto r = request(0, 13, top_n);
    r.id = id;  // the same prompt for every id
    REQUIRE(core.add(r).has_value());
    std::vector<AddressedEvent> updates;
    while (auto work = core.next_step()) {
      for (auto& u : core.apply(answer(*work)).updates) updates.push_back(std::move(u));
    }
    return updates;
  };
  run(1, std::nullopt);  // warms the cache
  const auto scored = run(2, 0);
  REQUIRE(!scored.empty());
  CHECK(scored.front().num_cached_tokens == 0);
  CHECK(scored.front().prompt_logprobs.size() == 12);
  const auto plain = run(3, std::nullopt);
  REQUIRE(!plain.empty());
  CHECK(plain.front().num_cached_tokens == 12);
  CHECK(plain.front().prompt_logprobs.empty());
}

TEST_CASE("a worker whose scores are not the ones asked fails the step, and it resumes on the next",
          "[engine][prompt_logprobs]") {
  EngineCore core(config(64), {2});
  REQUIRE(core.add(request(1, 6, 0)).has_value());
  auto work = core.next_step();
  REQUIRE(work.has_value());
  auto out = answer(*work);
  REQUIRE(out.prompt_logprobs.size() == 1);
  out.prompt_logprobs.front().entries.pop_back();
  const auto applied = core.apply(out);
  CHECK(applied.worker_lost);
  CHECK(applied.updates.empty());  // it resumes on the next worker
  core.reset_worker();
  std::vector<AddressedEvent> updates;
  while (auto again = core.next_step()) {
    for (auto& u : core.apply(answer(*again)).updates) updates.push_back(std::move(u));
  }
  // Scored again from its start on the new worker: its first event carries every score.
  REQUIRE_FALSE(updates.empty());
  CHECK(updates.front().prompt_logprobs.size() == 5u);
  CHECK(updates.back().finish_reason == FinishReason::length);
}

TEST_CASE("a scored prompt preempted before its first token is scored again from its start",
          "[engine][prompt_logprobs]") {
  EngineCore core(config(4), {2});
  REQUIRE(core.add(request(1, 10, 0)).has_value());
  auto first = core.next_step();
  REQUIRE(first.has_value());
  core.apply(answer(*first));
  core.reset_worker();  // a new worker: the sequence recomputes
  std::vector<AddressedEvent> updates;
  bool restarted = false;
  while (auto work = core.next_step()) {
    if (!work->prompt_rows.empty() && work->prompt_rows.front().first_position == 0) {
      restarted = true;
    }
    for (auto& u : core.apply(answer(*work)).updates) updates.push_back(std::move(u));
  }
  CHECK(restarted);
  REQUIRE(!updates.empty());
  REQUIRE(updates.front().prompt_logprobs.size() == 9);
  for (std::int32_t p = 0; p < 9; ++p) {
    CHECK(updates.front().prompt_logprobs[static_cast<std::size_t>(p)].rank == p + 1);
  }
}
