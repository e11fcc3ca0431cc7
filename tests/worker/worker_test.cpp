// A worker speaks only the protocol: a spec in, a load report out; a step's work in,
// its output out. The engine core drives it here as the scheduler actor would.
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <stdexcept>

#include "engine/engine_core.hpp"
#include "gguf/gguf_file.hpp"
#include "model/loaded_model.hpp"
#include "support/mini_json.hpp"
#include "support/small_model.hpp"
#include "support/test_support.hpp"
#include "worker/worker.hpp"

using namespace troupe;

namespace {

engine::WorkerSpec cpu_spec(const std::string& path) {
  engine::WorkerSpec spec;
  spec.model_path = path;
  spec.num_threads = 1;
  spec.block_size = 4;
  spec.max_model_len = 128;
  spec.max_num_seqs = 8;
  spec.max_num_batched_tokens = 64;
  spec.kv_cache_bytes = 64 * 2048;  // 64 blocks: K and V x 2 layers x 2 heads x 16 dims x 4 slots
  return spec;
}

std::string fingerprint_of(const std::string& path) {
  auto file = gguf::GgufFile::open(path);
  REQUIRE(file.has_value());
  return model::file_fingerprint(*file);
}

}  // namespace

TEST_CASE("a worker loads from a spec and reports what it holds", "[worker]") {
  const auto path = test::write_small_model("worker-load");
  auto spec = cpu_spec(path);
  spec.model_fingerprint = fingerprint_of(path);
  auto worker = worker::Worker::load(spec);
  INFO((worker ? std::string() : worker.error().message));
  REQUIRE(worker.has_value());
  const auto& report = (*worker)->report();
  // K and V, layers, heads, dims, slots, in F16 (--kv-cache-dtype auto).
  CHECK(report.bytes_per_block == 2 * 2 * 2 * 16 * 4 * 2);
  CHECK(report.num_kv_blocks == 128);
  CHECK(report.vocab_size == 512);
  CHECK(report.device_name.find("CPU") != std::string::npos);
  // F32 keys and values take twice the bytes: half the blocks in the same budget.
  spec.kv_cache_dtype = KvCacheDtype::f32;
  auto exact = worker::Worker::load(spec);
  REQUIRE(exact.has_value());
  CHECK((*exact)->report().bytes_per_block == 2 * 2 * 2 * 16 * 4 * 4);
  CHECK((*exact)->report().num_kv_blocks == 64);
  std::filesystem::remove(path);
}

TEST_CASE("a worker refuses a file that is not the engine's, and a pool too small", "[worker]") {
  const auto path = test::write_small_model("worker-mine");
  const auto other = test::write_small_model("worker-other", [](model::RandomModelSpec& s) {
    s.seed = 12345;  // same shape, other weights
  });
  auto spec = cpu_spec(path);
  spec.model_fingerprint = fingerprint_of(other);
  CHECK(fingerprint_of(path) != fingerprint_of(other));
  auto worker = worker::Worker::load(spec);
  REQUIRE_FALSE(worker.has_value());
  CHECK(worker.error().code == ErrorCode::invalid_file);
  CHECK(worker.error().message.find("is not the engine's model file") != std::string::npos);
  spec.num_kv_blocks = 2;  // cannot hold one sequence of 128 tokens
  spec.model_fingerprint.clear();
  auto small = worker::Worker::load(spec);
  REQUIRE_FALSE(small.has_value());
  CHECK(small.error().message.find("cannot hold one sequence") != std::string::npos);
  std::filesystem::remove(path);
  std::filesystem::remove(other);
}

TEST_CASE("a worker checks its draft model file against the head's as it does the model's",
          "[worker][speculative]") {
  const auto path = test::write_small_model("worker-draft-model");
  const auto draft = test::write_small_model("worker-draft", [](model::RandomModelSpec& s) {
    s.seed = 777;  // the same vocabulary and shape, other weights
  });
  auto spec = cpu_spec(path);
  spec.model_fingerprint = fingerprint_of(path);
  spec.draft_model_path = draft;
  spec.draft_model_fingerprint = fingerprint_of(draft);
  auto same = worker::Worker::load(spec);
  INFO((same ? std::string() : same.error().message));
  CHECK(same.has_value());
  spec.draft_model_fingerprint = fingerprint_of(path);  // the head's draft is another file
  auto other = worker::Worker::load(spec);
  REQUIRE_FALSE(other.has_value());
  CHECK(other.error().code == ErrorCode::invalid_file);
  const std::string& message = other.error().message;
  CHECK(message.find("the draft model: " + draft + " is not the engine's model file") !=
        std::string::npos);
  CHECK(message.find(fingerprint_of(draft)) != std::string::npos);
  CHECK(message.find(fingerprint_of(path)) != std::string::npos);
  std::filesystem::remove(path);
  std::filesystem::remove(draft);
}

TEST_CASE("a worker runs the engine core's steps, a step that throws loses the worker",
          "[worker]") {
  const auto path = test::write_small_model("worker-steps");
  auto worker = worker::Worker::load(cpu_spec(path));
  REQUIRE(worker.has_value());
  engine::SchedulerConfig config;
  config.num_blocks = (*worker)->report().num_kv_blocks;
  config.block_size = 4;
  config.max_model_len = 128;
  engine::EngineCore core(config, {});
  engine::CoreRequest request;
  request.id = 1;
  request.prompt = {5, 6, 7, 8, 9};
  request.params.temperature = 0.0f;
  request.params.max_tokens = 6;
  request.params.ignore_eos = true;
  REQUIRE(core.add(request).has_value());
  int tokens = 0;
  FinishReason end = FinishReason::none;
  while (auto work = core.next_step()) {
    const auto output = (*worker)->step(*work);
    REQUIRE_FALSE(output.failed);
    CHECK(output.seconds >= 0.0);
    for (const auto& u : core.apply(output).updates) {
      if (u.token.id != kNoToken) ++tokens;
      if (u.finish_reason != FinishReason::none) end = u.finish_reason;
    }
  }
  CHECK(tokens == 6);
  CHECK(end == FinishReason::length);

  (*worker)->set_before_step([] { throw std::runtime_error("injected fault"); });
  request.id = 2;
  REQUIRE(core.add(request).has_value());
  auto work = core.next_step();
  REQUIRE(work.has_value());
  const auto output = (*worker)->step(*work);
  CHECK(output.failed);
  CHECK(output.error.fatal);
  CHECK(output.error.message.find("injected fault") != std::string::npos);
  CHECK(core.apply(output).worker_lost);
  std::filesystem::remove(path);
}

TEST_CASE("a worker asked to calibrate times a prefill and a decode and leaves no trace",
          "[worker]") {
  const auto path = test::write_small_model("worker-calibrate");
  // Greedy tokens of two requests run to the end on a worker.
  auto generate = [&path](bool calibrate) {
    auto spec = cpu_spec(path);
    spec.calibrate_step_cost = calibrate;
    auto worker = worker::Worker::load(spec);
    REQUIRE(worker.has_value());
    engine::SchedulerConfig config;
    config.num_blocks = (*worker)->report().num_kv_blocks;
    config.block_size = 4;
    config.max_model_len = 128;
    engine::EngineCore core(config, {});
    for (engine::SeqId id = 1; id <= 2; ++id) {
      engine::CoreRequest request;
      request.id = id;
      request.prompt = {5, 6, 7, static_cast<TokenId>(8 + id)};
      request.params.temperature = 0.0f;
      request.params.max_tokens = 8;
      request.params.ignore_eos = true;
      REQUIRE(core.add(request).has_value());
    }
    std::vector<TokenId> tokens;
    while (auto work = core.next_step()) {
      for (const auto& u : core.apply((*worker)->step(*work)).updates) tokens.push_back(u.token.id);
    }
    return std::pair{(*worker)->report().step_costs, tokens};
  };
  const auto [costs, tokens] = generate(true);
  REQUIRE(costs.size() == 2u);
  CHECK(costs[0].num_tokens == 64);  // max_num_batched_tokens: a step the worker can hold
  CHECK(costs[0].num_decodes == 0);
  CHECK(costs[0].seconds > 0.0);
  CHECK(costs[1].num_tokens == 1);
  CHECK(costs[1].num_decodes == 1);
  CHECK(costs[1].seconds > 0.0);
  const auto [no_costs, same_tokens] = generate(false);
  CHECK(no_costs.empty());
  CHECK(tokens == same_tokens);
  std::filesystem::remove(path);
}

TEST_CASE("a worker attaches its spec's LoRA adapters in order, each request runs with its own",
          "[worker][lora][shared]") {
  const auto base = test::shared_file("models/archs/llama.gguf");
  const auto lora = [](const std::string& name) {
    return test::shared_file("models/lora/" + name + ".gguf");
  };
  auto spec = cpu_spec(base);
  spec.max_model_len = 512;
  spec.kv_cache_bytes = std::int64_t{16} << 20;
  spec.kv_cache_dtype = KvCacheDtype::f32;
  spec.lora_adapters = {lora("llama-attn-r8"), lora("llama-all-r16")};
  auto worker = worker::Worker::load(spec);
  INFO((worker ? std::string() : worker.error().message));
  REQUIRE(worker.has_value());
  engine::SchedulerConfig config;
  config.num_blocks = (*worker)->report().num_kv_blocks;
  config.block_size = spec.block_size;
  config.max_model_len = 512;
  engine::EngineCore core(config, {});
  // llama.cpp's first greedy token for prompt [86] (../shared/golden: archs/llama.json and
  // lora/*.json, prompt len1), all three in one step.
  const std::vector<std::int32_t> slots = {0, 1, 2};
  for (std::size_t i = 0; i < slots.size(); ++i) {
    engine::CoreRequest request;
    request.id = i;
    request.prompt = {86};
    request.params.temperature = 0.0f;
    request.params.max_tokens = 1;
    request.adapter = slots[i];
    REQUIRE(core.add(request).has_value());
  }
  std::map<std::uint64_t, TokenId> first;
  while (auto work = core.next_step()) {
    const auto output = (*worker)->step(*work);
    REQUIRE_FALSE(output.failed);
    for (const auto& u : core.apply(output).updates) first[u.id] = u.token.id;
  }
  const auto golden_first = [](const std::string& relative) {
    const auto json =
        test::JsonParser(test::read_text(test::shared_file("golden/" + relative))).parse();
    return static_cast<TokenId>(json["prompts"].array[0]["output_ids"].array[0].number);
  };
  CHECK(first.at(0) == golden_first("archs/llama.json"));
  CHECK(first.at(1) == golden_first("lora/llama-attn-r8.json"));
  CHECK(first.at(2) == golden_first("lora/llama-all-r16.json"));
  CHECK(first.at(1) != first.at(0));

  SECTION("an adapter of another architecture is refused, naming it") {
    spec.lora_adapters = {lora("qwen2-qv-r4")};
    auto refused = worker::Worker::load(spec);
    REQUIRE_FALSE(refused.has_value());
    CHECK(refused.error().message.find("qwen2-qv-r4.gguf") != std::string::npos);
    CHECK(refused.error().message.find("architecture qwen2") != std::string::npos);
  }
  SECTION("on CUDA too an adapter is checked before the device is asked for") {
    // (The GPU's own LoRA test, tests/gpu/cuda_lora_test.cpp, needs a device.)
    spec.device = Device::cuda;
    spec.kv_cache_dtype = std::nullopt;
    spec.lora_adapters = {lora("qwen2-qv-r4")};
    auto cuda = worker::Worker::load(spec);
    REQUIRE_FALSE(cuda.has_value());
    CHECK(cuda.error().message.find("qwen2-qv-r4.gguf") != std::string::npos);
    CHECK(cuda.error().message.find("architecture qwen2") != std::string::npos);
  }
}
