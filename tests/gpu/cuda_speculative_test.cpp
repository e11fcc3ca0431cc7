// Speculative decoding with a draft model on the GPU (issue 36): the worker loads the draft
// on the device beside the model, and the engine core drives both as the scheduler actor
// would. The outputs are the plain GPU worker's; the model as its own draft has every
// greedy proposal accepted, which shows the draft's cache (its own blocks under the
// model's block ids) and its passes are right. Skips without a device, saying so.
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <vector>

#include "engine/engine_core.hpp"
#include "gpu/gpu_test_support.hpp"
#include "support/small_model.hpp"
#include "worker/worker.hpp"

using namespace troupe;

namespace {

engine::WorkerSpec gpu_spec(const std::string& path, const std::string& draft) {
  engine::WorkerSpec spec;
  spec.model_path = path;
  spec.device = Device::cuda;
  spec.block_size = 16;
  spec.max_model_len = 256;
  spec.max_num_seqs = 8;
  spec.max_num_batched_tokens = 256;
  spec.num_kv_blocks = 96;
  spec.draft_model_path = draft;
  return spec;
}

// Six greedy requests of different lengths run to the end, several at a time.
std::map<engine::SeqId, std::vector<TokenId>> serve(worker::Worker& worker,
                                                    const engine::SchedulerConfig& config,
                                                    engine::SpecDecodeCounters* spec) {
  engine::EngineCore core(config, {2});
  for (engine::SeqId i = 0; i < 6; ++i) {
    engine::CoreRequest request;
    request.id = i;
    for (int k = 0; k < 4 + 5 * static_cast<int>(i); ++k) {
      request.prompt.push_back(static_cast<TokenId>(3 + (i * 37 + k * 11) % 400));
    }
    request.params.max_tokens = 24 + 4 * static_cast<int>(i);
    request.params.ignore_eos = true;
    REQUIRE(core.add(std::move(request)).has_value());
  }
  std::map<engine::SeqId, std::vector<TokenId>> tokens;
  while (auto work = core.next_step()) {
    const auto output = worker.step(*work);
    INFO(output.error.message);
    REQUIRE_FALSE(output.failed);
    for (const auto& u : core.apply(output).updates) {
      if (u.token.id != kNoToken) tokens[u.id].push_back(u.token.id);
    }
  }
  CHECK(core.scheduler().kv_cache().num_free_blocks() == core.scheduler().kv_cache().num_blocks());
  if (spec != nullptr) *spec = core.counters().spec;
  return tokens;
}

}  // namespace

TEST_CASE("a draft model on the GPU: the plain worker's greedy outputs, its own copy accepted",
          "[gpu][speculative]") {
  (void)test::gpu_or_skip();  // skips without a device
  const std::string path = test::write_small_model("cuda-speculative-target");
  const std::string other = test::write_small_model(
      "cuda-speculative-other", [](model::RandomModelSpec& spec) { spec.seed = 99; });
  engine::SchedulerConfig config;
  config.block_size = 16;
  config.num_blocks = 96;
  config.max_model_len = 256;
  config.max_num_seqs = 8;
  config.max_num_batched_tokens = 256;

  auto plain = worker::Worker::load(gpu_spec(path, ""));
  INFO((plain ? std::string() : plain.error().message));
  REQUIRE(plain.has_value());
  const auto expected = serve(**plain, config, nullptr);
  REQUIRE(expected.size() == 6u);
  plain->reset();

  auto spec = config;
  spec.speculation.num_speculative_tokens = 3;
  spec.speculation.draft_model = "draft.gguf";
  spec.speculation.disable_by_batch_size = 64;  // every step proposes
  for (const bool same : {true, false}) {
    INFO((same ? "the model as its own draft" : "another model as the draft"));
    auto drafting = worker::Worker::load(gpu_spec(path, same ? path : other));
    INFO((drafting ? std::string() : drafting.error().message));
    REQUIRE(drafting.has_value());
    CHECK((*drafting)->report().device_name.find("CUDA") != std::string::npos);
    engine::SpecDecodeCounters counters;
    CHECK(serve(**drafting, spec, &counters) == expected);
    CHECK(counters.num_drafts > 0);
    if (same) {
      CHECK(counters.num_accepted_tokens == counters.num_draft_tokens);
    } else {
      CHECK(counters.num_accepted_tokens < counters.num_draft_tokens);
    }
  }
  std::filesystem::remove(path);
  std::filesystem::remove(other);
}
