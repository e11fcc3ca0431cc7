// Speculative decoding inside continuous batching (issue 36): the n-gram proposer, the
// scheduler's drafts and their rollback in the paged KV cache, and exactness: an output
// with n-gram proposals verified in the step is the output without them, alone and in a
// batch beside plain decodes and prefill chunks, greedy or seeded.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>

#include "cpu/cpu_backend.hpp"
#include "engine/engine_core.hpp"
#include "engine/ngram_proposer.hpp"
#include "engine/step_builder.hpp"
#include "gguf/gguf_file.hpp"
#include "model/model_runner.hpp"
#include "support/small_model.hpp"
#include "support/test_support.hpp"
#include "worker/worker.hpp"

using namespace troupe;
using engine::propose_ngram;

TEST_CASE("the n-gram proposer proposes what followed the latest earlier occurrence of the suffix",
          "[engine][speculative]") {
  const std::vector<TokenId> t = {1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3};
  // "1 2 3" last came before "7 8": the latest occurrence wins.
  CHECK(propose_ngram(t, 1, 3, 2) == std::vector<TokenId>{7, 8});
  // Running past the end, the proposal repeats itself ("7 8 1 2 3" then "7 ...").
  CHECK(propose_ngram(t, 3, 3, 6) == std::vector<TokenId>{7, 8, 1, 2, 3, 7});
  // No recurring suffix: nothing.
  CHECK(propose_ngram(std::vector<TokenId>{1, 2, 3, 4}, 1, 3, 4).empty());
  // The suffix must be at least min_n long: "4" recurs, "3 4" does not.
  const std::vector<TokenId> u = {4, 5, 6, 3, 4};
  CHECK(propose_ngram(u, 1, 2, 2) == std::vector<TokenId>{5, 6});
  CHECK(propose_ngram(u, 2, 2, 2).empty());
  CHECK(propose_ngram(u, 1, 2, 0).empty());
  CHECK(propose_ngram(std::vector<TokenId>{}, 1, 2, 3).empty());
  CHECK(propose_ngram(std::vector<TokenId>{5}, 1, 2, 3).empty());
  // A run of one token proposes more of it.
  CHECK(propose_ngram(std::vector<TokenId>{7, 7, 7}, 1, 2, 3) == std::vector<TokenId>{7, 7, 7});
}

namespace {

engine::SchedulerConfig spec_config(std::int32_t k) {
  engine::SchedulerConfig c;
  c.block_size = 4;
  c.num_blocks = 32;
  c.max_model_len = 128;
  c.max_num_batched_tokens = 64;
  c.speculation.num_speculative_tokens = k;
  c.speculation.prompt_lookup_max = 3;
  c.speculation.prompt_lookup_min = 1;
  return c;
}

// Every cached block's tokens are a prefix of `tokens` in whole blocks.
bool cache_holds_only(const engine::Scheduler& s, const std::vector<TokenId>& tokens) {
  const auto& cache = s.kv_cache().prefix_cache();
  const auto matched = static_cast<std::int32_t>(
      cache.match(tokens, static_cast<std::int32_t>(tokens.size()) / 4).size());
  return static_cast<std::int32_t>(cache.size()) == matched;
}

}  // namespace

TEST_CASE(
    "a rejected draft's blocks go back to the pool and none of its tokens enters the prefix "
    "cache",
    "[engine][speculative]") {
  engine::Scheduler s(spec_config(6));
  // A prompt that repeats "1 2 3 4 5 6 7": the proposer will offer its continuation.
  const std::vector<TokenId> prompt = {1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3};
  REQUIRE(s.add({1, prompt, 40}).has_value());
  auto plan = s.schedule();
  REQUIRE(plan.chunks.size() == 1);
  REQUIRE(plan.num_draft_tokens == 0);  // a prefill carries no draft
  std::vector<engine::SampledResult> first = {{4}};
  s.update(plan, first);  // tokens: prompt + 4 (computed 17 of 18)
  REQUIRE(s.check_invariants().has_value());

  plan = s.schedule();
  REQUIRE(plan.chunks.size() == 1);
  const auto& chunk = plan.chunks[0];
  // The suffix "3 4" was followed by "5 6 7 1 2 3": six proposed tokens, 1 + 6 to run.
  REQUIRE(chunk.draft == std::vector<TokenId>{5, 6, 7, 1, 2, 3});
  CHECK(chunk.num_new_tokens == 7);
  CHECK(chunk.is_decode());
  CHECK(plan.num_tokens == 7);  // the budget counts the draft
  CHECK(plan.num_draft_tokens == 6);
  const engine::Sequence* seq = s.find(1);
  // 17 computed + 7 = 24 positions: 6 blocks of 4.
  CHECK(seq->block_table.size() == 6);
  const std::int32_t free_before = s.kv_cache().num_free_blocks();

  // The model agrees with "5 6" and then says 9 where the draft said 7.
  std::vector<engine::SampledResult> verified = {{5, {6, 9}}};
  CHECK(s.update(plan, verified).empty());
  REQUIRE(s.check_invariants().has_value());
  seq = s.find(1);
  std::vector<TokenId> expected = prompt;
  for (TokenId t : {4, 5, 6, 9}) expected.push_back(t);
  CHECK(seq->tokens == expected);
  CHECK(seq->num_computed_tokens == static_cast<std::int32_t>(expected.size()) - 1);
  // 21 tokens: the 6 blocks held keep them, the rejected slots of "1 2 3" included
  // (the next tokens overwrite them before anything reads them).
  CHECK(seq->block_table.size() == 6);
  CHECK(s.kv_cache().num_free_blocks() == free_before);
  // Blocks in the cache: only whole blocks of computed (accepted) tokens.
  CHECK(cache_holds_only(s, expected));
  CHECK(s.kv_cache().prefix_cache().size() ==
        static_cast<std::size_t>(seq->num_computed_tokens / 4));

  // Next: the proposal after "6 9"? "9" never came before: the suffix "9" has no match,
  // "6 9" neither: a plain decode.
  plan = s.schedule();
  REQUIRE(plan.chunks.size() == 1);
  CHECK(plan.chunks[0].draft.empty());
  CHECK(plan.chunks[0].num_new_tokens == 1);
  std::vector<engine::SampledResult> plain = {{1}};
  s.update(plan, plain);
  // "9 1" no, "1" yes: after the last "1" came "2 3 4 ...".
  plan = s.schedule();
  REQUIRE(plan.chunks.size() == 1);
  REQUIRE(plan.chunks[0].draft.size() == 6);
  const std::int32_t held = static_cast<std::int32_t>(s.find(1)->block_table.size());
  // Everything rejected: the model's first token is not the draft's first.
  std::vector<engine::SampledResult> rejected = {{8}};
  s.update(plan, rejected);
  REQUIRE(s.check_invariants().has_value());
  seq = s.find(1);
  CHECK(seq->tokens.back() == 8);
  CHECK(static_cast<std::int32_t>(seq->block_table.size()) == (seq->num_tokens() + 3) / 4);
  CHECK(static_cast<std::int32_t>(seq->block_table.size()) < held);  // the draft's blocks freed
  CHECK(cache_holds_only(s, seq->tokens));
  CHECK(s.kv_cache().prefix_cache().size() ==
        static_cast<std::size_t>(seq->num_computed_tokens / 4));

  // At the end nothing is held: every block is free.
  s.abort(1);
  CHECK(s.kv_cache().num_free_blocks() == s.kv_cache().num_blocks());
  REQUIRE(s.check_invariants().has_value());
}

TEST_CASE(
    "a draft never proposes past max_tokens or the context, and a stop token ends the "
    "sequence at its place",
    "[engine][speculative]") {
  engine::Scheduler s(spec_config(8));
  const std::vector<TokenId> prompt = {1, 2, 3, 1, 2, 3, 1, 2};
  SamplingParams p;
  p.stop_token_ids = {30};
  p.ignore_eos = true;
  REQUIRE(s.add({1, prompt, 4, 0, engine::StopRule(p, {})}).has_value());
  auto plan = s.schedule();
  std::vector<engine::SampledResult> first = {{3}};
  s.update(plan, first);
  plan = s.schedule();
  REQUIRE(plan.chunks.size() == 1);
  // 1 generated, max_tokens 4: the draft is at most 2 (its last token's own is the 4th).
  CHECK(plan.chunks[0].draft.size() == 2);
  // The model agrees with the draft "1 2" and adds 30 (a stop id): three tokens, the last
  // ends it.
  std::vector<engine::SampledResult> verified = {{1, {2, 30}}};
  const auto finished = s.update(plan, verified);
  REQUIRE(finished.size() == 1);
  CHECK(finished[0].reason == FinishReason::stop);
  CHECK(finished[0].num_tokens == static_cast<std::int32_t>(prompt.size()) + 4);
  CHECK(s.kv_cache().num_free_blocks() == s.kv_cache().num_blocks());

  // A stop token in the middle of accepted tokens: the tokens after it are dropped.
  REQUIRE(s.add({2, prompt, 10, 0, engine::StopRule(p, {})}).has_value());
  plan = s.schedule();
  s.update(plan, first);
  plan = s.schedule();
  REQUIRE_FALSE(plan.chunks[0].draft.empty());
  std::vector<engine::SampledResult> stopped = {{30, {1, 2}}};
  const auto ended = s.update(plan, stopped);
  REQUIRE(ended.size() == 1);
  CHECK(ended[0].num_tokens == static_cast<std::int32_t>(prompt.size()) + 2);
  CHECK(s.kv_cache().num_free_blocks() == s.kv_cache().num_blocks());
}

TEST_CASE("no draft in a step with more decoding sequences than disable_by_batch_size",
          "[engine][speculative]") {
  auto config = spec_config(3);
  config.speculation.disable_by_batch_size = 2;
  engine::Scheduler s(config);
  const std::vector<TokenId> prompt = {1, 2, 3, 1, 2, 3, 1, 2};
  for (engine::SeqId id = 1; id <= 3; ++id) REQUIRE(s.add({id, prompt, 20}).has_value());
  auto plan = s.schedule();
  std::vector<engine::SampledResult> tokens(3, {3});
  s.update(plan, tokens);
  plan = s.schedule();  // three decodes: above 2
  REQUIRE(plan.chunks.size() == 3);
  CHECK(plan.num_draft_tokens == 0);
  s.update(plan, tokens);
  s.abort(3);
  plan = s.schedule();  // two: at the threshold, drafts again
  CHECK(plan.num_draft_tokens > 0);
}

TEST_CASE("no draft while sequences waiting push the count past disable_by_batch_size",
          "[engine][speculative]") {
  // A burst's first request decodes alone while the others queue (here: no seat for them).
  // It gets no draft while the queue is long: those prompts will make the steps
  // compute-bound, and a draft would take their budget.
  auto config = spec_config(3);
  config.speculation.disable_by_batch_size = 2;
  config.max_num_seqs = 1;
  engine::Scheduler s(config);
  const std::vector<TokenId> prompt = {1, 2, 3, 1, 2, 3, 1, 2};
  for (engine::SeqId id = 1; id <= 3; ++id) REQUIRE(s.add({id, prompt, 20}).has_value());
  auto plan = s.schedule();
  REQUIRE(plan.chunks.size() == 1);
  std::vector<engine::SampledResult> token(1, {3});
  s.update(plan, token);
  plan = s.schedule();  // one decoding, two waiting: three, above 2
  REQUIRE(plan.chunks.size() == 1);
  CHECK(plan.chunks[0].is_decode());
  CHECK(plan.num_draft_tokens == 0);
  s.update(plan, token);
  s.abort(3);
  plan = s.schedule();  // one decoding, one waiting: at the threshold, drafts again
  REQUIRE(plan.chunks.size() == 1);
  CHECK(plan.num_draft_tokens > 0);
}

namespace {

struct Request {
  std::vector<TokenId> prompt;
  SamplingParams params;
};

struct Served {
  std::map<engine::SeqId, std::vector<TokenId>> tokens;
  std::map<engine::SeqId, std::vector<float>> logprobs;
  engine::SpecDecodeCounters spec;
  std::int64_t num_preemptions = 0;
};

// The engine loop, synchronously: the engine core plans, a local worker step runs.
Served serve(model::ModelRunner& runner, const engine::SchedulerConfig& config,
             const std::vector<Request>& requests, bool staggered = false,
             model::DraftProposer* draft = nullptr) {
  engine::EngineCore core(config, {2});
  Served out;
  std::size_t next = 0;
  auto add = [&](std::size_t i) {
    REQUIRE(core.add({i, requests[i].prompt, requests[i].params, 0, {}}).has_value());
  };
  // Staggered: a request arrives every other step, so prefills run beside decodes.
  if (!staggered) {
    for (; next < requests.size(); ++next) add(next);
  }
  std::size_t steps = 0;
  while (core.has_work() || next < requests.size()) {
    if (staggered && next < requests.size() && steps % 2 == 0) add(next++);
    ++steps;
    const auto work = core.next_step();
    if (!work) continue;
    if (!config.speculation.uses_draft_model()) REQUIRE(work->drafts.empty());
    const auto output = worker::run_step(runner, *work, draft);
    INFO(output.error.message);
    REQUIRE_FALSE(output.failed);
    for (const auto& update : core.apply(output).updates) {
      if (update.token.id == kNoToken) continue;
      out.tokens[update.id].push_back(update.token.id);
      out.logprobs[update.id].push_back(update.token.logprob);
    }
    REQUIRE(core.scheduler().check_invariants().has_value());
  }
  CHECK(core.scheduler().kv_cache().num_free_blocks() == core.scheduler().kv_cache().num_blocks());
  out.spec = core.counters().spec;
  out.num_preemptions = core.scheduler().num_preemptions();
  return out;
}

// Twelve requests of every kind a verification must keep exact: greedy, seeded sampling,
// penalties and an early stop id; some prompts repeat themselves.
std::vector<Request> mixed_requests() {
  std::mt19937 rng(11);
  std::vector<Request> requests(12);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    Request& r = requests[i];
    const int n = 2 + static_cast<int>(rng() % 30);
    for (int k = 0; k < n; ++k) r.prompt.push_back(3 + static_cast<TokenId>(rng() % 60));
    // Some prompts repeat themselves: their lookups hit at once.
    if (i % 3 == 0) {
      const auto half = r.prompt;
      r.prompt.insert(r.prompt.end(), half.begin(), half.end());
    }
    r.params.max_tokens = 20 + static_cast<int>(rng() % 40);
    r.params.ignore_eos = true;
    r.params.logprobs = 0;
    switch (i % 4) {
      case 0:
        r.params.temperature = 0.0f;
        break;  // greedy
      case 1:   // seeded sampling
        r.params.temperature = 0.8f;
        r.params.top_p = 0.9f;
        r.params.seed = 500 + i;
        break;
      case 2:  // greedy with penalties
        r.params.temperature = 0.0f;
        r.params.frequency_penalty = 0.3f;
        r.params.repetition_penalty = 1.1f;
        break;
      default:  // greedy with an early stop id
        r.params.temperature = 0.0f;
        r.params.stop_token_ids = {static_cast<TokenId>(3 + i)};
        break;
    }
  }
  return requests;
}

// The small model a test verifies with: its file, a KV cache of kBlocks blocks of
// kBlockSize tokens, a runner, and the scheduler settings without speculation that the
// reference outputs run under. The file goes with it.
struct Target {
  static constexpr std::int32_t kBlockSize = 4, kBlocks = 160;

  explicit Target(const std::string& name)
      : path(test::write_small_model(name)),
        file(gguf::GgufFile::open(path).value()),
        llama(model::LlamaModel::load(file, backend).value()) {
    REQUIRE(backend.allocate_kv_cache({2, kBlocks, kBlockSize, 2, 16}).has_value());
    plain.block_size = kBlockSize;
    plain.num_blocks = kBlocks;
    plain.max_model_len = 256;
    plain.max_num_batched_tokens = 48;
    plain.max_num_seqs = 16;
  }
  ~Target() { std::filesystem::remove(path); }

  std::string path;
  gguf::GgufFile file;
  cpu::CpuBackend backend{2};
  model::LlamaModel llama;
  model::ModelRunner runner{llama, {2}};
  engine::SchedulerConfig plain;
};

}  // namespace

TEST_CASE("outputs with n-gram speculation are the outputs without it, alone and in a mixed batch",
          "[engine][speculative]") {
  Target target("speculative");
  model::ModelRunner& runner = target.runner;
  const std::vector<Request> requests = mixed_requests();
  const engine::SchedulerConfig& plain = target.plain;
  auto spec = plain;
  spec.speculation.num_speculative_tokens = 4;
  spec.speculation.prompt_lookup_max = 3;
  spec.speculation.prompt_lookup_min = 1;
  spec.speculation.disable_by_batch_size = 64;  // every step speculates

  // Alone, without speculation: the reference.
  std::map<engine::SeqId, std::vector<TokenId>> reference;
  std::map<engine::SeqId, std::vector<float>> reference_logprobs;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const auto out = serve(runner, plain, {requests[i]});
    reference[i] = out.tokens.at(0);
    reference_logprobs[i] = out.logprobs.at(0);
  }
  SECTION("alone") {
    engine::SpecDecodeCounters total;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      INFO("request " << i);
      const auto out = serve(runner, spec, {requests[i]});
      CHECK(out.tokens.at(0) == reference.at(i));
      CHECK(out.logprobs.at(0) == reference_logprobs.at(i));
      total.num_drafts += out.spec.num_drafts;
      total.num_accepted_tokens += out.spec.num_accepted_tokens;
    }
    // Speculation did happen, and some of it was right.
    CHECK(total.num_drafts > 10);
    CHECK(total.num_accepted_tokens > 10);
  }
  SECTION("in a batch beside prefill chunks") {
    const auto out = serve(runner, spec, requests, /*staggered=*/true);
    for (std::size_t i = 0; i < requests.size(); ++i) {
      INFO("request " << i);
      CHECK(out.tokens.at(i) == reference.at(i));
      CHECK(out.logprobs.at(i) == reference_logprobs.at(i));
    }
    CHECK(out.spec.num_drafts > 10);
    CHECK(out.spec.num_accepted_tokens > 10);
    // Accepted at position i+1 never outnumber those at position i.
    for (std::size_t p = 1; p < out.spec.num_accepted_tokens_per_pos.size(); ++p) {
      CHECK(out.spec.num_accepted_tokens_per_pos[p] <= out.spec.num_accepted_tokens_per_pos[p - 1]);
    }
  }
  SECTION("in a pool too small for all of them: preemptions, recomputes and the prefix cache") {
    auto tight = spec;
    tight.num_blocks = 40;
    tight.max_num_batched_tokens = 24;
    tight.enable_prefix_caching = true;
    const auto out = serve(runner, tight, requests, /*staggered=*/false);
    for (std::size_t i = 0; i < requests.size(); ++i) {
      INFO("request " << i);
      CHECK(out.tokens.at(i) == reference.at(i));
    }
    CHECK(out.num_preemptions > 0);
    CHECK(out.spec.num_accepted_tokens > 0);
  }
  SECTION("in a batch where only some speculate") {
    // The threshold turns speculation off while more than two sequences decode.
    auto some = spec;
    some.speculation.disable_by_batch_size = 3;
    // Near their ends as most are when the batch falls to 2, they catch up all the same.
    some.draft_catch_up_repay = 0;
    const auto out = serve(runner, some, requests, /*staggered=*/true);
    for (std::size_t i = 0; i < requests.size(); ++i) {
      INFO("request " << i);
      CHECK(out.tokens.at(i) == reference.at(i));
    }
    // Speculation did run (while few decoded), so the equality above covers it.
    CHECK(out.spec.num_drafts > 0);
    CHECK(out.spec.num_accepted_tokens > 0);
  }
}

TEST_CASE("drafts count in the token budget but never crowd out another decode of the step",
          "[engine][speculative]") {
  auto config = spec_config(4);
  engine::Scheduler s(config);
  const std::vector<TokenId> prompt = {1, 2, 3, 1, 2, 3, 1, 2};
  for (engine::SeqId id = 1; id <= 3; ++id) REQUIRE(s.add({id, prompt, 20}).has_value());
  auto plan = s.schedule();
  std::vector<engine::SampledResult> tokens(3, {3});
  s.update(plan, tokens);
  s.set_token_budget(5);
  plan = s.schedule();
  // Three decodes in a budget of 5: two tokens are left for drafts, and every decode runs.
  REQUIRE(plan.chunks.size() == 3);
  CHECK(plan.num_tokens == 5);
  CHECK(plan.num_draft_tokens == 2);
  CHECK(plan.num_decodes == 3);
  REQUIRE(s.check_invariants().has_value());
}

namespace {

// A model's own copy on a backend of its own, with a KV cache of `num_blocks` blocks: a
// draft model as a worker holds one.
struct DraftModel {
  gguf::GgufFile file;
  cpu::CpuBackend backend{2};
  model::LlamaModel llama;
  model::DraftProposer proposer{llama};

  static std::unique_ptr<DraftModel> load(const std::string& path, std::int32_t num_blocks,
                                          std::int32_t block_size) {
    auto file = gguf::GgufFile::open(path);
    REQUIRE(file.has_value());
    auto d = std::unique_ptr<DraftModel>(new DraftModel(std::move(*file)));
    REQUIRE(d->backend.allocate_kv_cache({2, num_blocks, block_size, 2, 16}).has_value());
    return d;
  }

 private:
  explicit DraftModel(gguf::GgufFile f)
      : file(std::move(f)), llama(model::LlamaModel::load(file, backend).value()) {}
};

}  // namespace

TEST_CASE(
    "outputs with a draft model's proposals are the outputs without them, whether the draft is "
    "good or bad",
    "[engine][speculative]") {
  Target target("speculative-target");
  // The other draft: the same shape and vocabulary, other weights, so it is mostly wrong.
  const std::string other_path = test::write_small_model(
      "speculative-other", [](model::RandomModelSpec& spec) { spec.seed = 99; });
  model::ModelRunner& runner = target.runner;
  const std::vector<Request> requests = mixed_requests();
  const engine::SchedulerConfig& plain = target.plain;
  std::map<engine::SeqId, std::vector<TokenId>> reference;
  std::map<engine::SeqId, std::vector<float>> reference_logprobs;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const auto out = serve(runner, plain, {requests[i]});
    reference[i] = out.tokens.at(0);
    reference_logprobs[i] = out.logprobs.at(0);
  }
  auto spec = plain;
  spec.speculation.num_speculative_tokens = 4;
  spec.speculation.draft_model = "draft.gguf";
  spec.speculation.disable_by_batch_size = 64;

  const bool same = GENERATE(true, false);
  INFO((same ? "the model as its own draft" : "another model as the draft"));
  auto draft =
      DraftModel::load(same ? target.path : other_path, Target::kBlocks, Target::kBlockSize);

  auto check = [&](const Served& out) {
    for (std::size_t i = 0; i < requests.size(); ++i) {
      INFO("request " << i);
      CHECK(out.tokens.at(i) == reference.at(i));
      CHECK(out.logprobs.at(i) == reference_logprobs.at(i));
    }
    // Another model's drafts are mostly wrong: its proposals pause after a few.
    CHECK(out.spec.num_drafts > (same ? 10 : 0));
    if (same) CHECK(out.spec.num_accepted_tokens > 10);
  };
  SECTION("alone") {
    int drafted = 0;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      INFO("request " << i);
      const auto out = serve(runner, spec, {requests[i]}, false, &draft->proposer);
      CHECK(out.tokens.at(0) == reference.at(i));
      CHECK(out.logprobs.at(0) == reference_logprobs.at(i));
      // Its own copy proposes the model's greedy tokens: a greedy request without
      // penalties (which the draft does not apply) accepts every one.
      const SamplingParams& p = requests[i].params;
      // A prompt too long for its output to repay catching the draft up gets none.
      const bool repays = static_cast<std::int32_t>(requests[i].prompt.size()) <=
                          spec.draft_catch_up_repay * (p.max_tokens - 1);
      if (!repays) CHECK(out.spec.num_drafts == 0);
      if (same && repays && p.temperature == 0.0f && p.frequency_penalty == 0.0f &&
          p.repetition_penalty == 1.0f) {
        CHECK(out.spec.num_drafts > 0);
        CHECK(out.spec.num_accepted_tokens == out.spec.num_draft_tokens);
        ++drafted;
      }
    }
    CHECK(drafted >= (same ? 2 : 0));
  }
  SECTION("in a batch beside prefill chunks") {
    check(serve(runner, spec, requests, /*staggered=*/true, &draft->proposer));
  }
  SECTION("in a batch where only some speculate, so the draft falls behind and catches up") {
    auto some = spec;
    some.speculation.disable_by_batch_size = 3;
    // Near their ends as most are when the batch falls to 2, they catch up all the same.
    some.draft_catch_up_repay = 0;
    check(serve(runner, some, requests, /*staggered=*/true, &draft->proposer));
  }
  SECTION(
      "greedy requests only, in a batch beside prefills and in a tight pool with the prefix "
      "cache: its own copy has every proposal accepted") {
    if (!same) return;
    // Acceptance shows the draft's cache is right: a draft that ran wrong positions, blocks
    // or tokens (multi-sequence passes, catching up after a preemption, on prefix-cached
    // blocks) would propose other tokens than the model's.
    std::vector<Request> greedy;
    for (const Request& r : requests) {
      const SamplingParams& p = r.params;
      if (p.temperature == 0.0f && p.frequency_penalty == 0.0f && p.repetition_penalty == 1.0f) {
        greedy.push_back(r);
      }
    }
    // Each twice: the second finds the first's prompt in the prefix cache.
    const std::size_t n = greedy.size();
    for (std::size_t i = 0; i < n; ++i) greedy.push_back(greedy[i]);
    auto tight = spec;
    tight.num_blocks = 40;
    tight.max_num_batched_tokens = 24;
    tight.enable_prefix_caching = true;
    for (const bool staggered : {true, false}) {
      const Served out =
          serve(runner, staggered ? spec : tight, greedy, staggered, &draft->proposer);
      INFO((staggered ? "staggered" : "tight pool"));
      CHECK(out.spec.num_drafts > 10);
      CHECK(out.spec.num_accepted_tokens == out.spec.num_draft_tokens);
      if (!staggered) CHECK(out.num_preemptions > 0);
    }
  }
  SECTION("in a pool too small for all of them: preemptions, recomputes and the prefix cache") {
    auto tight = spec;
    tight.num_blocks = 40;
    tight.max_num_batched_tokens = 24;
    tight.enable_prefix_caching = true;
    Served out = serve(runner, tight, requests, /*staggered=*/false, &draft->proposer);
    for (std::size_t i = 0; i < requests.size(); ++i) {
      INFO("request " << i);
      CHECK(out.tokens.at(i) == reference.at(i));
    }
    CHECK(out.num_preemptions > 0);
    CHECK(out.spec.num_drafts > 0);
  }
  std::filesystem::remove(other_path);
}

TEST_CASE(
    "with a draft model, a decode runs the tokens the draft has not seen first, within the "
    "budget, and a preemption makes it see them again",
    "[engine][speculative]") {
  auto config = spec_config(3);
  config.speculation.draft_model = "draft.gguf";
  engine::Scheduler s(config);
  const std::vector<TokenId> prompt = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
  REQUIRE(s.add({1, prompt, 30}).has_value());
  auto plan = s.schedule();
  REQUIRE(plan.chunks.size() == 1);
  CHECK_FALSE(plan.chunks[0].runs_draft_model());  // a prefill proposes nothing
  std::vector<engine::SampledResult> first = {{20}};
  s.update(plan, first);  // 11 tokens, 10 computed; the draft has seen none

  // A budget too small for the unseen 10 and a proposal: it catches up 7 of them (the
  // decode's own token is the eighth), proposing nothing.
  s.set_token_budget(8);
  plan = s.schedule();
  REQUIRE(plan.chunks.size() == 1);
  CHECK(plan.chunks[0].draft.empty());
  CHECK(plan.chunks[0].draft_from == 0);
  CHECK(plan.chunks[0].draft_to == 7);
  CHECK(plan.num_catch_up_tokens == 7);
  std::vector<model::DraftWork> drafts;
  std::vector<engine::SeqId> sampled;
  std::vector<std::int32_t> num_drafts;
  auto step = engine::build_step_input(plan, s, &sampled, nullptr, &num_drafts, &drafts);
  REQUIRE(drafts.size() == 1);
  CHECK(drafts[0].tokens == std::vector<TokenId>{5, 6, 7, 8, 9, 10, 11});
  CHECK(drafts[0].num_proposals == 0);
  std::vector<engine::SampledResult> next = {{21}};
  s.update(plan, next);
  CHECK(s.find(1)->num_draft_computed == 7);

  // Room now: the rest of the unseen tokens, the last one, then 3 placeholders.
  s.set_token_budget(64);
  plan = s.schedule();
  REQUIRE(plan.chunks.size() == 1);
  const auto& chunk = plan.chunks[0];
  CHECK(chunk.draft.size() == 3);
  CHECK(chunk.num_new_tokens == 4);
  CHECK(chunk.draft_from == 7);
  CHECK(chunk.draft_to == 12);  // through the last token, position 11
  CHECK(plan.num_catch_up_tokens == 4);
  step = engine::build_step_input(plan, s, &sampled, nullptr, &num_drafts, &drafts);
  REQUIRE(drafts.size() == 1);
  CHECK(drafts[0].first_position == 7);
  CHECK(drafts[0].tokens == std::vector<TokenId>{12, 13, 14, 20, 21});
  CHECK(drafts[0].num_proposals == 3);
  CHECK(drafts[0].seq == 0);
  REQUIRE(num_drafts == std::vector<std::int32_t>{3});
  // All three accepted, and the model's own: the draft ran through the second proposal.
  std::vector<engine::SampledResult> all = {{30, {31, 32, 33}}};
  s.update(plan, all);
  const engine::Sequence* seq = s.find(1);
  CHECK(seq->num_computed_tokens == 15);
  CHECK(seq->num_draft_computed == 14);
  // One accepted: the draft has seen what the model has.
  plan = s.schedule();
  REQUIRE(plan.chunks[0].draft.size() == 3);
  CHECK(plan.chunks[0].draft_from == 14);
  std::vector<engine::SampledResult> one = {{40, {41}}};
  s.update(plan, one);
  CHECK(s.find(1)->num_draft_computed == s.find(1)->num_computed_tokens);
  REQUIRE(s.check_invariants().has_value());

  // A preemption loses the draft's cache with the model's.
  s.reset_kv_cache();
  CHECK(s.find(1)->num_draft_computed == 0);
  CHECK(s.find(1)->num_computed_tokens == 0);
}

TEST_CASE(
    "a sequence whose drafts are mostly rejected pauses its proposals, longer each time, and "
    "one whose drafts are good keeps them",
    "[engine][speculative]") {
  auto config = spec_config(3);
  config.max_model_len = 512;
  config.num_blocks = 160;
  engine::Scheduler s(config);
  const std::vector<TokenId> prompt = {1, 2, 3, 1, 2, 3, 1, 2};
  REQUIRE(s.add({1, prompt, 400}).has_value());
  auto plan = s.schedule();
  std::vector<engine::SampledResult> first = {{3}};
  s.update(plan, first);
  // The tokens go on "1 2 3 1 2 3 ...", so the lookup always proposes; every draft is
  // rejected (no token after the first) or, later, all accepted.
  TokenId next = 1;
  auto step = [&](bool accept) {
    plan = s.schedule();
    REQUIRE(plan.chunks.size() == 1);
    const bool drafted = !plan.chunks[0].draft.empty();
    std::vector<engine::SampledResult> result = {{next}};
    next = next % 3 + 1;
    if (drafted && accept) {
      for (std::size_t i = 0; i < plan.chunks[0].draft.size(); ++i) {
        result[0].more.push_back(next);
        next = next % 3 + 1;
      }
    }
    s.update(plan, result);
    return drafted;
  };
  // Four rejected drafts bring the average (from 1, weight 0.3) under 30%: 0.7, 0.49,
  // 0.34, 0.24.
  for (int i = 0; i < 4; ++i) CHECK(step(false));
  for (int i = 0; i < engine::Scheduler::kFirstDraftPause; ++i) CHECK_FALSE(step(false));
  // It tries again from 0.5: two more rejections (0.35, 0.245) pause it twice as long.
  CHECK(step(false));
  CHECK(step(false));
  for (int i = 0; i < 2 * engine::Scheduler::kFirstDraftPause; ++i) CHECK_FALSE(step(false));
  // Good drafts from then on: proposals in every step.
  for (int i = 0; i < 10; ++i) CHECK(step(true));
  CHECK(s.find(1)->draft_backoff == 0);
  REQUIRE(s.check_invariants().has_value());
}

namespace {

// Pearson's chi-square statistic of two samples' counts over the same categories, with
// categories of fewer than 10 expected observations pooled; `df` receives the degrees of
// freedom.
double chi_square(const std::map<TokenId, int>& a, const std::map<TokenId, int>& b, int* df) {
  std::map<TokenId, std::pair<double, double>> cells;
  double na = 0, nb = 0;
  for (const auto& [t, n] : a) cells[t].first += n, na += n;
  for (const auto& [t, n] : b) cells[t].second += n, nb += n;
  std::vector<std::pair<double, double>> pooled;
  std::pair<double, double> rest{0, 0};
  for (const auto& [t, c] : cells) {
    if ((c.first + c.second) * std::min(na, nb) / (na + nb) < 10) {
      rest.first += c.first, rest.second += c.second;
    } else {
      pooled.push_back(c);
    }
  }
  if (rest.first + rest.second > 0) pooled.push_back(rest);
  double chi = 0;
  for (const auto& [x, y] : pooled) {
    const double total = x + y;
    const double ex = total * na / (na + nb), ey = total * nb / (na + nb);
    chi += (x - ex) * (x - ex) / ex + (y - ey) * (y - ey) / ey;
  }
  *df = static_cast<int>(pooled.size()) - 1;
  return chi;
}

// The chi-square distribution's quantile with `df` degrees of freedom at the upper tail
// probability whose normal quantile is `z` (Wilson and Hilferty's approximation).
double chi_square_quantile(int df, double z) {
  const double k = df, h = 2.0 / (9.0 * k);
  return k * std::pow(1.0 - h + z * std::sqrt(h), 3.0);
}

}  // namespace

TEST_CASE(
    "sampled tokens with speculation follow the distribution of sampling without it (a "
    "chi-square test over many seeds)",
    "[engine][speculative]") {
  // A model whose next token spreads over a few likely ones: tokens at each output position
  // of 1500 seeded requests, with a draft model and with n-gram proposals, against 1500
  // plain requests with other seeds. Exactness is shown elsewhere token for token under
  // the same seed; this shows the verification does not bias the draws (e.g. accepting a
  // proposal without drawing), which the same-seed tests could miss if both paths shared
  // a bias.
  const std::string path = test::write_small_model(
      "speculative-chi", [](model::RandomModelSpec& spec) { spec.stddev = 0.05f; });
  auto file = gguf::GgufFile::open(path);
  REQUIRE(file.has_value());
  cpu::CpuBackend backend(2);
  auto llama = model::LlamaModel::load(*file, backend);
  REQUIRE(llama.has_value());
  const std::int32_t block_size = 4, num_blocks = 1200;
  REQUIRE(backend.allocate_kv_cache({2, num_blocks, block_size, 2, 16}).has_value());
  model::ModelRunner runner(*llama, {2});
  auto draft = DraftModel::load(path, num_blocks, block_size);

  constexpr int kRequests = 1500, kTokens = 5;
  auto requests = [&](std::uint64_t first_seed) {
    std::vector<Request> out(kRequests);
    for (int i = 0; i < kRequests; ++i) {
      // A prompt that repeats itself, so the n-gram proposer proposes too.
      out[i].prompt = {7, 8, 9, 10, 7, 8, 9, 10};
      out[i].params.max_tokens = kTokens;
      out[i].params.ignore_eos = true;
      out[i].params.temperature = 1.0f;
      out[i].params.top_k = 6;
      out[i].params.seed = first_seed + static_cast<std::uint64_t>(i);
    }
    return out;
  };
  engine::SchedulerConfig plain;
  plain.block_size = block_size;
  plain.num_blocks = num_blocks;
  plain.max_model_len = 64;
  plain.max_num_batched_tokens = 2048;
  plain.max_num_seqs = 128;
  plain.enable_prefix_caching = false;
  auto histograms = [&](const Served& served) {
    std::vector<std::map<TokenId, int>> h(kTokens);
    for (const auto& [id, tokens] : served.tokens) {
      REQUIRE(tokens.size() == static_cast<std::size_t>(kTokens));
      for (int p = 0; p < kTokens; ++p) ++h[p][tokens[p]];
    }
    return h;
  };
  const auto reference = histograms(serve(runner, plain, requests(1)));
  const bool with_draft = GENERATE(true, false);
  INFO((with_draft ? "a draft model" : "n-gram proposals"));
  auto spec = plain;
  spec.speculation.num_speculative_tokens = 3;
  spec.speculation.disable_by_batch_size = 1 << 20;
  spec.speculation.draft_model = with_draft ? "draft.gguf" : "";
  spec.speculation.prompt_lookup_max = 3;
  spec.speculation.prompt_lookup_min = 1;
  const Served served =
      serve(runner, spec, requests(1000000), false, with_draft ? &draft->proposer : nullptr);
  CHECK(served.spec.num_accepted_tokens > 200);  // verification did run, and accept
  const auto speculative = histograms(served);
  for (int p = 1; p < kTokens; ++p) {
    int df = 0;
    const double chi = chi_square(reference[p], speculative[p], &df);
    INFO("output position " << p << ": chi-square " << chi << " with " << df
                            << " degrees of freedom");
    REQUIRE(df >= 3);  // the draws do spread over several tokens
    // p = 0.0001 upper tail (z = 3.72): a true equality fails it once in 10000 runs, and
    // these seeds are fixed.
    CHECK(chi < chi_square_quantile(df, 3.72));
  }
  std::filesystem::remove(path);
}

TEST_CASE("a draft model proposes nothing past its own context length", "[engine][speculative]") {
  auto config = spec_config(3);
  config.speculation.draft_model = "draft.gguf";
  config.speculation.draft_context_length = 20;  // the model's own context is longer
  engine::Scheduler s(config);
  REQUIRE(s.add({1, {5, 6, 7, 8, 9, 10, 11, 12, 13, 14}, 40}).has_value());
  auto plan = s.schedule();
  std::vector<engine::SampledResult> first = {{20}};
  s.update(plan, first);  // 11 tokens
  std::vector<engine::SampledResult> all = {{30, {31, 32, 33}}};
  for (const std::int32_t length : {15, 19}) {  // three proposals a step, all accepted
    plan = s.schedule();
    REQUIRE(plan.chunks.size() == 1);
    CHECK(plan.chunks[0].draft.size() == 3);
    s.update(plan, all);
    CHECK(s.find(1)->num_tokens() == length);
  }
  // 19 tokens: one proposal more stays inside the draft's 20 positions.
  plan = s.schedule();
  CHECK(plan.chunks[0].draft.size() == 1);
  std::vector<engine::SampledResult> one = {{40, {41}}};
  s.update(plan, one);
  // 21 tokens: past the draft's context, plain decodes from here on.
  std::vector<engine::SampledResult> plain = {{50}};
  for (int i = 0; i < 3; ++i) {
    plan = s.schedule();
    REQUIRE(plan.chunks.size() == 1);
    CHECK(plan.chunks[0].draft.empty());
    CHECK_FALSE(plan.chunks[0].runs_draft_model());
    CHECK(plan.chunks[0].num_new_tokens == 1);
    s.update(plan, plain);
  }
  CHECK(s.find(1)->num_tokens() == 24);
  REQUIRE(s.check_invariants().has_value());
}

TEST_CASE("while prompts wait, a draft model catches up by a quarter of the budget at most",
          "[engine][speculative]") {
  auto config = spec_config(3);
  config.speculation.draft_model = "draft.gguf";
  config.num_blocks = 64;
  engine::Scheduler s(config);
  REQUIRE(s.add({1, {5, 6, 7, 8, 9, 10, 11, 12, 13, 14}, 30}).has_value());
  auto plan = s.schedule();
  std::vector<engine::SampledResult> first = {{20}};
  s.update(plan, first);  // the draft has seen none of its 11 tokens
  std::vector<TokenId> long_prompt(40, 3);
  REQUIRE(s.add({2, long_prompt, 4}).has_value());
  s.set_token_budget(16);
  plan = s.schedule();
  REQUIRE(plan.chunks.size() == 2);
  // The decode catches its draft up by 4 (16 / 4), proposing nothing; the prompt gets the
  // other 11 tokens of the step.
  CHECK(plan.chunks[0].id == 1);
  CHECK(plan.chunks[0].draft.empty());
  CHECK(plan.chunks[0].draft_to - plan.chunks[0].draft_from == 4);
  CHECK(plan.chunks[1].id == 2);
  CHECK(plan.chunks[1].num_new_tokens == 11);
}

TEST_CASE("a draft model does not catch up a sequence too near its end to repay it",
          "[engine][speculative]") {
  // Catching up n unseen tokens needs n / draft_catch_up_repay tokens left: the tail
  // of a batch, where few decodes are left and each has a long text the draft has not
  // seen, decodes plainly instead of paying for a catch-up it never gets back.
  const std::vector<TokenId> prompt(20, 3);
  for (const std::int32_t max_tokens : {6, 12}) {
    INFO("max_tokens " << max_tokens);
    auto config = spec_config(2);
    config.speculation.draft_model = "draft.gguf";
    engine::Scheduler s(config);
    REQUIRE(s.add({1, prompt, max_tokens}).has_value());
    auto plan = s.schedule();
    std::vector<engine::SampledResult> first = {{20}};
    s.update(plan, first);  // 21 tokens, the draft has seen none: 20 to catch up
    plan = s.schedule();
    REQUIRE(plan.chunks.size() == 1);
    const auto& chunk = plan.chunks[0];
    const bool repays = 20 <= config.draft_catch_up_repay * (max_tokens - 1);
    CHECK(repays == (max_tokens == 12));
    CHECK(chunk.runs_draft_model() == repays);
    CHECK(chunk.draft.size() == (repays ? 2u : 0u));
    CHECK(chunk.num_new_tokens == (repays ? 3 : 1));
    CHECK(plan.num_catch_up_tokens == (repays ? 20 : 0));
    REQUIRE(s.check_invariants().has_value());
  }
}
