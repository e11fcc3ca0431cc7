// The sampler under a grammar: the mask comes first, end tokens only where the grammar can
// end, and the end is the only choice once it must.
#include <catch2/catch.hpp>
#include <chrono>
#include <limits>
#include <span>
#include <thread>

#include "engine/stop_rule.hpp"
#include "grammar/gbnf.hpp"
#include "model/sampler.hpp"

using namespace troupe;
using namespace troupe::model;

namespace {

// Token 0 is the end of generation (it stands for no bytes); the others for their text.
const std::vector<std::string> kPieces = {"", "a", "b", "ab", "c", "{", "}", "x"};
constexpr TokenId kEos = 0, kA = 1, kB = 2, kAB = 3, kC = 4, kX = 7;
constexpr std::int32_t kVocab = 8;
constexpr float kLow = -5.0f;

OutputGrammar constraint(const std::string& gbnf) {
  auto parsed = grammar::parse_gbnf(gbnf);
  REQUIRE(parsed.has_value());
  auto compiled = grammar::compile(*parsed);
  REQUIRE(compiled.has_value());
  static const auto masker = std::make_shared<const grammar::TokenMasker>(kPieces);
  return {std::make_shared<const grammar::CompiledGrammar>(std::move(*compiled)), masker};
}

Sampler make(const SamplingParams& params, const std::string& gbnf) {
  auto s = Sampler::create(params, {}, {kEos}, kVocab, constraint(gbnf));
  REQUIRE(s.has_value());
  return std::move(*s);
}

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = 100;
  p.grammar = "(set)";  // the runner's business; here it only marks the request constrained
  return p;
}

// Logits with `favourite` far ahead, then `second`, the rest low.
std::vector<float> logits(TokenId favourite, TokenId second = kEos) {
  std::vector<float> l(kVocab, kLow);
  l[static_cast<std::size_t>(second)] = 5.0f;
  l[static_cast<std::size_t>(favourite)] = 10.0f;
  return l;
}

}  // namespace

TEST_CASE("under a grammar the sampler takes the best token the grammar allows", "[sampler]") {
  auto s = make(greedy(), R"(root ::= "ab" "c")");
  CHECK(s.constrained());
  // x is the model's favourite, but only "a" and "ab" start the output: "ab" is higher.
  auto l = logits(kX, kAB);
  l[kA] = 1.0f;
  CHECK(s.sample(l).id == kAB);
  // The end of generation is the favourite now, but the grammar cannot end before "c".
  CHECK(s.sample(logits(kEos, kX)).id == kC);
  // Complete: only the end may follow, however unlikely the model finds it.
  auto end = logits(kX, kA);
  end[kEos] = -50.0f;
  CHECK(s.sample(end).id == kEos);
  CHECK_FALSE(s.grammar_broken());
}

TEST_CASE("drawn at any temperature, tokens stay inside the grammar", "[sampler]") {
  // Anything but x, then the end: a draw may pick the end once the grammar can end.
  const std::string gbnf = R"(root ::= [abc{}]+)";
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    SamplingParams p = greedy();
    p.temperature = 1.5f;
    p.seed = seed;
    auto s = make(p, gbnf);
    std::vector<float> flat(kVocab, 0.0f);
    const TokenId first = s.sample(flat).id;
    CHECK(first != kX);
    CHECK(first != kEos);  // the grammar needs one character first
    const TokenId second = s.sample(flat).id;
    CHECK(second != kX);
  }
}

TEST_CASE("end tokens wait for min_tokens, unless the grammar must end", "[sampler]") {
  SamplingParams p = greedy();
  p.min_tokens = 3;
  // "a"s at will: the end is the favourite but waits for three tokens.
  auto open = make(p, R"(root ::= "a"+)");
  std::vector<TokenId> got;
  for (int i = 0; i < 4; ++i) got.push_back(open.sample(logits(kEos, kA)).id);
  CHECK(got == std::vector<TokenId>{kA, kA, kA, kEos});
  // One "a" and nothing more: min_tokens yields, and the stop rule lets it stop.
  auto closed = make(p, R"(root ::= "a")");
  CHECK(closed.sample(logits(kA)).id == kA);
  CHECK(closed.sample(logits(kA)).id == kEos);
  const engine::StopRule rule(p, std::vector<TokenId>{kEos});
  CHECK(rule.stops_on(kEos, closed.num_generated()));
}

TEST_CASE("a grammar's end stops the output even with ignore_eos", "[sampler]") {
  SamplingParams p = greedy();
  p.ignore_eos = true;
  const engine::StopRule constrained(p, std::vector<TokenId>{kEos});
  CHECK(constrained.stops_on(kEos, 1));
  p.grammar.clear();
  const engine::StopRule free(p, std::vector<TokenId>{kEos});
  CHECK_FALSE(free.stops_on(kEos, 1));
}

TEST_CASE("stop token ids count as ends under a grammar", "[sampler]") {
  SamplingParams p = greedy();
  p.stop_token_ids = {kX};
  auto s = make(p, R"(root ::= "a" "b"?)");
  CHECK(s.sample(logits(kX, kA)).id == kA);
  // After "a" the grammar can end: x, a stop id, is allowed as an end.
  CHECK(s.sample(logits(kX, kB)).id == kX);
}

TEST_CASE("an end token with text is an end: never in the middle, held by min_tokens",
          "[sampler]") {
  SamplingParams p = greedy();
  p.stop_token_ids = {kB};  // "b" stands for text the grammar takes, but it stops
  p.min_tokens = 2;
  auto s = make(p, R"(root ::= "a" "b"* "c"?)");
  CHECK(s.sample(logits(kB, kA)).id == kA);
  // "b" is the favourite and its bytes fit, but it is an end, held by min_tokens: "c".
  CHECK(s.sample(logits(kB, kC)).id == kC);
  // Complete now: the end alone.
  CHECK(s.sample(logits(kA, kX)).id == kEos);
}

TEST_CASE("a token from outside the grammar breaks it: only ends follow", "[sampler]") {
  auto s = make(greedy(), R"(root ::= "ab")");
  s.accept(kX);  // as a device might have drawn it, had the mask been lost
  // Known with the next mask's work, which advances the matcher.
  CHECK(s.sample(logits(kA, kAB)).id == kEos);
  CHECK(s.grammar_broken());
}

TEST_CASE("a grammar needs the model's token masker, with the model's vocabulary", "[sampler]") {
  OutputGrammar no_masker = constraint(R"(root ::= "a")");
  no_masker.masker.reset();
  CHECK_FALSE(Sampler::create(greedy(), {}, {kEos}, kVocab, no_masker).has_value());
  CHECK_FALSE(
      Sampler::create(greedy(), {}, {kEos}, kVocab + 1, constraint(R"(root ::= "a")")).has_value());
}

TEST_CASE("a device draws under the grammar's bitmask, ends included where they may come",
          "[sampler]") {
  auto bits = [](const model::DeviceSamplingRow& row) {
    std::vector<TokenId> on;
    for (TokenId t = 0; t < kVocab; ++t) {
      if ((row.allowed[t / 64] >> (t % 64)) & 1u) on.push_back(t);
    }
    return on;
  };
  SamplingParams p = greedy();
  p.min_tokens = 2;
  auto s = make(p, R"(root ::= "a" "b"* | "ab" "c")");
  // min_tokens does not send a constrained row to the host: its bitmask holds the ends back.
  auto row = s.device_row();
  REQUIRE(row.has_value());
  REQUIRE(row->allowed != nullptr);
  s.prepare_device_mask();
  CHECK(bits(*row) == std::vector<TokenId>{kA, kAB});
  s.accept(kA);  // can end, but min_tokens is 2: no end yet
  s.prepare_device_mask();
  CHECK(bits(*s.device_row()) == std::vector<TokenId>{kB});
  s.accept(kB);  // past min_tokens: the end may come ("ab" also opens the second branch)
  s.prepare_device_mask();
  CHECK(bits(*s.device_row()) == std::vector<TokenId>{kEos, kB, kC});
  // Complete: the end alone, whatever min_tokens says.
  SamplingParams q = greedy();
  q.min_tokens = 5;
  auto done = make(q, R"(root ::= "ab")");
  done.accept(kAB);
  done.prepare_device_mask();
  CHECK(bits(*done.device_row()) == std::vector<TokenId>{kEos});
  // The pointer a row was given stays good: the same buffer is refilled.
  CHECK(done.device_row()->allowed == done.device_row()->allowed);
}

namespace {

// Token 0 ends the output; tokens 1..95 are the printable ASCII characters, one each, and
// every pair of lowercase letters follows: a mask steps from every state by each of them,
// and a pair's second byte is matched on the whole state (where branches multiply).
struct Printable {
  std::vector<std::string> pieces{""};
  Printable() {
    for (char c = ' '; c <= '~'; ++c) pieces.emplace_back(1, c);
    for (char a = 'a'; a <= 'z'; ++a) {
      for (char b = 'a'; b <= 'z'; ++b) pieces.push_back(std::string{a, b});
    }
  }
  std::int32_t vocab() const { return static_cast<std::int32_t>(pieces.size()); }
  TokenId id(char c) const { return static_cast<TokenId>(c - ' ' + 1); }
};

// "AB", then 200 times ".*", then "z": cheap to follow through "AB" (no token holds more
// than one capital), its branches multiplied past any budget after (as the regex
// ".*" * 200 + "z" is).
OutputGrammar costly_after_ab(const Printable& vocab) {
  std::string gbnf = "root ::= \"AB\"";
  for (int i = 0; i < 200; ++i) gbnf += " [^\\n]*";
  gbnf += " \"z\"\n";
  auto parsed = grammar::parse_gbnf(gbnf);
  REQUIRE(parsed.has_value());
  auto compiled = grammar::compile(*parsed);
  REQUIRE(compiled.has_value());
  return {std::make_shared<const grammar::CompiledGrammar>(std::move(*compiled)),
          std::make_shared<const grammar::TokenMasker>(vocab.pieces)};
}

}  // namespace

TEST_CASE("a mask past its work budget fails the output and says where, a cheap one is ready",
          "[sampler]") {
  const Printable vocab;
  auto created = Sampler::create(greedy(), {}, {kEos}, vocab.vocab(), costly_after_ab(vocab));
  REQUIRE(created.has_value());
  Sampler s = std::move(*created);
  MaskWorkers workers(2);
  std::vector<float> l(static_cast<std::size_t>(vocab.vocab()), 0.0f);
  for (const char c : {'A', 'B'}) {
    s.start_mask(workers);
    REQUIRE(s.wait_mask_until(MaskJob::Clock::now() + std::chrono::seconds(60)));
    REQUIRE(s.mask_state() == Sampler::MaskState::ready);
    std::fill(l.begin(), l.end(), 0.0f);
    l[static_cast<std::size_t>(vocab.id(c))] = 1.0f;
    REQUIRE(s.sample(l).id == vocab.id(c));
  }
  // After "AB": the mask runs out of its budget, on a worker thread, and fails the output.
  s.start_mask(workers);
  REQUIRE(s.wait_mask_until(MaskJob::Clock::now() + std::chrono::seconds(120)));
  CHECK(s.mask_state() == Sampler::MaskState::failed);
  CHECK_THAT(s.failure(), Catch::Contains("work budget") && Catch::Contains("after 2 bytes"));
  // Asking again changes nothing: failed it stays, and no new job starts.
  s.start_mask(workers);
  CHECK(s.mask_state() == Sampler::MaskState::failed);
}

TEST_CASE("a mask job stops when cancelled, and workers going away end theirs", "[sampler]") {
  const Printable vocab;
  const OutputGrammar g = costly_after_ab(vocab);
  grammar::Matcher after_ab(g.grammar);
  REQUIRE(after_ab.accept_bytes("AB"));
  auto job = std::make_shared<MaskJob>(after_ab, std::string(), g.masker);
  std::shared_ptr<MaskJob> queued;
  {
    MaskWorkers workers(1);
    workers.submit(job);
    queued = std::make_shared<MaskJob>(after_ab, std::string(), g.masker);
    workers.submit(queued);  // behind the first, on the one thread
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }  // cancels both and joins
  REQUIRE(job->done());
  CHECK(job->failed());
  CHECK(job->steps() < job->budget());  // stopped by the cancel, not the budget
  REQUIRE(queued->done());
  CHECK(queued->failed());
  CHECK(queued->steps() == 0);  // never started
}

TEST_CASE(
    "a grammar that starts after the thinking's end marker leaves the output free until the "
    "marker, and holds after it",
    "[sampler]") {
  // "x" stands for the end of the thinking here (a reasoning model's "</think>").
  auto p = greedy();
  p.grammar_after = {kX};
  auto s = make(p, R"(root ::= "ab" "c")");
  CHECK_FALSE(s.constrained());
  // Before the marker the model's favourite comes, whatever the grammar says, and an end
  // token is allowed as in a free output.
  CHECK(s.sample(logits(kB)).id == kB);
  CHECK(s.sample(logits(kC)).id == kC);
  CHECK(s.mask_state() == Sampler::MaskState::ready);
  CHECK(s.sample(logits(kX)).id == kX);  // the marker: the grammar holds from the next token
  CHECK(s.constrained());
  CHECK(s.sample(logits(kX, kAB)).id == kAB);  // x is the favourite, the grammar allows "ab"
  CHECK(s.sample(logits(kB, kC)).id == kC);
  CHECK(s.sample(logits(kX)).id == kEos);  // the grammar is done: only its end remains
  SECTION("a marker id outside the vocabulary is refused") {
    auto bad = greedy();
    bad.grammar_after = {kVocab};
    CHECK_FALSE(Sampler::create(bad, {}, {kEos}, kVocab, constraint(R"(root ::= "a")")));
  }
}

TEST_CASE("resumed after any k tokens, a drawn output under a grammar continues as undisturbed",
          "[sampler][resume]") {
  // The matcher is advanced over the resumed tokens' bytes, and the draws are keyed by
  // position: each resume yields the undisturbed output, inside the grammar.
  const std::string gbnf = R"(root ::= "{" [abc]+ ("}" | "x}"))";
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    SamplingParams p = greedy();
    p.temperature = 1.0f;
    p.seed = seed;
    p.min_tokens = 3;
    auto run = [&](Sampler& s) {
      const std::vector<float> flat(kVocab, 0.0f);
      while (s.output().empty() || (s.output().back() != kEos && s.output().size() < 30)) {
        s.sample(flat);
      }
      return s.output();
    };
    auto undisturbed = make(p, gbnf);
    const std::vector<TokenId> reference = run(undisturbed);
    REQUIRE(reference.front() == 5);  // "{"
    for (std::size_t k = 0; k < reference.size(); ++k) {
      INFO("seed " << seed << ", resumed after " << k << " tokens");
      auto resumed = make(p, gbnf);
      REQUIRE(resumed.resume(std::span(reference).first(k)).has_value());
      CHECK(run(resumed) == reference);
      CHECK_FALSE(resumed.grammar_broken());
    }
  }
}
