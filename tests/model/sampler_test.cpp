#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <set>
#include <span>

#include "engine/stop_rule.hpp"
#include "model/sampler.hpp"
#include "model/splitmix64.hpp"

using namespace troupe;
using namespace troupe::model;

namespace {

Sampler make(SamplingParams params, std::vector<TokenId> prompt = {}, std::vector<TokenId> eog = {},
             std::int32_t vocab = 8) {
  auto s = Sampler::create(params, prompt, std::move(eog), vocab);
  REQUIRE(s.has_value());
  return std::move(*s);
}

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = 100;
  return p;
}

// Frequencies of tokens drawn `n` times from fresh samplers with consecutive seeds.
std::map<TokenId, int> histogram(SamplingParams p, const std::vector<float>& logits, int n) {
  std::map<TokenId, int> counts;
  for (int i = 0; i < n; ++i) {
    p.seed = static_cast<std::uint64_t>(i);
    auto s = make(p, {}, {}, static_cast<std::int32_t>(logits.size()));
    ++counts[s.sample(logits).id];
  }
  return counts;
}

}  // namespace

TEST_CASE("greedy picks the largest logit, the lowest id on ties", "[sampler]") {
  auto s = make(greedy());
  CHECK(s.sample(std::vector<float>{0, 3, 1, 3, 0, 0, 0, 0}).id == 1);
}

TEST_CASE("the same seed gives the same tokens, another seed may not", "[sampler]") {
  SamplingParams p;
  p.temperature = 1.0f;
  p.max_tokens = 100;
  p.seed = 1234;
  const std::vector<float> logits = {1, 1, 1, 1, 1, 1, 1, 1};
  auto a = make(p), b = make(p);
  std::vector<TokenId> ta, tb, tc;
  for (int i = 0; i < 50; ++i) {
    ta.push_back(a.sample(logits).id);
    tb.push_back(b.sample(logits).id);
  }
  CHECK(ta == tb);
  p.seed = 99;
  auto c = make(p);
  for (int i = 0; i < 50; ++i) tc.push_back(c.sample(logits).id);
  CHECK(ta != tc);
}

TEST_CASE("top-k, top-p and min-p keep only the allowed tokens", "[sampler]") {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f),
                                     std::log(0.05f)};
  SamplingParams p;
  p.max_tokens = 10;
  SECTION("top-k 2") {
    p.top_k = 2;
    const auto h = histogram(p, logits, 2000);
    CHECK(h.size() == 2);
    CHECK(h.count(0) == 1);
    CHECK(h.count(1) == 1);
  }
  SECTION("top-p 0.7 keeps the tokens that reach 70% of the mass") {
    p.top_p = 0.7f;
    const auto h = histogram(p, logits, 2000);
    CHECK(h.size() == 2);
    CHECK(std::abs(h.at(0) / 2000.0 - 0.5 / 0.8) < 0.05);
  }
  SECTION("min-p 0.2 drops tokens under a fifth of the top probability") {
    p.min_p = 0.2f;  // threshold 0.1: keeps 0.5, 0.3, 0.15
    const auto h = histogram(p, logits, 3000);
    CHECK(h.size() == 3);
    CHECK(h.count(3) == 0);
  }
  SECTION("plain temperature sampling follows the distribution") {
    const auto h = histogram(p, logits, 4000);
    CHECK(std::abs(h.at(0) / 4000.0 - 0.5) < 0.04);
    CHECK(std::abs(h.at(2) / 4000.0 - 0.15) < 0.03);
  }
  SECTION("a low temperature sharpens it") {
    p.temperature = 0.1f;
    const auto h = histogram(p, logits, 500);
    CHECK(h.at(0) > 490);
  }
}

TEST_CASE("penalties push repeated tokens down", "[sampler]") {
  SECTION("repetition penalty divides positive logits of prompt tokens") {
    auto p = greedy();
    p.repetition_penalty = 2.0f;
    auto s = make(p, /*prompt=*/{0});
    CHECK(s.sample(std::vector<float>{3, 2, 0, 0, 0, 0, 0, 0}).id == 1);  // 3/2 < 2
  }
  SECTION("presence and frequency penalties apply to generated tokens") {
    auto p = greedy();
    p.frequency_penalty = 0.6f;
    p.presence_penalty = 0.5f;
    auto s = make(p);
    const std::vector<float> logits = {2.0f, 1.0f, 0, 0, 0, 0, 0, 0};
    CHECK(s.sample(logits).id == 0);  // no history yet
    CHECK(s.sample(logits).id == 1);  // 2 - 0.6 - 0.5 = 0.9 < 1
  }
}

TEST_CASE("stop rules: end of generation, stop ids, max and min tokens", "[sampler]") {
  // The sampler draws; the engine's stop rule says whether the sequence ended.
  const std::vector<float> eos_first = {0, 0, 5, 1, 0, 0, 0, 0};  // token 2 is EOS
  const std::vector<TokenId> eos = {2};
  SECTION("EOS stops") {
    auto s = make(greedy(), {}, eos);
    const engine::StopRule rule(greedy(), eos);
    CHECK(s.sample(eos_first).id == 2);
    CHECK(rule.stops_on(2, s.num_generated()));
  }
  SECTION("ignore_eos keeps going (to the length limit: engine_core_test)") {
    auto p = greedy();
    p.ignore_eos = true;
    p.max_tokens = 2;
    auto s = make(p, {}, eos);
    const engine::StopRule rule(p, eos);
    TokenId t = s.sample(eos_first).id;
    CHECK(t == 2);
    CHECK_FALSE(rule.stops_on(t, s.num_generated()));
    t = s.sample(eos_first).id;
    CHECK_FALSE(rule.stops_on(t, s.num_generated()));
  }
  SECTION("min_tokens masks EOS until reached") {
    auto p = greedy();
    p.min_tokens = 2;
    auto s = make(p, {}, eos);
    const engine::StopRule rule(p, eos);
    CHECK(s.sample(eos_first).id == 3);
    CHECK(s.sample(eos_first).id == 3);
    CHECK(s.sample(eos_first).id == 2);
    CHECK(rule.stops_on(2, s.num_generated()));
    CHECK_FALSE(rule.stops_on(2, 1));  // EOS before min_tokens does not stop
  }
  SECTION("a stop token id stops") {
    auto p = greedy();
    p.stop_token_ids = {3};
    auto s = make(p);
    const engine::StopRule rule(p, {});
    CHECK(s.sample(std::vector<float>{0, 0, 0, 9, 0, 0, 0, 0}).id == 3);
    CHECK(rule.stops_on(3, s.num_generated()));
  }
}

TEST_CASE("log-probabilities are computed only when asked", "[sampler]") {
  auto s = make(greedy(), {}, {}, 4);
  const auto token = s.sample(std::vector<float>{0.0f, 1.0f, 0.0f, 0.0f});
  CHECK(token.logprob == 0.0f);
  CHECK(token.top_logprobs.empty());
  auto p = greedy();
  p.logprobs = 0;  // the sampled token's only
  auto with = make(p, {}, {}, 4);
  const auto t2 = with.sample(std::vector<float>{0.0f, 1.0f, 0.0f, 0.0f});
  CHECK(t2.logprob < 0.0f);
  CHECK(t2.top_logprobs.empty());
}

TEST_CASE("log-probabilities come from the model's own distribution", "[sampler]") {
  auto p = greedy();
  p.logprobs = 2;
  auto s = make(p, {}, {}, 4);
  const auto token =
      s.sample(std::vector<float>{std::log(0.1f), std::log(0.6f), std::log(0.3f), -1e9f});
  CHECK(token.id == 1);
  CHECK(token.logprob == Approx(std::log(0.6)).margin(1e-5));
  REQUIRE(token.top_logprobs.size() == 2);
  CHECK(token.top_logprobs[0].id == 1);
  CHECK(token.top_logprobs[1].id == 2);
  CHECK(token.top_logprobs[1].logprob == Approx(std::log(0.3)).margin(1e-5));
}

TEST_CASE("bad sampling parameters are errors that say which", "[sampler]") {
  auto error = [](SamplingParams p) {
    auto s = Sampler::create(p, {}, {}, 8);
    REQUIRE_FALSE(s.has_value());
    return s.error().message;
  };
  SamplingParams p;
  p.temperature = -1.0f;
  CHECK(error(p).find("temperature") != std::string::npos);
  p = {};
  p.top_p = 0.0f;
  CHECK(error(p).find("top_p") != std::string::npos);
  p = {};
  p.stop_token_ids = {8};
  CHECK(error(p).find("stop token id 8") != std::string::npos);
  p = {};
  p.max_tokens = 0;
  CHECK(error(p).find("max_tokens") != std::string::npos);
  p = {};
  p.temperature = std::nanf("");
  CHECK(error(p).find("temperature") != std::string::npos);
}

TEST_CASE("a device may draw a row only when the host has nothing to add", "[sampler][device]") {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 40;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  p.seed = 7;
  p.max_tokens = 3;
  auto s = make(p, {1, 2}, {6});
  const auto row = s.device_row();
  REQUIRE(row.has_value());
  CHECK(row->temperature == 0.8f);
  CHECK(row->top_k == 40);
  CHECK(row->top_p == 0.9f);
  CHECK(row->min_p == 0.05f);
  CHECK(row->counter == 0u);
  // The same seed gives the same device stream; the counter moves with each token.
  CHECK(make(p).device_row()->seed == row->seed);
  CHECK(s.accept(3).id == 3);
  CHECK(s.device_row()->counter == 1u);
  const engine::StopRule rule(p, std::vector<TokenId>{6});
  CHECK_FALSE(rule.stops_on(3, s.num_generated()));
  s.accept(6);  // the end-of-generation token ends it, as if the host had drawn it
  CHECK(rule.stops_on(6, s.num_generated()));
  CHECK(s.output() == std::vector<TokenId>{3, 6});

  auto needs_host = [](auto change) {
    SamplingParams q;
    change(q);
    return !make(q).device_row().has_value();
  };
  CHECK(needs_host([](SamplingParams& q) { q.repetition_penalty = 1.1f; }));
  CHECK(needs_host([](SamplingParams& q) { q.presence_penalty = 0.5f; }));
  CHECK(needs_host([](SamplingParams& q) { q.frequency_penalty = 0.5f; }));
  CHECK(needs_host([](SamplingParams& q) { q.logprobs = 0; }));
  // min_tokens masks stop tokens on the host until it is reached.
  SamplingParams m;
  m.min_tokens = 1;
  m.max_tokens = 4;
  auto masked = make(m);
  CHECK_FALSE(masked.device_row().has_value());
  masked.accept(2);
  CHECK(masked.device_row().has_value());
  // top_k -1 means off, as 0 does.
  SamplingParams off;
  off.top_k = -1;
  CHECK(make(off).device_row()->top_k == 0);
}

namespace {

// Logits that depend on the whole output so far, as a model's do: a hash of it and the id.
std::vector<float> history_logits(const std::vector<TokenId>& output, std::int32_t vocab) {
  std::uint64_t h = 0x1234;
  for (const TokenId t : output) h = splitmix64_next(h ^ static_cast<std::uint64_t>(t));
  std::vector<float> l(static_cast<std::size_t>(vocab));
  for (std::int32_t t = 0; t < vocab; ++t) {
    l[static_cast<std::size_t>(t)] =
        static_cast<float>(draw_unit(splitmix64_next(h + static_cast<std::uint64_t>(t)))) * 3.0f;
  }
  return l;
}

std::vector<TokenId> run_to(Sampler& s, std::size_t length, std::int32_t vocab) {
  while (s.output().size() < length) s.sample(history_logits(s.output(), vocab));
  return s.output();
}

}  // namespace

TEST_CASE(
    "a seeded draw depends on the seed and the position only: resumed after any k tokens, "
    "a sampler draws the undisturbed continuation",
    "[sampler][resume]") {
  constexpr std::int32_t kVocab = 16;
  constexpr std::size_t kLength = 24;
  SamplingParams p;
  p.temperature = 1.0f;
  p.max_tokens = 100;
  p.seed = 2026;
  SECTION("plain") {}
  SECTION("with top-k, top-p, min_tokens and penalties on the generated tokens") {
    p.top_k = 10;
    p.top_p = 0.9f;
    p.min_tokens = 6;
    p.frequency_penalty = 0.7f;
    p.presence_penalty = 0.3f;
    p.repetition_penalty = 1.2f;
  }
  const std::vector<TokenId> prompt = {3, 4, 5};
  const std::vector<TokenId> eog = {15};
  auto fresh = [&] { return make(p, prompt, eog, kVocab); };
  Sampler undisturbed = fresh();
  const std::vector<TokenId> reference = run_to(undisturbed, kLength, kVocab);
  // Drawn, not constant: a resume that drew from position 0 again would differ.
  CHECK(std::set<TokenId>(reference.begin(), reference.end()).size() > 4);
  for (std::size_t k = 0; k <= kLength; ++k) {
    INFO("resumed after " << k << " tokens");
    Sampler resumed = fresh();
    REQUIRE(resumed.resume(std::span(reference).first(k)).has_value());
    CHECK(resumed.num_generated() == static_cast<std::int32_t>(k));
    CHECK(run_to(resumed, kLength, kVocab) == reference);
  }
  // Another seed draws otherwise.
  p.seed = 2027;
  Sampler other = fresh();
  CHECK(run_to(other, kLength, kVocab) != reference);
}

TEST_CASE("the host's draw is sampling_draw of the seed's key and the position, as the device's",
          "[sampler][resume]") {
  // Eight equal logits: the draw u in [0, 1) picks token floor(8u), so each token shows the
  // draw. The device's kernel (gpu/sampling.cu) draws with the same function from the
  // device_row's seed and counter.
  SamplingParams p;
  p.temperature = 1.0f;
  p.max_tokens = 100;
  p.seed = 41;
  auto s = make(p);
  const std::vector<float> flat(8, 0.5f);
  for (std::uint64_t position = 0; position < 40; ++position) {
    const auto row = s.device_row();
    REQUIRE(row.has_value());
    CHECK(row->seed == sampling_key(41));
    CHECK(row->counter == position);
    const double u = draw_unit(sampling_draw(sampling_key(41), position));
    CHECK(s.sample(flat).id == static_cast<TokenId>(u * 8.0));
  }
}

TEST_CASE("a resume with a token outside the vocabulary is refused, the sampler unchanged",
          "[sampler][resume]") {
  SamplingParams p;
  p.max_tokens = 10;
  auto s = make(p);
  const std::vector<TokenId> bad = {1, 8};
  const auto r = s.resume(bad);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().message.find("outside the vocabulary") != std::string::npos);
  CHECK(s.num_generated() == 0);
}
