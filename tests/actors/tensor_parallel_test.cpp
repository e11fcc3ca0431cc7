// Tensor parallelism in one process: each replica's worker a group of ranks (threads of
// this process, Gloo on loopback), through the engine's C++ API.
#include <catch2/catch.hpp>
#include <filesystem>
#include <thread>

#include "actors/cluster/cluster_messages.hpp"
#include "actors/engine_hooks.hpp"
#include "model/random_model.hpp"
#include "support/engine_support.hpp"
#include "support/event_collector.hpp"
#include "support/small_model.hpp"
#include "troupe/engine.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using test::Collector;
using test::greedy;

namespace {

EngineConfig split(std::int32_t replicas, std::int32_t ranks) {
  static const std::string path = test::write_small_model("tensor-parallel-model");
  EngineConfig c = test::small_engine_config(path, 1, 128);
  c.max_model_len = 256;
  c.data_parallel_size = replicas;
  c.tensor_parallel_size = ranks;
  c.collective_timeout = 3s;
  return c;
}

// Request i runs under LoRA adapter i % num_slots (0: the base model).
std::vector<std::vector<TokenId>> run_all(Engine& engine, int count, int max_tokens,
                                          int num_slots = 1) {
  Collector c;
  std::vector<RequestId> ids;
  for (int i = 0; i < count; ++i) {
    std::vector<TokenId> prompt;
    for (int k = 0; k < 5 + i; ++k)
      prompt.push_back(static_cast<TokenId>(1 + (i * 37 + k * 11) % 500));
    GenerateRequest request = greedy(prompt, max_tokens);
    request.lora_adapter = i % num_slots;
    ids.push_back(*engine.submit(std::move(request), c.callback()));
  }
  REQUIRE(c.wait(ids.size()));
  std::vector<std::vector<TokenId>> out;
  for (RequestId id : ids) out.push_back(c.get(id).tokens);
  return out;
}

}  // namespace

TEST_CASE("a model split over local ranks gives one worker's greedy outputs, with replicas too",
          "[actors][tp]") {
  auto whole = Engine::create(split(1, 1));
  REQUIRE(whole.has_value());
  const auto expected = run_all(**whole, 6, 8);
  for (auto [replicas, ranks] : {std::pair{1, 2}, std::pair{2, 2}}) {
    INFO(replicas << " replicas of " << ranks << " ranks");
    auto engine = Engine::create(split(replicas, ranks));
    REQUIRE(engine.has_value());
    CHECK(run_all(**engine, 6, 8) == expected);
    CHECK(test::kv_drains(**engine));
    // The group answers with the blocks every rank holds (here the configured count).
    CHECK((*engine)->stats().num_kv_blocks == replicas * 128);
  }
}

TEST_CASE("LoRA adapters on a split model: each rank its part, one worker's greedy outputs",
          "[actors][tp][lora]") {
  // Two random adapters of every attention and FFN matrix (F32 and F16): the ranks cut B's
  // rows of Q, K, V, gate and up, and A's columns of the output and down projections.
  EngineConfig whole = split(1, 1);
  for (const auto type : {gguf::TensorType::f32, gguf::TensorType::f16}) {
    model::RandomAdapterSpec spec;
    spec.base_path = whole.model_path;
    spec.rank = 8;
    spec.stddev = 0.1f;
    spec.type = type;
    spec.seed = whole.lora_adapters.size() + 1;
    const std::string path =
        test::temp_path("tp-lora-" + std::to_string(whole.lora_adapters.size()) + ".gguf");
    REQUIRE(model::write_random_adapter(spec, path).has_value());
    whole.lora_adapters.push_back(path);
  }
  auto one = Engine::create(whole);
  REQUIRE(one.has_value());
  const auto expected = run_all(**one, 9, 8, 3);
  // The adapters change the outputs (request i and i + 3 share a slot, not a prompt; compare
  // the base model's outputs of the same prompts).
  const auto base = run_all(**one, 9, 8, 1);
  CHECK(expected[1] != base[1]);
  CHECK(expected[2] != base[2]);
  CHECK(expected[0] == base[0]);
  EngineConfig two = split(1, 2);
  two.lora_adapters = whole.lora_adapters;
  auto engine = Engine::create(two);
  REQUIRE(engine.has_value());
  CHECK(run_all(**engine, 9, 8, 3) == expected);
  CHECK(test::kv_drains(**engine));
  for (const auto& path : whole.lora_adapters) std::filesystem::remove(path);
}

TEST_CASE(
    "a draft model beside a split model: rank 0 proposes for every rank, one worker's greedy "
    "outputs",
    "[actors][tp][speculative]") {
  // Rank 0 alone holds the draft model; the other rank takes its proposals over the group,
  // so both verify the same tokens. The model as its own draft has every greedy proposal
  // accepted; another model's are mostly wrong, and the outputs are the same either way.
  auto whole = Engine::create(split(1, 1));
  REQUIRE(whole.has_value());
  const auto expected = run_all(**whole, 6, 16);
  const std::string other = test::write_small_model(
      "tensor-parallel-other-draft", [](model::RandomModelSpec& spec) { spec.seed = 99; });
  for (const bool same : {true, false}) {
    INFO((same ? "the model as its own draft" : "another model as the draft"));
    EngineConfig config = split(1, 2);
    config.speculative.draft_model = same ? config.model_path : other;
    config.speculative.num_speculative_tokens = 3;
    config.speculative.disable_by_batch_size = 64;  // every step proposes
    auto engine = Engine::create(config);
    REQUIRE(engine.has_value());
    CHECK(run_all(**engine, 6, 16) == expected);
    const EngineStats stats = (*engine)->stats();
    test::check_draft_acceptance(stats, same);
    CHECK(test::kv_drains(**engine));
  }
  std::filesystem::remove(other);
}

TEST_CASE("a shape that cannot be split is refused before any worker starts", "[actors][tp]") {
  auto engine = Engine::create(split(1, 3));  // 4 heads
  REQUIRE_FALSE(engine.has_value());
  CHECK(engine.error().message.find("cannot be split over 3 ranks") != std::string::npos);
}

TEST_CASE("one rank's failing step is answered at once, and its requests resume on a new group",
          "[actors][tp]") {
  EngineHooks hooks;
  auto fail_next = std::make_shared<std::atomic<bool>>(false);
  // Only the first rank to step throws: the other waits in its all-reduce, and the group
  // answers the failure without waiting for that rank's timeout.
  hooks.before_step = [fail_next] {
    if (fail_next->exchange(false)) throw std::runtime_error("injected fault");
  };
  auto engine = Engine::create(split(1, 2), hooks);
  REQUIRE(engine.has_value());
  Collector c;
  fail_next->store(true);
  const auto start = std::chrono::steady_clock::now();
  auto failed = (*engine)->submit(greedy({1, 2, 3}, 8), c.callback());
  REQUIRE(c.wait(1));
  CHECK(std::chrono::steady_clock::now() - start < 2s);
  const auto r = c.get(*failed);
  CHECK(r.end->finish_reason == FinishReason::length);  // resumed, not failed
  auto served = (*engine)->submit(greedy({1, 2, 3}, 8), c.callback());
  REQUIRE(c.wait(2));
  CHECK(c.get(*served).end->finish_reason == FinishReason::length);
  CHECK(c.get(*served).tokens.size() == 8);
  CHECK(r.tokens == c.get(*served).tokens);
  CHECK((*engine)->stats().num_worker_restarts == 1);
  CHECK(test::kv_drains(**engine));
}

TEST_CASE("a placement's nodes are named once each, in rank order", "[actors][tp]") {
  using actors::cluster::node_label;
  CHECK(node_label({"n0"}) == "n0");
  CHECK(node_label({"n0", "n0", "n1"}) == "n0,n1");
  // A name inside another is still its own node.
  CHECK(node_label({"n10", "n1", "n10", "n1"}) == "n10,n1");
}
