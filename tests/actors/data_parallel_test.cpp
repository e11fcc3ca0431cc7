// Data parallelism in one process: several replicas (a scheduler and a worker each)
// behind the router actor, through the engine's C++ API.
#include <catch2/catch.hpp>
#include <thread>

#include "actors/engine_hooks.hpp"
#include "support/engine_support.hpp"
#include "support/event_collector.hpp"
#include "support/small_model.hpp"
#include "troupe/engine.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using test::Collector;

namespace {

EngineConfig replicated(std::int32_t replicas, RoutingPolicy routing) {
  static const std::string path = test::write_small_model("data-parallel-model");
  EngineConfig c = test::small_engine_config(path, 1, 128);
  c.max_model_len = 256;
  c.data_parallel_size = replicas;
  c.routing = routing;
  return c;
}

using test::greedy;

std::vector<TokenId> prompt_for(int i, int length) {
  std::vector<TokenId> p;
  for (int k = 0; k < length; ++k) p.push_back(static_cast<TokenId>(1 + (i * 37 + k * 11) % 500));
  return p;
}

// Runs each prompt to its end; returns the tokens, in order.
std::vector<std::vector<TokenId>> run_all(Engine& engine,
                                          const std::vector<std::vector<TokenId>>& prompts,
                                          int max_tokens, std::vector<TokenEvent>* ends = nullptr) {
  Collector c;
  std::vector<RequestId> ids;
  for (const auto& p : prompts) ids.push_back(*engine.submit(greedy(p, max_tokens), c.callback()));
  REQUIRE(c.wait(prompts.size()));
  std::vector<std::vector<TokenId>> out;
  for (RequestId id : ids) {
    auto r = c.get(id);
    out.push_back(r.tokens);
    if (ends) ends->push_back(*r.end);
  }
  return out;
}

std::int64_t total(const std::vector<ReplicaStats>& replicas, std::int64_t ReplicaStats::*field) {
  std::int64_t n = 0;
  for (const auto& r : replicas) n += r.*field;
  return n;
}

}  // namespace

TEST_CASE("two replicas give one engine's greedy outputs, and both take requests",
          "[actors][data_parallel]") {
  std::vector<std::vector<TokenId>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(prompt_for(i, 6 + i));
  auto single = Engine::create(replicated(1, RoutingPolicy::prefix));
  REQUIRE(single.has_value());
  const auto expected = run_all(**single, prompts, 8);
  REQUIRE((*single)->replicas().size() == 1);

  for (auto routing :
       {RoutingPolicy::prefix, RoutingPolicy::least_loaded, RoutingPolicy::round_robin}) {
    auto engine = Engine::create(replicated(2, routing));
    REQUIRE(engine.has_value());
    CHECK(run_all(**engine, prompts, 8) == expected);
    const auto replicas = (*engine)->replicas();
    REQUIRE(replicas.size() == 2);
    CHECK(total(replicas, &ReplicaStats::num_routed) == 8);
    for (const auto& r : replicas) {
      CHECK(r.up);
      CHECK(r.num_routed > 0);
      CHECK(r.stats.num_steps > 0);
    }
    // The engine's numbers are the replicas' summed.
    const EngineStats all = (*engine)->stats();
    CHECK(all.num_kv_blocks == 2 * 128);
    CHECK(all.num_steps == replicas[0].stats.num_steps + replicas[1].stats.num_steps);
    CHECK(test::kv_drains(**engine));
  }
}

TEST_CASE("with prefix routing, a chat's next turn goes where its history is cached",
          "[actors][data_parallel]") {
  auto run_two_turns = [](RoutingPolicy routing, std::vector<TokenEvent>& second_ends) {
    auto engine = Engine::create(replicated(2, routing));
    REQUIRE(engine.has_value());
    std::vector<std::vector<TokenId>> first;
    for (int i = 0; i < 5; ++i) first.push_back(prompt_for(i, 21));
    const auto answers = run_all(**engine, first, 6);
    std::vector<std::vector<TokenId>> second;
    for (std::size_t i = 0; i < first.size(); ++i) {
      auto next = first[i];
      next.insert(next.end(), answers[i].begin(), answers[i].end());
      for (TokenId t : {7, 8, 9}) next.push_back(t);  // the user's next message
      second.push_back(next);
    }
    run_all(**engine, second, 4, &second_ends);
    return (*engine)->replicas();
  };

  std::vector<TokenEvent> ends;
  const auto replicas = run_two_turns(RoutingPolicy::prefix, ends);
  // The first turns spread; every second turn followed its history.
  CHECK(replicas[0].num_routed >= 2);
  CHECK(replicas[1].num_routed >= 2);
  CHECK(total(replicas, &ReplicaStats::num_prefix_routed) == 5);
  // 21 prompt tokens and 6 generated (the last not yet computed): 26 computed, 6 blocks.
  for (const auto& e : ends) CHECK(e.num_cached_tokens == 24);

  // Round robin ignores the caches: five first turns alternate (0 1 0 1 0), so the second
  // turns, alternating on from there (1 0 1 0 1), each land where their history is not.
  std::vector<TokenEvent> rr_ends;
  const auto rr = run_two_turns(RoutingPolicy::round_robin, rr_ends);
  CHECK(total(rr, &ReplicaStats::num_prefix_routed) == 0);
  for (const auto& e : rr_ends) CHECK(e.num_cached_tokens == 0);
}

TEST_CASE("through the router, a cancel frees the request's blocks and a bad size is refused",
          "[actors][data_parallel]") {
  EngineHooks hooks;
  hooks.before_step = [] { std::this_thread::sleep_for(1ms); };
  auto engine = Engine::create(replicated(2, RoutingPolicy::prefix), hooks);
  REQUIRE(engine.has_value());
  Collector c;
  auto id = (*engine)->submit(greedy(prompt_for(1, 8), 240), c.callback());
  REQUIRE(id.has_value());
  while (c.num_tokens(*id) < 2) std::this_thread::sleep_for(1ms);
  (*engine)->cancel(*id);
  REQUIRE(c.wait(1));
  CHECK(c.get(*id).end->finish_reason == FinishReason::abort);
  CHECK(c.num_tokens(*id) < 240);
  CHECK(test::kv_drains(**engine));

  auto bad = replicated(0, RoutingPolicy::prefix);
  auto refused = Engine::create(bad);
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().code == ErrorCode::invalid_argument);
}
