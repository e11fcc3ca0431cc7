// Every message of the worker protocol (and the scheduler's) survives CAF's binary
// serializer unchanged: what a worker on another node would receive.
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <catch2/catch.hpp>

#include "actors/cluster/cluster_messages.hpp"
#include "actors/messages.hpp"

using namespace troupe;

namespace {

struct System {
  caf::actor_system_config config;
  std::unique_ptr<caf::actor_system> system;
  System() {
    actors::add_message_types(config);
    actors::cluster::add_cluster_types(config);
    system = std::make_unique<caf::actor_system>(config);
  }
};

template <class T>
T round_trip(caf::actor_system& system, const T& value) {
  std::vector<char> bytes;
  caf::binary_serializer sink{system, bytes};
  T copy = value;  // inspect() takes a mutable reference
  REQUIRE(!sink(copy));
  CHECK(!bytes.empty());
  T back;
  caf::binary_deserializer source{system, bytes};
  REQUIRE(!source(back));
  return back;
}

// A message as the actors send it: serialized through its registered type, by name.
template <class T>
T message_round_trip(caf::actor_system& system, const T& value) {
  auto message = caf::make_message(value);
  std::vector<char> bytes;
  caf::binary_serializer sink{system, bytes};
  REQUIRE(!sink(message));
  caf::message back;
  caf::binary_deserializer source{system, bytes};
  REQUIRE(!source(back));
  REQUIRE(back.match_elements<T>());
  return back.get_as<T>(0);
}

SamplingParams unusual_params() {
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 40;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  p.seed = 0xFFFFFFFFFFFFFFFFull;  // all 64 bits
  p.repetition_penalty = 1.1f;
  p.presence_penalty = 0.25f;
  p.frequency_penalty = -0.5f;
  p.logprobs = 3;
  p.prompt_logprobs = 0;  // present, and zero
  p.max_tokens = 1000;
  p.min_tokens = 2;
  p.stop_token_ids = {2, 7, 31999};
  p.ignore_eos = true;
  return p;
}

engine::StepWork a_step() {
  engine::StepWork w;
  w.step_id = 41;
  model::append_sequence(w.step, std::vector<TokenId>{5, 6, 7}, 0, std::vector<std::int32_t>{3},
                         true);
  model::append_sequence(w.step, std::vector<TokenId>{9}, 17, std::vector<std::int32_t>{0, 8},
                         true);
  w.sampled_ids = {11, 12};
  w.new_sequences.push_back({11, unusual_params(), {5, 6, 7}});
  w.new_sequences.push_back({12, SamplingParams{}, {1}});
  w.removed = {3, 4};
  // Sequence 11's rows 0 and 1 score its prompt's tokens 6 and 7 (row 2 samples).
  w.step.logit_rows.insert(w.step.logit_rows.end(), {0, 1});
  w.prompt_rows.push_back({11, 0, 3, {6, 7}});
  return w;
}

}  // namespace

TEST_CASE("every worker-protocol message round-trips through CAF's binary serializer",
          "[actors][wire]") {
  System s;
  auto& system = *s.system;

  SECTION("sampling parameters, with and without their optional fields") {
    const auto p = unusual_params();
    CHECK(round_trip(system, p) == p);
    const SamplingParams plain;
    const auto back = round_trip(system, plain);
    CHECK(back == plain);
    CHECK_FALSE(back.seed.has_value());
    CHECK_FALSE(back.logprobs.has_value());
    CHECK_FALSE(back.prompt_logprobs.has_value());
    CHECK(round_trip(system, p).prompt_logprobs == std::optional<std::int32_t>(0));
    SamplingParams zero_seed;
    zero_seed.seed = 0;  // present, and zero: not the same as absent
    CHECK(round_trip(system, zero_seed).seed == std::optional<std::uint64_t>(0));
  }
  SECTION("the worker's spec") {
    engine::WorkerSpec spec;
    spec.model_path = "/models/llama-3-8b.Q4_K_M.gguf";
    spec.model_fingerprint = "4920733184-0123456789abcdef";
    spec.device = Device::cuda;
    spec.num_threads = 6;
    spec.cuda_graphs = false;
    spec.block_size = 32;
    spec.max_model_len = 8192;
    spec.max_num_seqs = 64;
    spec.max_num_batched_tokens = 4096;
    spec.num_kv_blocks = 1234;
    spec.kv_cache_bytes = std::int64_t{3} << 32;
    spec.gpu_memory_utilization = 0.85;
    spec.kv_cache_dtype = KvCacheDtype::f32;
    spec.rank = 1;
    spec.world_size = 2;
    spec.calibrate_step_cost = true;
    CHECK(round_trip(system, spec) == spec);
    CHECK(message_round_trip(system, spec) == spec);
  }
  SECTION("the load report, and a failed one") {
    engine::LoadReport report;
    report.num_kv_blocks = 4096;
    report.bytes_per_block = 131072;
    report.device_name = "CUDA NVIDIA H200 (9.0, 132 SMs)";
    report.vocab_size = 128256;
    report.step_costs = {{256, 0, 0.75}, {1, 1, 0.0125}};
    CHECK(round_trip(system, report) == report);
    CHECK(message_round_trip(system, report) == report);
    engine::LoadReport failed;
    failed.failed = true;
    failed.error = {ErrorCode::invalid_file, "model.gguf: truncated", true};
    failed.failed_rank = 3;  // a tensor-parallel group's rank
    CHECK(round_trip(system, failed) == failed);
    CHECK(message_round_trip(system, failed) == failed);
  }
  SECTION("a rank's way into its group") {
    actors::GroupJoin join;
    join.prefix = "tp";
    join.timeout_ms = 12345;
    const auto back = message_round_trip(system, join);
    CHECK(back.prefix == "tp");
    CHECK(back.timeout_ms == 12345);
    CHECK(back.store == nullptr);
  }
  SECTION("a step's work") {
    const auto work = a_step();
    CHECK(round_trip(system, work) == work);
    CHECK(message_round_trip(system, work) == work);
  }
  SECTION("a step's output, and a failed one") {
    engine::StepOutput out;
    out.step_id = 41;
    out.tokens.push_back({17, -0.25f, {{17, -0.25f}, {3, -2.5f}}});
    out.tokens.push_back({kNoToken, 0.0f, {}});
    out.seconds = 0.0125;
    out.prompt_logprobs.push_back(
        {11, 0, {{6, -1.5f, 2, {{9, -0.5f}, {6, -1.5f}}}, {7, -4.0f, 30, {}}}});
    CHECK(round_trip(system, out) == out);
    CHECK(message_round_trip(system, out) == out);
    engine::StepOutput failed;
    failed.step_id = 42;
    failed.failed = true;
    failed.error = {ErrorCode::out_of_range, "a block id is outside the cache", false};
    CHECK(round_trip(system, failed) == failed);
  }
  SECTION("the engine's numbers: every field") {
    EngineStats stats;
    stats.num_running = 3;
    stats.num_waiting = 4;
    stats.kv_usage = 0.5;
    stats.peak_kv_usage = 0.75;
    stats.num_preemptions = 7;
    stats.prefix_queried_tokens = 8;
    stats.prefix_hit_tokens = 9;
    stats.num_steps = 10;
    stats.num_step_tokens = 11;
    stats.num_step_sequences = 12;
    stats.step_seconds = 1.5;
    stats.schedule_seconds = 0.25;
    stats.num_worker_restarts = 13;
    stats.num_live_actors = 14;
    stats.num_kv_blocks = 100;
    stats.block_size = 16;
    stats.prefix_cache_blocks = 15;
    CHECK(round_trip(system, stats) == stats);
    CHECK(message_round_trip(system, stats) == stats);
  }
  SECTION("a node's join and the head's answer") {
    actors::cluster::NodeInfo info;
    info.name = "node-a";
    info.token = "0123abcd";
    info.num_cores = 64;
    info.memory_bytes = std::int64_t{512} << 30;
    info.device = "cuda";
    info.gpu_names = {"H200", "H200"};
    info.gpu_memory_bytes = {std::int64_t{141} << 30, std::int64_t{141} << 30};
    info.num_threads = 8;
    const auto back = message_round_trip(system, info);
    CHECK(back.name == info.name);
    CHECK(back.token == info.token);
    CHECK(back.num_cores == info.num_cores);
    CHECK(back.memory_bytes == info.memory_bytes);
    CHECK(back.device == info.device);
    CHECK(back.gpu_names == info.gpu_names);
    CHECK(back.gpu_memory_bytes == info.gpu_memory_bytes);
    CHECK(back.num_threads == info.num_threads);
    const auto reply = message_round_trip(system, actors::cluster::JoinReply{true, "welcome"});
    CHECK(reply.accepted);
    CHECK(reply.message == "welcome");
  }
  SECTION("what a request actor hears") {
    engine::RequestEvent event;
    event.id = 77;
    event.token = {42, -1.25f, {{42, -1.25f}, {7, -3.0f}}};
    event.finish_reason = FinishReason::length;
    event.error = "none";
    event.num_cached_tokens = 16;
    event.first_scheduled = std::chrono::steady_clock::time_point(std::chrono::nanoseconds(123456));
    event.prompt_logprobs.push_back({5, -2.25f, 3, {{8, -0.75f}, {2, -1.0f}, {5, -2.25f}}});
    event.prompt_logprobs.push_back({6, -0.125f, 1, {}});
    const auto back = message_round_trip(system, event);
    CHECK(back.id == event.id);
    CHECK(back.token == event.token);
    CHECK(back.finish_reason == event.finish_reason);
    CHECK(back.error == event.error);
    CHECK(back.num_cached_tokens == event.num_cached_tokens);
    CHECK(back.first_scheduled == event.first_scheduled);
    CHECK(back.prompt_logprobs == event.prompt_logprobs);
  }
}
