// A request's output does not depend on what it was batched with, on how its
// prompt was chunked, or on being preempted and recomputed: 64 concurrent
// requests of mixed lengths, in a KV pool small enough to force preemptions,
// give exactly what each gives alone.
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <random>

#include "cpu/cpu_backend.hpp"
#include "engine/engine_core.hpp"
#include "gguf/gguf_file.hpp"
#include "model/model_runner.hpp"
#include "support/small_model.hpp"
#include "worker/worker.hpp"

using namespace troupe;

namespace {

struct Request {
  std::vector<TokenId> prompt;
  SamplingParams params;
};

// The engine loop, synchronously: the engine core plans, a local worker step runs.
std::map<engine::SeqId, std::vector<TokenId>> serve(model::ModelRunner& runner,
                                                    const engine::SchedulerConfig& config,
                                                    const std::vector<Request>& requests,
                                                    std::int64_t* preemptions = nullptr) {
  engine::EngineCore core(config, {2});
  std::map<engine::SeqId, std::vector<TokenId>> outputs;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    REQUIRE(core.add({i, requests[i].prompt, requests[i].params, 0, {}}).has_value());
  }
  while (core.has_work()) {
    const auto work = core.next_step();
    REQUIRE(work.has_value());
    const auto output = worker::run_step(runner, *work);
    REQUIRE_FALSE(output.failed);
    for (const auto& update : core.apply(output).updates) {
      if (update.token.id != kNoToken) outputs[update.id].push_back(update.token.id);
    }
    REQUIRE(core.scheduler().check_invariants().has_value());
  }
  if (preemptions != nullptr) *preemptions = core.scheduler().num_preemptions();
  return outputs;
}

}  // namespace

TEST_CASE("64 concurrent requests give exactly the outputs each gives alone",
          "[engine][determinism]") {
  const std::string path = test::write_small_model("determinism");
  auto file = gguf::GgufFile::open(path);
  REQUIRE(file.has_value());
  cpu::CpuBackend backend(2);
  auto llama = model::LlamaModel::load(*file, backend);
  REQUIRE(llama.has_value());
  const std::int32_t block_size = 4, num_blocks = 96;
  REQUIRE(backend.allocate_kv_cache({2, num_blocks, block_size, 2, 16}).has_value());
  model::ModelRunner runner(*llama, {2});

  std::mt19937 rng(5);
  std::vector<Request> requests(64);
  const std::vector<TokenId> shared_prefix = {5, 6, 7, 8, 9, 10, 11, 12, 13};
  for (std::size_t i = 0; i < requests.size(); ++i) {
    Request& r = requests[i];
    if (i % 3 == 0) r.prompt = shared_prefix;  // some share a prefix: cache hits too
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int k = 0; k < n; ++k) r.prompt.push_back(3 + static_cast<TokenId>(rng() % 500));
    r.params.max_tokens = 1 + static_cast<int>(rng() % 24);
    r.params.ignore_eos = true;
    if (i % 2 == 0) {
      r.params.temperature = 0.0f;  // greedy
    } else {
      r.params.temperature = 0.9f;  // seeded sampling
      r.params.top_p = 0.95f;
      r.params.seed = 1000 + i;
    }
  }

  // Alone: one request at a time, a roomy pool, whole prompts in one step.
  engine::SchedulerConfig alone_config;
  alone_config.block_size = block_size;
  alone_config.num_blocks = num_blocks;
  alone_config.max_model_len = 256;
  alone_config.max_num_batched_tokens = 256;
  alone_config.enable_prefix_caching = false;
  std::map<engine::SeqId, std::vector<TokenId>> alone;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const auto out = serve(runner, alone_config, {requests[i]});
    alone[i] = out.at(0);
  }
  // Together: a small token budget (chunked prefill), a pool far too small for all
  // of them (preemption by recompute), the prefix cache on.
  engine::SchedulerConfig together_config = alone_config;
  together_config.num_blocks = 40;
  together_config.max_num_batched_tokens = 24;
  together_config.max_num_seqs = 64;
  together_config.enable_prefix_caching = true;
  std::int64_t preemptions = 0;
  const auto together = serve(runner, together_config, requests, &preemptions);
  CHECK(preemptions > 0);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    INFO("request " << i);
    CHECK(together.at(i) == alone.at(i));
    CHECK(static_cast<int>(together.at(i).size()) == requests[i].params.max_tokens);
  }
  std::filesystem::remove(path);
}
