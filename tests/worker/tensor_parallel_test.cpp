// A model split over ranks (threads of this process, Gloo on loopback) computes what
// the whole model does: the same greedy tokens, logits within a small tolerance, and
// outputs that do not depend on the batch. Shapes that cannot be split are refused.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <future>
#include <optional>

#include "cpu/cpu_backend.hpp"
#include "golden/golden_support.hpp"
#include "model/rendezvous_stores.hpp"
#include "model/tensor_parallel.hpp"
#include "support/small_model.hpp"
#include "worker/backend_factory.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

// The ranks of one group, each loaded by its own thread (they meet in the store).
struct Group {
  std::vector<model::LoadedModel> ranks;

  std::vector<model::LlamaModel*> models() {
    std::vector<model::LlamaModel*> out;
    for (auto& r : ranks) out.push_back(r.model.get());
    return out;
  }
};

Result<Group> load_group(const std::string& path, std::int32_t size, std::int32_t kv_blocks = 64) {
  model::InProcessStore store;
  static int formation = 0;
  worker::GroupLink link;
  link.store = &store;
  link.prefix = "tp-test-" + std::to_string(++formation);
  link.timeout = 20s;
  std::vector<std::future<Result<model::LoadedModel>>> loading;
  for (std::int32_t r = 0; r < size; ++r) {
    loading.push_back(std::async(std::launch::async, [&, r]() -> Result<model::LoadedModel> {
      engine::WorkerSpec spec;
      spec.model_path = path;
      spec.num_threads = 1;
      spec.rank = r;
      spec.world_size = size;
      TROUPE_TRY(auto m, worker::open_model(spec, &link));
      TROUPE_TRY_VOID(m.allocate_kv_cache(kv_blocks, 16));
      return m;
    }));
  }
  // The cause, as the group actor names it: a rank's own failure before one that gave up
  // on the others (a rank that failed its load leaves the others' connections broken).
  Group group;
  std::optional<Error> failed;
  for (auto& rank : loading) {
    auto m = rank.get();
    if (!m && (!failed || failed->code == ErrorCode::unavailable)) failed = m.error();
    if (m) group.ranks.push_back(std::move(*m));
  }
  if (failed) return tl::make_unexpected(*failed);
  return group;
}

// The largest difference between two logit rows, relative to the largest logit.
double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double largest = 1.0, worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    largest = std::max(largest, static_cast<double>(std::fabs(a[i])));
    worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
  }
  return worst / largest;
}

// Relative tolerance on logits: the split changes only the order in which the attention
// output and down projections add their terms (float rounding, about 1e-7 per add).
constexpr double kLogitTolerance = 1e-4;

std::vector<test::GenerationRequest> requests_for(std::int32_t vocab, int count, int length) {
  std::vector<test::GenerationRequest> requests;
  for (int i = 0; i < count; ++i) {
    test::GenerationRequest r;
    for (int t = 0; t < 5 + 3 * i; ++t) r.prompt.push_back(1 + (7 * t + 13 * i) % (vocab - 1));
    r.params.temperature = 0.0f;
    r.params.max_tokens = length;
    r.params.ignore_eos = true;
    requests.push_back(r);
  }
  return requests;
}

// The whole model's results for `requests` (one rank, two threads).
std::vector<test::GenerationResult> run_whole(
    const std::string& path, const std::vector<test::GenerationRequest>& requests) {
  auto whole = test::LoadedTestModel::open(path, 64);
  test::BatchGenerator reference(*whole.model, {});
  auto expected = reference.run(requests);
  REQUIRE(expected.has_value());
  return *expected;
}

// A group's results are the whole model's: the same greedy tokens, and first-step logits
// within the tolerance.
void check_matches(test::BatchGenerator& split,
                   const std::vector<test::GenerationRequest>& requests,
                   const std::vector<test::GenerationResult>& expected) {
  auto result = split.run(requests);
  REQUIRE(result.has_value());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    CHECK((*result)[i].output == expected[i].output);
    CHECK(relative_difference((*result)[i].first_logits, expected[i].first_logits) <
          kLogitTolerance);
  }
}

// One rank's end of a group that runs no collective: it records what the model asked it
// to reserve.
class ReservingCommunicator final : public model::Communicator {
 public:
  ReservingCommunicator(std::int32_t rank, std::int32_t size) : rank_(rank), size_(size) {}
  std::int32_t rank() const override { return rank_; }
  std::int32_t size() const override { return size_; }
  Result<void> all_reduce_sum(std::span<float>) override {
    return make_error(ErrorCode::unsupported, "no collectives in this test");
  }
  Result<void> gather(std::span<const float>, std::span<float>) override {
    return make_error(ErrorCode::unsupported, "no collectives in this test");
  }
  Result<void> reserve(std::size_t max_all_reduce, std::size_t max_gather_part) override {
    reserved.emplace_back(max_all_reduce, max_gather_part);
    return {};
  }
  std::vector<std::pair<std::size_t, std::size_t>> reserved;

 private:
  std::int32_t rank_, size_;
};

}  // namespace

TEST_CASE("a split model reserves its largest collectives when prepared, before its KV cache",
          "[tp]") {
  // dim 96, vocabulary 512: two ranks split the LM head (256 rows each), three cannot.
  const std::string path = test::write_small_model("tp-reserve", [](auto& spec) {
    spec.dim = 96;
    spec.num_heads = 6;
    spec.num_kv_heads = 6;
    spec.ffn_dim = 96;
  });
  const auto prepared = [&](std::int32_t rank, std::int32_t size) {
    auto m = model::LoadedModel::open(path);
    REQUIRE(m.has_value());
    auto backend = std::make_unique<cpu::CpuBackend>(1);
    auto group = std::make_shared<ReservingCommunicator>(rank, size);
    if (size > 1) REQUIRE(backend->join_group(group).has_value());
    REQUIRE(m->load_weights(std::move(backend), {rank, size}).has_value());
    REQUIRE(m->model->prepare(48, 8).has_value());
    return group->reserved;
  };
  using Reserved = std::vector<std::pair<std::size_t, std::size_t>>;
  // Up to 48 tokens of [dim] summed; 8 logit rows of a 256-token vocabulary slice gathered.
  CHECK(prepared(0, 2) == Reserved{{48 * 96, 8 * 256}});
  CHECK(prepared(1, 2) == Reserved{{48 * 96, 8 * 256}});
  // A vocabulary the ranks do not divide is held by rank 0 alone: nothing gathered.
  CHECK(prepared(2, 3) == Reserved{{48 * 96, 0}});
  // The whole model has no group to ask.
  CHECK(prepared(0, 1).empty());
}

TEST_CASE("a shard holds its heads, its KV heads and its slice of the FFN", "[tp]") {
  model::LlamaConfig config;
  config.num_heads = 8;
  config.num_kv_heads = 4;
  config.ffn_dim = 172;
  SECTION("KV heads split when there are as many as ranks or more") {
    auto layout = model::shard_layout(config, {1, 2});
    REQUIRE(layout.has_value());
    CHECK(layout->head_begin == 4);
    CHECK(layout->num_heads == 4);
    CHECK(layout->kv_head_begin == 2);
    CHECK(layout->num_kv_heads == 2);
    CHECK(layout->ffn_begin == 86);
    CHECK(layout->ffn_dim == 86);
  }
  SECTION("KV heads are replicated when there are fewer than ranks") {
    config.ffn_dim = 176;
    for (std::int32_t r = 0; r < 8; ++r) {
      auto layout = model::shard_layout(config, {r, 8});
      REQUIRE(layout.has_value());
      CHECK(layout->num_heads == 1);
      CHECK(layout->num_kv_heads == 1);
      // Query head r belongs to KV head r / 2 (groups of two).
      CHECK(layout->kv_head_begin == r / 2);
    }
  }
  SECTION("heads or an FFN that do not divide are refused, saying which") {
    auto three = model::shard_layout(config, {0, 3});
    REQUIRE_FALSE(three.has_value());
    CHECK(three.error().message.find("8 attention heads") != std::string::npos);
    config.num_heads = 12;
    config.num_kv_heads = 12;
    auto ffn = model::shard_layout(config, {0, 3});
    REQUIRE_FALSE(ffn.has_value());
    CHECK(ffn.error().message.find("FFN of 172") != std::string::npos);
  }
}

TEST_CASE("stories260K split over 2 and 4 ranks gives llama.cpp's greedy output",
          "[tp][golden][shared]") {
  const auto cases = test::golden_cases();
  const std::string path = test::shared_file("models/stories260K.gguf");
  auto whole = test::LoadedTestModel::open(path, 64);
  test::BatchGenerator reference(*whole.model, {});
  std::vector<test::GenerationRequest> all;
  for (const auto& c : cases.array) all.push_back(test::golden_request(c));
  auto expected = reference.run(all);
  REQUIRE(expected.has_value());
  // Its FFN of 172 does not split over 8.
  const std::int32_t size = GENERATE(2, 4);
  INFO(size << " ranks");
  auto group = load_group(path, size);
  REQUIRE(group.has_value());
  CHECK(group->ranks[0].model->local_config().num_heads == 8 / size);
  CHECK(group->ranks[0].kv_cache_shape(1, 16).num_kv_heads == std::max(1, 4 / size));
  test::BatchGenerator split(group->models(), {});
  auto result = split.run(all);
  REQUIRE(result.has_value());
  for (std::size_t i = 0; i < all.size(); ++i) {
    INFO("prompt '" << cases.array[i]["prompt"].string << "'");
    CHECK(std::vector<int>((*result)[i].output.begin(), (*result)[i].output.end()) ==
          cases.array[i]["output_ids"].ints());
    CHECK(relative_difference((*result)[i].first_logits, (*expected)[i].first_logits) <
          kLogitTolerance);
  }
}

TEST_CASE("a larger GQA model split over 2 and 4 ranks matches the whole model", "[tp][slow]") {
  // The ~110M shape's head layout (12 heads, 4 KV heads), smaller: 6 layers, dim 384.
  const std::string path = test::write_small_model("tp-gqa", [](model::RandomModelSpec& spec) {
    spec.dim = 384;
    spec.num_layers = 6;
    spec.num_heads = 12;
    spec.num_kv_heads = 4;
    spec.ffn_dim = 1024;
    spec.vocab_size = 2048;
    spec.type = gguf::TensorType::f16;
    spec.stddev = 0.05f;
  });
  const auto requests = requests_for(2048, 4, 12);
  const auto expected = run_whole(path, requests);
  const std::int32_t size = GENERATE(2, 4);
  INFO(size << " ranks");
  auto group = load_group(path, size);
  REQUIRE(group.has_value());
  test::BatchGenerator split(group->models(), {});
  check_matches(split, requests, expected);
  SECTION("a split model's outputs do not depend on the batch, bit for bit") {
    auto together = split.run(requests, /*prefill_chunk=*/3);
    REQUIRE(together.has_value());
    for (std::size_t i = 0; i < requests.size(); ++i) {
      auto alone = split.run({requests[i]});
      REQUIRE(alone.has_value());
      CHECK((*alone)[0].output == (*together)[i].output);
      CHECK((*alone)[0].first_logits == (*together)[i].first_logits);
    }
  }
  SECTION("12 heads do not split over 3 ranks with 4 KV heads") {
    auto three = load_group(path, 3);
    REQUIRE_FALSE(three.has_value());
    CHECK(three.error().message.find("4 KV heads") != std::string::npos);
  }
}

TEST_CASE("a quantized tensor whose blocks a split would cut is refused, named", "[tp][shared]") {
  // Q4_K_M: blocks of 256. The attention output's 512 input columns split in two
  // (256 each) but not in four (128).
  const std::string path = test::shared_file("models/rand30M-q4_k_m.gguf");
  auto four = load_group(path, 4, 8);
  REQUIRE_FALSE(four.has_value());
  CHECK(four.error().message.find("blk.0.attn_output.weight") != std::string::npos);
  CHECK(four.error().message.find("block boundaries") != std::string::npos);
  auto two = load_group(path, 2, 8);
  REQUIRE(two.has_value());
}

TEST_CASE("KV heads fewer than the ranks are replicated, and the output is the whole model's",
          "[tp]") {
  const std::string path = test::write_small_model("tp-replicated", [](model::RandomModelSpec& s) {
    s.num_heads = 8;
    s.num_kv_heads = 2;
    s.ffn_dim = 256;
  });
  const auto requests = requests_for(512, 3, 8);
  const auto expected = run_whole(path, requests);
  // 4 ranks: each KV head on two; 8 ranks: on four, one query head each.
  const std::int32_t size = GENERATE(4, 8);
  INFO(size << " ranks");
  auto group = load_group(path, size);
  REQUIRE(group.has_value());
  for (std::int32_t r = 0; r < size; ++r) {
    CHECK(group->ranks[r].kv_cache_shape(1, 16).num_kv_heads == 1);
  }
  test::BatchGenerator split(group->models(), {});
  check_matches(split, requests, expected);
}

TEST_CASE(
    "an LM head split by vocabulary, or held by rank 0 when the ranks do not divide it, "
    "gives the whole model's logits",
    "[tp]") {
  // 512 tokens split four ways; 514 do not, and rank 0 computes them all.
  const std::int32_t vocab = GENERATE(512, 514);
  INFO("vocabulary of " << vocab);
  const std::string path = test::write_small_model(
      "tp-vocab-" + std::to_string(vocab), [vocab](model::RandomModelSpec& s) {
        s.num_heads = 8;
        s.num_kv_heads = 4;
        s.ffn_dim = 256;
        s.vocab_size = vocab;
        s.tied_output = vocab == 512;  // both layouts: the embedding's rows, and output.weight
      });
  const auto requests = requests_for(vocab, 3, 6);
  const auto expected = run_whole(path, requests);
  auto group = load_group(path, 4);
  REQUIRE(group.has_value());
  test::BatchGenerator split(group->models(), {});
  check_matches(split, requests, expected);
}
