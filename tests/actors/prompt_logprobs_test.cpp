// prompt_logprobs through the Engine, end to end on stories260K: each prompt token's
// log-probability given the tokens before it, on the request's first event. Teacher
// forcing ties it to the sampled tokens' logprobs; chunking, batching and a warm prefix
// cache must not change it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>

#include "support/engine_support.hpp"
#include "support/test_support.hpp"
#include "troupe/engine.hpp"

using namespace troupe;

namespace {

// Every event of every request, in order.
class Events {
 public:
  TokenCallback callback() {
    return [this](const TokenEvent& e) {
      std::lock_guard lock(mutex_);
      events_[e.request_id].push_back(e);
      if (e.finished) {
        ++num_finished_;
        done_.notify_all();
      }
    };
  }
  bool wait(std::size_t n) {
    std::unique_lock lock(mutex_);
    return done_.wait_for(lock, std::chrono::seconds(30), [&] { return num_finished_ >= n; });
  }
  std::vector<TokenEvent> of(RequestId id) {
    std::lock_guard lock(mutex_);
    return events_[id];
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  std::map<RequestId, std::vector<TokenEvent>> events_;
  std::size_t num_finished_ = 0;
};

EngineConfig stories_config(std::int32_t budget = 2048) {
  EngineConfig c;
  c.model_path = test::shared_file("models/stories260K.gguf");
  c.num_threads = 2;
  c.block_size = 4;
  c.num_kv_blocks = 128;
  c.max_num_batched_tokens = budget;
  return c;
}

// A prompt of stories260K's vocabulary: BOS then ordinary tokens.
std::vector<TokenId> a_prompt(int n, int salt = 0) {
  std::vector<TokenId> p{1};
  for (int i = 1; i < n; ++i) p.push_back(static_cast<TokenId>(3 + (i * 37 + salt * 11) % 500));
  return p;
}

GenerateRequest scoring(std::vector<TokenId> prompt, std::int32_t top_n) {
  auto r = test::greedy(std::move(prompt), 1);
  r.params.prompt_logprobs = top_n;
  return r;
}

// The request's prompt_logprobs, from its first event; checks no later event has any.
std::vector<PromptLogprob> prompt_scores(Events& events, RequestId id) {
  const auto all = events.of(id);
  REQUIRE(!all.empty());
  for (std::size_t i = 1; i < all.size(); ++i) CHECK(all[i].prompt_logprobs.empty());
  return all.front().prompt_logprobs;
}

// One request alone on an engine; its scores.
std::vector<PromptLogprob> score_alone(const EngineConfig& config, const GenerateRequest& r) {
  auto engine = Engine::create(config);
  REQUIRE(engine.has_value());
  Events events;
  const auto id = (*engine)->submit(r, events.callback());
  REQUIRE(id.has_value());
  REQUIRE(events.wait(1));
  return prompt_scores(events, *id);
}

bool close(float a, float b) {
  return std::abs(a - b) <= 1e-4f * std::max(1.0f, std::abs(b));
}

}  // namespace

TEST_CASE("teacher forcing: a prompt's scores are the logprobs its tokens were sampled with",
          "[actors][prompt_logprobs]") {
  auto engine = Engine::create(stories_config());
  REQUIRE(engine.has_value());
  Events events;
  const auto q = a_prompt(9);
  auto generate = test::greedy(q, 14);
  generate.params.logprobs = 0;
  const auto first = (*engine)->submit(generate, events.callback());
  REQUIRE(first.has_value());
  REQUIRE(events.wait(1));
  std::vector<TokenId> g;
  std::vector<float> sampled;
  for (const auto& e : events.of(*first)) {
    if (e.token == kNoToken) continue;
    g.push_back(e.token);
    sampled.push_back(e.logprob);
  }
  REQUIRE(g.size() == 14);

  auto forced = q;
  forced.insert(forced.end(), g.begin(), g.end());
  const auto second = (*engine)->submit(scoring(forced, 0), events.callback());
  REQUIRE(second.has_value());
  REQUIRE(events.wait(2));
  const auto scores = prompt_scores(events, *second);
  REQUIRE(scores.size() == forced.size() - 1);
  for (std::size_t p = 1; p < forced.size(); ++p) {
    const PromptLogprob& s = scores[p - 1];
    CHECK(s.token == forced[p]);
    CHECK(s.rank >= 1);
    CHECK(s.logprob <= 0.0f);
    CHECK(s.top_logprobs.empty());
  }
  // The sampled tokens' positions: greedy, so each is the most likely (rank 1), with the
  // logprob it was sampled with.
  for (std::size_t i = 0; i < g.size(); ++i) {
    const PromptLogprob& s = scores[q.size() - 1 + i];
    INFO("generated token " << i);
    CHECK(s.token == g[i]);
    CHECK(s.rank == 1);
    CHECK(close(s.logprob, sampled[i]));
  }
  CHECK(test::kv_drains(**engine));
}

TEST_CASE("prompt scores do not depend on chunking or on the batch",
          "[actors][prompt_logprobs][determinism]") {
  const auto prompt = a_prompt(37);
  const auto whole = score_alone(stories_config(), scoring(prompt, 5));
  REQUIRE(whole.size() == prompt.size() - 1);

  SECTION("top entries are sorted and hold the token when it ranks within them") {
    for (std::size_t i = 0; i < whole.size(); ++i) {
      const PromptLogprob& s = whole[i];
      INFO("position " << i + 1);
      REQUIRE(s.top_logprobs.size() == 5);
      for (std::size_t k = 1; k < s.top_logprobs.size(); ++k) {
        const auto& a = s.top_logprobs[k - 1];
        const auto& b = s.top_logprobs[k];
        CHECK((a.logprob > b.logprob || (a.logprob == b.logprob && a.id < b.id)));
      }
      const bool listed = std::any_of(s.top_logprobs.begin(), s.top_logprobs.end(),
                                      [&](const auto& t) { return t.id == s.token; });
      CHECK(listed == (s.rank <= 5));
      if (listed) {
        // Its rank is its place in the list (as far as ties allow: the same logprob).
        CHECK(s.top_logprobs[static_cast<std::size_t>(s.rank - 1)].logprob == s.logprob);
      } else {
        CHECK(s.top_logprobs.back().logprob >= s.logprob);
      }
    }
  }
  SECTION("in chunks of 8 tokens: the same bits") {
    CHECK(score_alone(stories_config(8), scoring(prompt, 5)) == whole);
  }
  SECTION("in chunks of 5 tokens (not whole blocks): the same bits") {
    CHECK(score_alone(stories_config(5), scoring(prompt, 5)) == whole);
  }
  SECTION("beside other requests, some scoring their own prompts: the same bits") {
    auto engine = Engine::create(stories_config(24));
    REQUIRE(engine.has_value());
    Events events;
    std::vector<RequestId> others;
    for (int i = 0; i < 4; ++i) {
      auto r = test::greedy(a_prompt(11 + 5 * i, i + 1), 6);
      if (i % 2 == 0) r.params.prompt_logprobs = 2;
      others.push_back(*(*engine)->submit(r, events.callback()));
    }
    const auto id = (*engine)->submit(scoring(prompt, 5), events.callback());
    REQUIRE(id.has_value());
    REQUIRE(events.wait(5));
    CHECK(prompt_scores(events, *id) == whole);
    for (int i = 0; i < 4; ++i) {
      const auto theirs = prompt_scores(events, others[static_cast<std::size_t>(i)]);
      CHECK(theirs.size() == (i % 2 == 0 ? static_cast<std::size_t>(11 + 5 * i - 1) : 0u));
    }
  }
}

TEST_CASE("a warm prefix cache does not serve a prompt being scored",
          "[actors][prompt_logprobs][prefix]") {
  const auto prompt = a_prompt(30, 3);
  const auto cold = score_alone(stories_config(), scoring(prompt, 2));
  auto engine = Engine::create(stories_config());
  REQUIRE(engine.has_value());
  Events events;
  // Warm the cache with the prompt.
  const auto warm = (*engine)->submit(test::greedy(prompt, 1), events.callback());
  REQUIRE(warm.has_value());
  REQUIRE(events.wait(1));
  // Scored: every entry, the cold numbers, nothing served from the cache.
  const auto scored = (*engine)->submit(scoring(prompt, 2), events.callback());
  REQUIRE(scored.has_value());
  REQUIRE(events.wait(2));
  CHECK(prompt_scores(events, *scored) == cold);
  CHECK(events.of(*scored).back().num_cached_tokens == 0);
  // Not scored: the cache serves it (the warm blocks are still there).
  const auto again = (*engine)->submit(test::greedy(prompt, 1), events.callback());
  REQUIRE(again.has_value());
  REQUIRE(events.wait(3));
  CHECK(events.of(*again).back().num_cached_tokens > 0);
  CHECK(prompt_scores(events, *again).empty());
}

TEST_CASE("prompt_logprobs outside 0..20 is refused, and a request that does not ask gets none",
          "[actors][prompt_logprobs]") {
  auto engine = Engine::create(stories_config());
  REQUIRE(engine.has_value());
  Events events;
  for (const std::int32_t bad : {-1, 21, 1000}) {
    const auto refused = (*engine)->submit(scoring(a_prompt(5), bad), events.callback());
    REQUIRE_FALSE(refused.has_value());
    CHECK(refused.error().code == ErrorCode::invalid_argument);
    CHECK(refused.error().message.find("prompt_logprobs") != std::string::npos);
  }
  const auto most = (*engine)->submit(scoring(a_prompt(5), 20), events.callback());
  REQUIRE(most.has_value());
  const auto plain = (*engine)->submit(test::greedy(a_prompt(5), 3), events.callback());
  REQUIRE(plain.has_value());
  // A one-token prompt has no position to score.
  const auto single = (*engine)->submit(scoring({1}, 3), events.callback());
  REQUIRE(single.has_value());
  REQUIRE(events.wait(3));
  const auto scores = prompt_scores(events, *most);
  REQUIRE(scores.size() == 4);
  for (const auto& s : scores) CHECK(s.top_logprobs.size() == 20);
  for (const auto& e : events.of(*plain)) CHECK(e.prompt_logprobs.empty());
  CHECK(prompt_scores(events, *single).empty());
}

TEST_CASE("a model split over two local ranks scores a prompt as one worker does",
          "[actors][prompt_logprobs][tp]") {
  const auto prompt = a_prompt(23, 5);
  // F32 keys and values: in F16 the ranks' other rounding can land a value on the other
  // side of an F16 step, and the scores then differ by ~1e-3.
  auto one = stories_config(8);
  one.kv_cache_dtype = KvCacheDtype::f32;
  const auto whole = score_alone(one, scoring(prompt, 3));
  auto config = one;
  config.tensor_parallel_size = 2;  // the LM head split by vocabulary: rank 0 gathers
  config.collective_timeout = std::chrono::seconds(5);
  const auto split = score_alone(config, scoring(prompt, 3));
  // The ranks' partial sums are added in another order than one worker's: close, not equal.
  REQUIRE(split.size() == whole.size());
  for (std::size_t i = 0; i < whole.size(); ++i) {
    INFO("position " << i + 1);
    CHECK(split[i].token == whole[i].token);
    CHECK(close(split[i].logprob, whole[i].logprob));
    REQUIRE(split[i].top_logprobs.size() == 3);
    for (std::size_t k = 0; k < 3; ++k) {
      CHECK(split[i].top_logprobs[k].id == whole[i].top_logprobs[k].id);
      CHECK(close(split[i].top_logprobs[k].logprob, whole[i].top_logprobs[k].logprob));
    }
  }
}
