// Pipeline parallelism in one process, through the engine's C++ API: each replica's layers
// cut into stages (threads of this process, Gloo on loopback), with up to one step a stage
// in flight at once (micro-batches over disjoint sequences).
#include <catch2/catch.hpp>
#include <filesystem>
#include <thread>

#include "actors/engine_hooks.hpp"
#include "model/random_model.hpp"
#include "monitoring/metrics.hpp"
#include "support/engine_support.hpp"
#include "support/event_collector.hpp"
#include "support/small_model.hpp"
#include "troupe/engine.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using test::Collector;

namespace {

// `stages` pipeline stages (1: the unsplit model), `in_flight` steps at once (0: one a stage).
EngineConfig pipelined(std::int32_t stages, std::int32_t in_flight = 0) {
  static const std::string path = test::write_small_model("pipeline-microbatch-model");
  EngineConfig c = test::small_engine_config(path, 1, 128);
  c.max_model_len = 256;
  c.pipeline_parallel_size = stages;
  c.pipeline_steps_in_flight = in_flight;
  c.collective_timeout = 3s;
  return c;
}

// Request i: a prompt of 3 + i % 9 tokens and up to 6 + (i * 5) % 17 tokens, greedy, or
// seeded sampling for every third.
GenerateRequest request_of(int i) {
  std::vector<TokenId> prompt;
  for (int k = 0; k < 3 + i % 9; ++k) {
    prompt.push_back(static_cast<TokenId>(1 + (i * 37 + k * 11) % 500));
  }
  GenerateRequest r = test::greedy(std::move(prompt), 6 + (i * 5) % 17);
  if (i % 3 == 2) {
    r.params.temperature = 0.8f;
    r.params.seed = 1000 + static_cast<std::uint64_t>(i);
  }
  return r;
}

constexpr int kRequests = 16;

// Submits every request at once; `cancel_after(i)` > 0 cancels request i once it has that
// many tokens. Each request's tokens.
std::vector<std::vector<TokenId>> run_all(Engine& engine,
                                          const std::vector<int>& cancel_after = {}) {
  Collector c;
  std::vector<RequestId> ids;
  for (int i = 0; i < kRequests; ++i) {
    ids.push_back(*engine.submit(request_of(i), c.callback()));
  }
  for (std::size_t i = 0; i < cancel_after.size() && i < ids.size(); ++i) {
    if (cancel_after[i] <= 0) continue;
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (c.num_tokens(ids[i]) < static_cast<std::size_t>(cancel_after[i]) && !c.get(ids[i]).end &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(1ms);
    }
    engine.cancel(ids[i]);
  }
  REQUIRE(c.wait(ids.size()));
  std::vector<std::vector<TokenId>> out;
  for (RequestId id : ids) out.push_back(c.get(id).tokens);
  return out;
}

// Submits `requests` at once; each one's tokens.
std::vector<std::vector<TokenId>> outputs_of(Engine& engine,
                                             std::vector<GenerateRequest> requests) {
  Collector c;
  std::vector<RequestId> ids;
  for (auto& r : requests) ids.push_back(*engine.submit(std::move(r), c.callback()));
  REQUIRE(c.wait(ids.size()));
  std::vector<std::vector<TokenId>> out;
  for (RequestId id : ids) out.push_back(c.get(id).tokens);
  return out;
}

const std::vector<std::vector<TokenId>>& unsplit_outputs() {
  static const auto expected = [] {
    auto whole = Engine::create(pipelined(1));
    REQUIRE(whole.has_value());
    return run_all(**whole);
  }();
  return expected;
}

// `stages` stages of two tensor-parallel ranks each (1: the model split over two ranks).
EngineConfig split_stages(std::int32_t stages) {
  EngineConfig c = pipelined(stages);
  c.tensor_parallel_size = 2;
  return c;
}

// run_all's outputs from the model split over two ranks, unstaged: a pipeline of such
// stages adds its sums in the same order, and gives these bits.
const std::vector<std::vector<TokenId>>& split_outputs() {
  static const auto expected = [] {
    auto split = Engine::create(split_stages(1));
    REQUIRE(split.has_value());
    return run_all(**split);
  }();
  return expected;
}

}  // namespace

TEST_CASE(
    "a pipelined replica with one step a stage in flight gives the unsplit model's outputs, "
    "greedy and seeded",
    "[actors][pp]") {
  const auto& expected = unsplit_outputs();
  for (auto [stages, in_flight] : {std::pair{2, 0}, std::pair{2, 1}, std::pair{2, 3}}) {
    INFO(stages << " stages, " << in_flight << " steps in flight (0: one a stage)");
    auto engine = Engine::create(pipelined(stages, in_flight));
    REQUIRE(engine.has_value());
    CHECK(run_all(**engine) == expected);
    CHECK(run_all(**engine) == expected);  // again, beside what the first run left cached
    CHECK(test::kv_drains(**engine));
    CHECK((*engine)->stats().num_worker_restarts == 0);
  }
}

TEST_CASE("requests cancelled midway under two steps in flight leave the others' outputs whole",
          "[actors][pp]") {
  const auto& expected = unsplit_outputs();
  auto engine = Engine::create(pipelined(2));
  REQUIRE(engine.has_value());
  // Every fourth request is cancelled after a few tokens, the others run out.
  std::vector<int> cancel_after(kRequests, 0);
  for (int i = 0; i < kRequests; i += 4) cancel_after[static_cast<std::size_t>(i)] = 2 + i % 3;
  const auto got = run_all(**engine, cancel_after);
  for (int i = 0; i < kRequests; ++i) {
    INFO("request " << i);
    const auto& want = expected[static_cast<std::size_t>(i)];
    const auto& have = got[static_cast<std::size_t>(i)];
    if (cancel_after[static_cast<std::size_t>(i)] > 0) {
      // What it streamed before its cancel is the start of its whole output.
      REQUIRE(have.size() <= want.size());
      CHECK(std::equal(have.begin(), have.end(), want.begin()));
    } else {
      CHECK(have == want);
    }
  }
  CHECK(test::kv_drains(**engine));
  // The engine goes on serving, whole, after the cancels.
  CHECK(run_all(**engine) == expected);
  CHECK(test::kv_drains(**engine));
}

TEST_CASE("a stage failing with two steps in flight: both are lost, and their requests resume",
          "[actors][pp]") {
  const auto& expected = unsplit_outputs();
  EngineHooks hooks;
  auto calls = std::make_shared<std::atomic<int>>(0);
  // The 9th stage step to begin throws (a few steps in, while two are in flight).
  hooks.before_step = [calls] {
    if (calls->fetch_add(1) == 8) throw std::runtime_error("injected fault");
  };
  auto engine = Engine::create(pipelined(2), hooks);
  REQUIRE(engine.has_value());
  CHECK(run_all(**engine) == expected);
  CHECK((*engine)->stats().num_worker_restarts == 1);
  CHECK(test::kv_drains(**engine));
}

TEST_CASE("n-gram speculation on a pipeline with two steps in flight keeps the greedy outputs",
          "[actors][pp][speculative]") {
  // Prompts that repeat themselves, so that the n-grams find proposals; greedy only.
  const auto run = [](Engine& engine) {
    std::vector<GenerateRequest> requests;
    for (int i = 0; i < 8; ++i) {
      std::vector<TokenId> prompt;
      for (int k = 0; k < 12 + i; ++k) prompt.push_back(static_cast<TokenId>(5 + (i + k) % 4));
      requests.push_back(test::greedy(std::move(prompt), 12 + i));
    }
    return outputs_of(engine, std::move(requests));
  };
  auto whole = Engine::create(pipelined(1));
  REQUIRE(whole.has_value());
  const auto expected = run(**whole);
  EngineConfig config = pipelined(2);
  config.speculative.num_speculative_tokens = 3;
  config.speculative.prompt_lookup_max = 3;
  config.speculative.disable_by_batch_size = 64;  // every step proposes
  auto engine = Engine::create(config);
  REQUIRE(engine.has_value());
  CHECK(run(**engine) == expected);
  CHECK((*engine)->stats().spec_num_drafts > 0);
  CHECK(test::kv_drains(**engine));
}

TEST_CASE(
    "a draft model beside a pipeline: stage 0 proposes, the last stage verifies, the unsplit "
    "model's greedy outputs",
    "[actors][pp][speculative]") {
  // Stage 0 alone holds the draft model (it embeds the tokens) and sends its proposals to
  // the last stage, which verifies them, before the step's hidden states. The model as its
  // own draft has every greedy proposal accepted; another model's are mostly wrong; the
  // outputs are the same either way, with one step a stage in flight.
  const auto run = [](Engine& engine) {
    std::vector<GenerateRequest> requests;
    for (int i = 0; i < 6; ++i) {
      std::vector<TokenId> prompt;
      for (int k = 0; k < 3 + i; ++k) prompt.push_back(static_cast<TokenId>(7 + i * 31 + k * 5));
      requests.push_back(test::greedy(std::move(prompt), 14 + i));
    }
    return outputs_of(engine, std::move(requests));
  };
  // Three layers, so that three stages have one each.
  const std::string target = test::write_small_model(
      "pipeline-draft-target", [](model::RandomModelSpec& spec) { spec.num_layers = 3; });
  const std::string other =
      test::write_small_model("pipeline-other-draft", [](model::RandomModelSpec& spec) {
        spec.num_layers = 3;
        spec.seed = 99;
      });
  const auto config_of = [&](std::int32_t stages) {
    EngineConfig c = pipelined(stages);
    c.model_path = target;
    return c;
  };
  auto whole = Engine::create(config_of(1));
  REQUIRE(whole.has_value());
  const auto expected = run(**whole);
  for (const std::int32_t stages : {2, 3}) {
    for (const bool same : {true, false}) {
      INFO(stages << " stages, " << (same ? "the model as its own draft" : "another model"));
      EngineConfig config = config_of(stages);
      config.speculative.draft_model = same ? target : other;
      config.speculative.num_speculative_tokens = 3;
      config.speculative.disable_by_batch_size = 64;  // every step proposes
      auto engine = Engine::create(config);
      INFO((engine ? std::string() : engine.error().message));
      REQUIRE(engine.has_value());
      CHECK(run(**engine) == expected);
      const EngineStats stats = (*engine)->stats();
      test::check_draft_acceptance(stats, same);
      CHECK(test::kv_drains(**engine));
      CHECK(stats.num_worker_restarts == 0);
    }
  }
  std::filesystem::remove(target);
  std::filesystem::remove(other);
}

TEST_CASE(
    "a pipeline whose stages are tensor-parallel groups (PP 2 x TP 2) gives the split model's "
    "outputs, drafts included",
    "[actors][pp][tp]") {
  // Four workers: stage 0's two ranks, then stage 1's. The all-reduces add in the same
  // order as an unstaged group of two ranks, so the outputs (greedy and seeded) are its
  // bits, and the greedy ones the unsplit model's.
  const auto& expected = split_outputs();
  for (int i = 0; i < kRequests; ++i) {
    if (i % 3 != 2) CHECK(expected[static_cast<std::size_t>(i)] == unsplit_outputs()[i]);
  }
  for (auto [stages, in_flight] : {std::pair{2, 0}, std::pair{2, 1}}) {
    INFO(stages << " stages, " << in_flight << " steps in flight (0: one a stage)");
    EngineConfig config = split_stages(stages);
    config.pipeline_steps_in_flight = in_flight;
    config.metrics = std::make_shared<monitoring::Metrics>();
    auto engine = Engine::create(config);
    INFO((engine ? std::string() : engine.error().message));
    REQUIRE(engine.has_value());
    CHECK(run_all(**engine) == expected);
    CHECK(run_all(**engine) == expected);
    CHECK(test::kv_drains(**engine));
    const EngineStats stats = (*engine)->stats();
    CHECK(stats.num_worker_restarts == 0);
    CHECK(stats.num_kv_blocks == 128);
    // One hop a step: stage 1's rank 0's (its rank 1's is the same step's).
    const std::string text = config.metrics->serialize();
    const auto at = text.find("\ntroupe_pipeline_hop_seconds_count{");
    REQUIRE(at != std::string::npos);
    CHECK(std::stod(text.substr(text.find("} ", at) + 2)) == static_cast<double>(stats.num_steps));
  }
  // The model as its own draft (greedy requests: every proposal accepted): stage 0's rank 0
  // proposes, its rank 1 takes the proposals over the stage's group (both embed them), and
  // each passes them on to its peer of the last stage, past a middle stage that is a group
  // too (three layers: three stages of one).
  const std::string target = test::write_small_model(
      "pipeline-tp-draft-target", [](model::RandomModelSpec& spec) { spec.num_layers = 3; });
  const auto greedy_requests = [] {
    std::vector<GenerateRequest> requests;
    for (int i = 0; i < 8; ++i) {
      GenerateRequest r = request_of(i);
      r.params.temperature = 0.0f;
      requests.push_back(std::move(r));
    }
    return requests;
  };
  EngineConfig unstaged = split_stages(1);
  unstaged.model_path = target;
  auto reference = Engine::create(unstaged);
  REQUIRE(reference.has_value());
  const auto greedy_expected = outputs_of(**reference, greedy_requests());
  for (const std::int32_t stages : {2, 3}) {
    INFO(stages << " stages of two ranks, a draft model");
    EngineConfig config = split_stages(stages);
    config.model_path = target;
    config.speculative.draft_model = target;
    config.speculative.num_speculative_tokens = 3;
    config.speculative.disable_by_batch_size = 64;  // every step proposes
    auto drafted = Engine::create(config);
    INFO((drafted ? std::string() : drafted.error().message));
    REQUIRE(drafted.has_value());
    CHECK(outputs_of(**drafted, greedy_requests()) == greedy_expected);
    test::check_draft_acceptance((*drafted)->stats(), true);
    CHECK(test::kv_drains(**drafted));
    CHECK((*drafted)->stats().num_worker_restarts == 0);
  }
  std::filesystem::remove(target);
}

TEST_CASE(
    "a rank of a stage that is a group failing: the whole pipeline is replaced, and its "
    "requests resume with the same outputs",
    "[actors][pp][tp]") {
  const auto& expected = split_outputs();
  EngineHooks hooks;
  auto calls = std::make_shared<std::atomic<int>>(0);
  // The 15th worker step to begin throws (a few steps in): its stage's other rank and the
  // other stage's ranks wait on it in their collectives; the group answers the failure at
  // once, ends all four, and a new pipeline of four takes the requests back.
  hooks.before_step = [calls] {
    if (calls->fetch_add(1) == 14) throw std::runtime_error("injected fault");
  };
  auto engine = Engine::create(split_stages(2), hooks);
  REQUIRE(engine.has_value());
  CHECK(run_all(**engine) == expected);
  CHECK((*engine)->stats().num_worker_restarts == 1);
  CHECK(test::kv_drains(**engine));
}

TEST_CASE(
    "LoRA adapters on pipeline stages, and on stages that are groups: each worker its layers' "
    "part, the unstaged model's outputs",
    "[actors][pp][tp][lora]") {
  // Two random adapters of every attention and FFN matrix: a stage keeps its layers' pairs
  // (by the file's layer number); a rank of a stage also cuts them as a split model does.
  std::vector<std::string> adapters;
  for (const auto type : {gguf::TensorType::f32, gguf::TensorType::f16}) {
    model::RandomAdapterSpec spec;
    spec.base_path = pipelined(1).model_path;
    spec.rank = 8;
    spec.stddev = 0.1f;
    spec.type = type;
    spec.seed = adapters.size() + 1;
    const std::string path =
        test::temp_path("pp-lora-" + std::to_string(adapters.size()) + ".gguf");
    REQUIRE(model::write_random_adapter(spec, path).has_value());
    adapters.push_back(path);
  }
  // Request i under adapter i % 3 (0: the base model), greedy or seeded.
  const auto run = [](Engine& engine) {
    std::vector<GenerateRequest> requests;
    for (int i = 0; i < 9; ++i) {
      GenerateRequest r = request_of(i);
      r.lora_adapter = i % 3;
      requests.push_back(std::move(r));
    }
    return outputs_of(engine, std::move(requests));
  };
  for (const std::int32_t ranks : {1, 2}) {
    INFO(ranks << " rank(s) a stage");
    EngineConfig unstaged = pipelined(1);
    unstaged.tensor_parallel_size = ranks;
    unstaged.lora_adapters = adapters;
    auto reference = Engine::create(unstaged);
    REQUIRE(reference.has_value());
    const auto expected = run(**reference);
    if (ranks == 1) {  // the adapters change the outputs (request 1's adapter 1, 2's 2)
      const auto& base = unsplit_outputs();
      CHECK(expected[0] == base[0]);
      CHECK(expected[1] != base[1]);
      CHECK(expected[2] != base[2]);
    }
    EngineConfig staged = unstaged;
    staged.pipeline_parallel_size = 2;
    auto engine = Engine::create(staged);
    INFO((engine ? std::string() : engine.error().message));
    REQUIRE(engine.has_value());
    CHECK(run(**engine) == expected);
    CHECK(test::kv_drains(**engine));
  }
  for (const auto& path : adapters) std::filesystem::remove(path);
}

namespace {

// A metric's value in the exposition ("name{model_name=\"troupe\"} value"), or -1.
double metric_value(const std::string& text, const std::string& name) {
  const auto at = text.find("\n" + name + "{");
  if (at == std::string::npos) return -1;
  const auto value = text.find("} ", at);
  return value == std::string::npos ? -1 : std::stod(text.substr(value + 2));
}

}  // namespace

TEST_CASE("a pipelined replica times each step's hop into its second stage",
          "[actors][pp][monitoring]") {
  EngineConfig config = pipelined(2);
  config.metrics = std::make_shared<monitoring::Metrics>();
  auto engine = Engine::create(config);
  REQUIRE(engine.has_value());
  run_all(**engine);
  // Asked first: the scheduler records a step's hops after it delivered its tokens.
  const auto num_steps = static_cast<double>((*engine)->stats().num_steps);
  const std::string text = config.metrics->serialize();
  INFO(text.substr(text.find("troupe_pipeline_hop_seconds")));
  // One hop a step (two stages), each a moment: Gloo on loopback.
  const double count = metric_value(text, "troupe_pipeline_hop_seconds_count");
  CHECK(count > 0);
  CHECK(count == num_steps);
  const double sum = metric_value(text, "troupe_pipeline_hop_seconds_sum");
  CHECK(sum > 0);
  CHECK(sum / count < 1.0);
  // An unsplit replica has no hop.
  EngineConfig whole_config = pipelined(1);
  whole_config.metrics = std::make_shared<monitoring::Metrics>();
  auto whole = Engine::create(whole_config);
  REQUIRE(whole.has_value());
  run_all(**whole);
  CHECK((*whole)->stats().num_steps > 0);
  CHECK(metric_value(whole_config.metrics->serialize(), "troupe_pipeline_hop_seconds_count") == 0);
}
