// The engine through its C++ API: the actors, end to end, on a small random model.
#include <atomic>
#include <catch2/catch.hpp>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "actors/engine_hooks.hpp"
#include "monitoring/metrics.hpp"
#include "support/engine_support.hpp"
#include "support/event_collector.hpp"
#include "support/small_model.hpp"
#include "text/tokenizer.hpp"
#include "troupe/engine.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

using test::Collector;

std::string small_model() {
  static const std::string path = test::write_small_model(
      "engine-model", [](model::RandomModelSpec& spec) { spec.context_length = 512; });
  return path;
}

EngineConfig small_config() {
  return test::small_engine_config(small_model(), 2, 256);
}

using test::greedy;

using test::kv_drains;

}  // namespace

TEST_CASE("a request streams its tokens and ends with usage", "[actors]") {
  auto engine = Engine::create(small_config());
  REQUIRE(engine.has_value());
  Collector c;
  auto id = (*engine)->submit(greedy({1, 10, 20, 30}, 12), c.callback());
  REQUIRE(id.has_value());
  REQUIRE(c.wait(1));
  const auto r = c.get(*id);
  CHECK(r.tokens.size() == 12);
  REQUIRE(r.end.has_value());
  CHECK(r.end->finish_reason == FinishReason::length);
  CHECK(r.end->num_prompt_tokens == 4);
  CHECK(r.end->num_generated_tokens == 12);
  CHECK(r.text == (*engine)->tokenizer().decode(r.tokens));
  CHECK(kv_drains(**engine));
}

TEST_CASE("outputs through the actors do not depend on what else runs", "[actors][determinism]") {
  auto config = small_config();
  config.num_kv_blocks = 48;  // small: preemptions happen
  config.max_model_len = 128;
  config.max_num_batched_tokens = 16;
  auto engine = Engine::create(config);
  REQUIRE(engine.has_value());
  std::vector<GenerateRequest> requests;
  for (int i = 0; i < 24; ++i) {
    std::vector<TokenId> prompt;
    for (int k = 0; k < 3 + (i * 7) % 30; ++k) prompt.push_back(3 + (i * 31 + k * 17) % 500);
    requests.push_back(greedy(prompt, 4 + (i * 5) % 20));
    if (i % 2 == 1) {
      requests.back().params.temperature = 0.8f;
      requests.back().params.seed = 77 + i;
    }
  }
  std::vector<std::vector<TokenId>> alone;
  for (const auto& r : requests) {
    Collector c;
    auto id = (*engine)->submit(r, c.callback());
    REQUIRE(id.has_value());
    REQUIRE(c.wait(1));
    alone.push_back(c.get(*id).tokens);
  }
  Collector c;
  std::vector<RequestId> ids;
  for (const auto& r : requests) ids.push_back(*(*engine)->submit(r, c.callback()));
  REQUIRE(c.wait(requests.size()));
  for (std::size_t i = 0; i < requests.size(); ++i) CHECK(c.get(ids[i]).tokens == alone[i]);
  CHECK((*engine)->stats().num_preemptions > 0);
  CHECK(kv_drains(**engine));
}

TEST_CASE("cancelling a request frees its KV blocks at once", "[actors]") {
  auto config = small_config();
  EngineHooks hooks;
  hooks.before_step = [] { std::this_thread::sleep_for(1ms); };  // 400 steps outlast the cancel
  auto engine = Engine::create(config, hooks);
  REQUIRE(engine.has_value());
  Collector c;
  auto id = (*engine)->submit(greedy({1, 2, 3}, 400), c.callback());
  REQUIRE(id.has_value());
  for (int i = 0; i < 1000 && c.num_tokens(*id) < 3; ++i) std::this_thread::sleep_for(1ms);
  (*engine)->cancel(*id);
  REQUIRE(c.wait(1));
  CHECK(c.get(*id).end->finish_reason == FinishReason::abort);
  CHECK(c.get(*id).tokens.size() < 400);
  CHECK(kv_drains(**engine));
}

TEST_CASE(
    "under priority scheduling an urgent request preempts a running one, which resumes "
    "and ends with the tokens it would have had alone",
    "[actors]") {
  auto config = small_config();
  config.max_num_seqs = 1;  // one seat: the urgent request must take it
  config.policy = SchedulingPolicy::priority;
  EngineHooks hooks;
  hooks.before_step = [] { std::this_thread::sleep_for(1ms); };
  auto engine = Engine::create(config, hooks);
  REQUIRE(engine.has_value());
  CHECK((*engine)->scheduling_policy() == SchedulingPolicy::priority);
  Collector alone;
  const auto solo = (*engine)->submit(greedy({1, 2, 3}, 120), alone.callback());
  REQUIRE(solo.has_value());
  REQUIRE(alone.wait(1));
  Collector c;
  auto background = greedy({1, 2, 3}, 120);
  background.priority = 5;
  const auto slow = (*engine)->submit(background, c.callback());
  REQUIRE(slow.has_value());
  for (int i = 0; i < 2000 && c.num_tokens(*slow) < 5; ++i) std::this_thread::sleep_for(1ms);
  REQUIRE(c.num_tokens(*slow) >= 5);
  auto urgent = greedy({7, 8, 9}, 4);
  urgent.priority = -1;
  const auto fast = (*engine)->submit(urgent, c.callback());
  REQUIRE(fast.has_value());
  REQUIRE(c.wait(1));
  // The urgent one ended first: the background request is still open, preempted.
  CHECK(c.get(*fast).end.has_value());
  CHECK_FALSE(c.get(*slow).end.has_value());
  REQUIRE(c.wait(2));
  const auto background_result = c.get(*slow);
  CHECK(background_result.end->finish_reason == FinishReason::length);
  CHECK(background_result.tokens == alone.get(*solo).tokens);  // recomputed, not changed
  CHECK((*engine)->stats().num_preemptions >= 1);
  CHECK(kv_drains(**engine));
}

TEST_CASE(
    "requests whose worker is lost mid-stream resume on the next: the undisturbed "
    "tokens, no error, and the migration is counted",
    "[actors][failover]") {
  auto config = small_config();
  config.metrics = std::make_shared<monitoring::Metrics>();
  EngineHooks hooks;
  // The worker fails its 6th step (every stream has sent tokens by then), or every step
  // while `fail_always`.
  auto steps = std::make_shared<std::atomic<int>>(0);
  auto fail_always = std::make_shared<std::atomic<bool>>(false);
  hooks.before_step = [steps, fail_always] {
    if (++*steps == 6 || *fail_always) throw std::runtime_error("injected fault");
  };
  auto engine = Engine::create(config, hooks);
  REQUIRE(engine.has_value());
  std::vector<GenerateRequest> requests;
  for (int i = 0; i < 4; ++i) {
    auto r = greedy({1, 2 + i, 3, 4}, 12);
    if (i % 2 == 1) {  // seeded sampling at temperature 1
      r.params.temperature = 1.0f;
      r.params.seed = 40 + static_cast<std::uint64_t>(i);
    }
    if (i == 3) r.params.frequency_penalty = 1.0f;  // looks at the generated tokens
    requests.push_back(r);
  }
  Collector c;
  std::vector<RequestId> disturbed;
  for (const auto& r : requests) disturbed.push_back(*(*engine)->submit(r, c.callback()));
  REQUIRE(c.wait(requests.size()));
  CHECK((*engine)->stats().num_worker_restarts == 1);
  // Undisturbed: the same requests again (outputs do not depend on the batch).
  Collector u;
  std::vector<RequestId> undisturbed;
  for (const auto& r : requests) undisturbed.push_back(*(*engine)->submit(r, u.callback()));
  REQUIRE(u.wait(requests.size()));
  CHECK((*engine)->stats().num_worker_restarts == 1);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    INFO("request " << i);
    const auto r = c.get(disturbed[i]);
    CHECK(r.end->finish_reason == FinishReason::length);
    CHECK(r.end->error.empty());
    CHECK(r.tokens == u.get(undisturbed[i]).tokens);
    CHECK(r.tokens.size() == 12u);
  }
  const std::string metrics = config.metrics->serialize();
  CHECK(metrics.find("troupe_request_migrations_total{model_name=\"troupe\"} 4") !=
        std::string::npos);

  // A request under which every worker fails ends with the error, after a few tries.
  fail_always->store(true);
  Collector p;
  auto poisoned = (*engine)->submit(greedy({1, 2, 3}, 8), p.callback());
  REQUIRE(p.wait(1));
  CHECK(p.get(*poisoned).end->finish_reason == FinishReason::error);
  CHECK(p.get(*poisoned).end->error.find("injected fault") != std::string::npos);
  fail_always->store(false);
  auto served = (*engine)->submit(greedy({1, 2, 3}, 8), p.callback());
  REQUIRE(p.wait(2));
  CHECK(p.get(*served).end->finish_reason == FinishReason::length);
  CHECK(p.get(*served).tokens.size() == 8);
  CHECK(kv_drains(**engine));
}

TEST_CASE("a request's deadline ends it with timeout", "[actors]") {
  auto config = small_config();
  EngineHooks hooks;
  hooks.before_step = [] { std::this_thread::sleep_for(5ms); };  // a slow model
  auto engine = Engine::create(config, hooks);
  REQUIRE(engine.has_value());
  Collector c;
  auto request = greedy({1, 2, 3}, 400);
  request.timeout = 60ms;
  auto id = (*engine)->submit(request, c.callback());
  REQUIRE(c.wait(1));
  CHECK(c.get(*id).end->finish_reason == FinishReason::timeout);
  CHECK(c.get(*id).tokens.size() < 400);
  CHECK(kv_drains(**engine));
}

TEST_CASE("a stop string ends the output just before it", "[actors]") {
  auto engine = Engine::create(small_config());
  REQUIRE(engine.has_value());
  Collector c;
  auto first = (*engine)->submit(greedy({1, 5, 6}, 40), c.callback());
  REQUIRE(c.wait(1));
  const std::string full = c.get(*first).text;
  REQUIRE(full.size() > 8);
  // Stop on a piece of the middle of the text it will produce again.
  const std::string stop = full.substr(full.size() / 2, 3);
  const std::string expected = full.substr(0, full.find(stop));
  auto request = greedy({1, 5, 6}, 40);
  request.stop = {stop};
  auto second = (*engine)->submit(request, c.callback());
  REQUIRE(c.wait(2));
  CHECK(c.get(*second).text == expected);
  CHECK(c.get(*second).end->finish_reason == FinishReason::stop);
  CHECK(kv_drains(**engine));
}

TEST_CASE("bad requests are refused at submit", "[actors]") {
  auto engine = Engine::create(small_config());
  REQUIRE(engine.has_value());
  Collector c;
  CHECK((*engine)->submit(greedy({}, 4), c.callback()).error().message == "the prompt is empty");
  CHECK((*engine)
            ->submit(greedy({1, 99999}, 4), c.callback())
            .error()
            .message.find("outside the vocabulary") != std::string::npos);
  CHECK((*engine)
            ->submit(greedy({1, 2}, 600), c.callback())
            .error()
            .message.find("maximum context length is 512") != std::string::npos);
  auto bad = greedy({1, 2}, 4);
  bad.params.top_p = 2.0f;
  CHECK((*engine)->submit(bad, c.callback()).error().message.find("top_p") != std::string::npos);
}

TEST_CASE("destroying the engine ends every open request, aborted, and returns at once",
          "[actors]") {
  // The engine lives on a thread of its own, so that a destructor that never returns
  // fails the test rather than hanging it: the thread is then left with it. What the
  // thread shares outlives a failed test.
  struct Shared {
    Collector collector;
    std::vector<RequestId> ids;
    std::promise<std::string> running;  // the requests run (or why not)
    std::promise<void> destroy;         // the test's word to destroy the engine
    std::promise<void> destroyed;       // the destructor returned
  };
  auto shared = std::make_shared<Shared>();
  auto running = shared->running.get_future();
  auto destroyed = shared->destroyed.get_future();
  std::thread([shared] {
    auto& c = shared->collector;
    auto config = small_config();
    EngineHooks hooks;
    // Slow steps: run to their ends, the requests would take some 25 s.
    hooks.before_step = [] { std::this_thread::sleep_for(50ms); };
    auto engine = Engine::create(config, hooks);
    if (!engine) return shared->running.set_value(engine.error().message);
    for (int i = 0; i < 4; ++i) {
      const auto id = (*engine)->submit(greedy({1, 2, 3}, 500), c.callback());
      if (!id) return shared->running.set_value(id.error().message);
      shared->ids.push_back(*id);
    }
    // All four are running: each has a token.
    const auto by = std::chrono::steady_clock::now() + 20s;
    auto all_run = [&] {
      return std::all_of(shared->ids.begin(), shared->ids.end(),
                         [&c](RequestId id) { return c.num_tokens(id) > 0; });
    };
    while (!all_run() && std::chrono::steady_clock::now() < by) std::this_thread::sleep_for(5ms);
    shared->running.set_value(all_run() ? "" : "the requests did not start");
    shared->destroy.get_future().wait();
    engine->reset();
    shared->destroyed.set_value();
  }).detach();
  REQUIRE(running.wait_for(60s) == std::future_status::ready);
  const std::string not_running = running.get();
  INFO(not_running);
  if (!not_running.empty()) shared->destroy.set_value();  // the thread ends its engine
  REQUIRE(not_running.empty());

  const auto start = std::chrono::steady_clock::now();
  shared->destroy.set_value();
  // Generous for a loaded machine, and far below the requests' own 25 s.
  REQUIRE(destroyed.wait_for(10s) == std::future_status::ready);
  INFO("the destructor took "
       << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s");
  // Every request heard of it before the destructor returned: aborted, saying why.
  auto& c = shared->collector;
  CHECK(c.wait(4, 0ms));
  for (RequestId id : shared->ids) {
    const auto r = c.get(id);
    REQUIRE(r.end.has_value());
    CHECK(r.end->finish_reason == FinishReason::abort);
    CHECK(r.end->error == "the engine is shutting down");
    CHECK(r.tokens.size() < 500);
  }
}

TEST_CASE("an engine made on one thread can be destroyed on another", "[actors]") {
  // CAF 0.17 left each thread that made the system, spawned on it or asked it something
  // a reference to its logger, and ~actor_system waited for them: destroyed elsewhere
  // while those threads lived, it hung. This thread makes it, submits, cancels and asks
  // for stats; another submits; a third destroys it.
  auto engine = Engine::create(small_config());
  REQUIRE(engine.has_value());
  Collector c;
  const auto id = (*engine)->submit(greedy({1, 2, 3}, 4), c.callback());
  REQUIRE(id.has_value());
  std::thread([&] {
    CHECK((*engine)->submit(greedy({4, 5}, 4), c.callback()).has_value());
  }).join();
  const auto cancelled = (*engine)->submit(greedy({6, 7}, 400), c.callback());
  REQUIRE(cancelled.has_value());
  (*engine)->cancel(*cancelled);
  CHECK(c.wait(3, 20s));
  CHECK((*engine)->stats().num_running == 0);
  auto destroyed = std::make_shared<std::promise<void>>();
  auto done = destroyed->get_future();
  std::thread([e = std::move(*engine), destroyed]() mutable {
    e.reset();
    destroyed->set_value();
  }).detach();  // left behind, hung, when the test fails
  CHECK(done.wait_for(20s) == std::future_status::ready);
}

TEST_CASE(
    "a GPU worker serves through the actors and is replaced when a step fails, its request resumed",
    "[actors][gpu]") {
  auto config = small_config();
  EngineHooks hooks;
  config.device = Device::cuda;
  auto fail_next = std::make_shared<std::atomic<bool>>(false);
  hooks.before_step = [fail_next] {
    if (fail_next->exchange(false)) throw std::runtime_error("injected fault");
  };
  auto engine = Engine::create(config, hooks);
  if (!engine) {
    const auto& why = engine.error().message;
    if (why.find("no CUDA device") != std::string::npos ||
        why.find("without CUDA") != std::string::npos) {
      test::skip_test(why);
    }
    FAIL(why);
  }
  Collector c;
  std::vector<RequestId> ids;
  for (int i = 0; i < 12; ++i) {
    auto r = greedy({1, 10 + i, 20, 30 + 2 * i}, 6 + i);
    if (i % 3 == 1) {  // sampled on the device, seeded
      r.params.temperature = 0.9f;
      r.params.top_k = 20;
      r.params.top_p = 0.9f;
      r.params.seed = 5 + i;
    }
    if (i % 3 == 2) r.params.logprobs = 2;  // needs the host: logits come back
    ids.push_back(*(*engine)->submit(r, c.callback()));
  }
  REQUIRE(c.wait(ids.size()));
  for (int i = 0; i < 12; ++i) {
    const auto r = c.get(ids[i]);
    CHECK(r.end->finish_reason == FinishReason::length);
    CHECK(r.tokens.size() == static_cast<std::size_t>(6 + i));
  }
  // Alone, the same greedy request gives the same tokens twice (the same step shapes).
  Collector again;
  const auto first = *(*engine)->submit(greedy({1, 2, 3}, 10), again.callback());
  REQUIRE(again.wait(1));
  const auto second = *(*engine)->submit(greedy({1, 2, 3}, 10), again.callback());
  REQUIRE(again.wait(2));
  CHECK(again.get(first).tokens == again.get(second).tokens);

  fail_next->store(true);
  Collector after;
  auto failed = (*engine)->submit(greedy({1, 2, 3}, 8), after.callback());
  REQUIRE(after.wait(1));
  CHECK(after.get(*failed).end->finish_reason == FinishReason::length);  // resumed
  auto served = (*engine)->submit(greedy({1, 2, 3}, 8), after.callback());
  REQUIRE(after.wait(2));
  CHECK(after.get(*served).tokens.size() == 8);
  CHECK(after.get(*failed).tokens == after.get(*served).tokens);
  CHECK((*engine)->stats().num_worker_restarts == 1);
  CHECK(kv_drains(**engine));
}
