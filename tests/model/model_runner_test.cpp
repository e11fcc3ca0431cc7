// The runner's two sampling paths: on a backend that samples on its device, only
// ids come back (when no row needs the host); otherwise logits are read and the
// host samples. A CPU backend dressed as a sampling device stands in for the GPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "cpu/cpu_backend.hpp"
#include "gpu/steps.hpp"
#include "model/model_runner.hpp"
#include "support/small_model.hpp"

using namespace troupe;
using model::Tensor;

namespace {

// Every op from a CpuBackend; sample() is greedy over the logits in its memory.
class SamplingCpuBackend final : public model::Backend {
 public:
  int samples = 0;
  std::vector<model::DeviceSamplingRow> last_rows;

  Result<model::Weight> load_weight(const gguf::GgufTensorInfo& i) override {
    return cpu_.load_weight(i);
  }
  Result<Tensor> allocate(std::int64_t r, std::int64_t c) override { return cpu_.allocate(r, c); }
  void release(Tensor t) override { cpu_.release(t); }
  Result<void> allocate_kv_cache(const model::KvCacheShape& s) override {
    return cpu_.allocate_kv_cache(s);
  }
  const model::KvCacheShape& kv_cache_shape() const override { return cpu_.kv_cache_shape(); }
  Result<model::StepShape> begin_step(const model::StepInput& s) override {
    return cpu_.begin_step(s);
  }
  void embed(const model::Weight& t, Tensor o) override { cpu_.embed(t, o); }
  void rms_norm(Tensor x, const model::Weight& w, float e, Tensor o) override {
    cpu_.rms_norm(x, w, e, o);
  }
  void matmul(Tensor x, const model::Weight& w, Tensor o) override { cpu_.matmul(x, w, o); }
  void rope(Tensor x, std::int32_t d, const model::RopeParams& p) override { cpu_.rope(x, d, p); }
  void store_kv(std::int32_t l, Tensor k, Tensor v) override { cpu_.store_kv(l, k, v); }
  void attention(std::int32_t l, Tensor q, const model::AttentionParams& p, Tensor o) override {
    cpu_.attention(l, q, p, o);
  }
  void swiglu(Tensor g, Tensor u, Tensor o) override { cpu_.swiglu(g, u, o); }
  void add(Tensor x, Tensor y) override { cpu_.add(x, y); }
  void gather_logit_rows(Tensor x, Tensor o) override { cpu_.gather_logit_rows(x, o); }
  Result<void> read(Tensor t, std::span<float> h) override { return cpu_.read(t, h); }
  bool can_sample() const override { return true; }
  Result<void> sample(Tensor logits, std::span<const model::DeviceSamplingRow> rows,
                      std::span<TokenId> ids) override {
    ++samples;
    last_rows.assign(rows.begin(), rows.end());
    for (std::int64_t r = 0; r < logits.rows; ++r) {
      const float* row = logits.data + r * logits.cols;
      ids[r] = static_cast<TokenId>(std::max_element(row, row + logits.cols) - row);
    }
    return {};
  }

 private:
  cpu::CpuBackend cpu_{2};
};

std::vector<TokenId> generate(model::Backend& backend, const std::string& path,
                              const SamplingParams& params) {
  auto file = gguf::GgufFile::open(path);
  REQUIRE(file.has_value());
  auto llama = model::LlamaModel::load(*file, backend);
  REQUIRE(llama.has_value());
  REQUIRE(backend.allocate_kv_cache({2, 8, 16, 2, 16}).has_value());
  model::ModelRunner runner(*llama, {});
  const std::vector<TokenId> prompt = {5, 9, 2, 7};
  REQUIRE(runner.add_sequence(1, params, prompt).has_value());
  std::vector<TokenId> output;
  std::int32_t length = 4;
  auto step = test::make_step({length}, {4}, 16, true, prompt);
  while (true) {
    auto results = runner.execute(step, std::vector<std::uint64_t>{1});
    REQUIRE(results.has_value());
    output.push_back((*results)[0].id);
    if (static_cast<std::int32_t>(output.size()) == params.max_tokens) break;  // ignore_eos
    step = test::make_step({++length}, {1}, 16, true, {output.back()});
  }
  return output;
}

}  // namespace

TEST_CASE("a sampling device gives the host's greedy tokens, and only ids come back",
          "[model][runner]") {
  const auto path = test::write_small_model("runner");
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 12;
  greedy.ignore_eos = true;
  cpu::CpuBackend host;
  const auto expected = generate(host, path, greedy);

  SamplingCpuBackend device;
  CHECK(generate(device, path, greedy) == expected);
  CHECK(device.samples == 12);
  REQUIRE(device.last_rows.size() == 1u);
  CHECK(device.last_rows[0].temperature == 0.0f);
  CHECK(device.last_rows[0].counter == 11u);
}

TEST_CASE("rows that need the host (penalties, log-probabilities) are sampled there",
          "[model][runner]") {
  const auto path = test::write_small_model("runner-host");
  SamplingParams params;
  params.temperature = 0.0f;
  params.max_tokens = 6;
  params.ignore_eos = true;
  params.logprobs = 2;
  SamplingCpuBackend device;
  cpu::CpuBackend host;
  CHECK(generate(device, path, params) == generate(host, path, params));
  CHECK(device.samples == 0);
  params.logprobs.reset();
  params.repetition_penalty = 1.3f;
  SamplingCpuBackend device2;
  cpu::CpuBackend host2;
  CHECK(generate(device2, path, params) == generate(host2, path, params));
  CHECK(device2.samples == 0);
}

TEST_CASE("a prompt token's score: log-softmax, rank by strictly greater logits, top n",
          "[model][prompt_logprobs]") {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, 0.0f, 2.0f};
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l));
  const double lse = std::log(sum);
  const auto fourth = model::score_prompt_token(logits, 4, 2);
  CHECK(fourth.token == 4);
  CHECK(fourth.logprob == Approx(2.0 - lse).epsilon(1e-6));
  CHECK(fourth.rank == 3);
  // Ties: the lower id first, as the sampled tokens' top_logprobs.
  REQUIRE(fourth.top_logprobs.size() == 2u);
  CHECK(fourth.top_logprobs[0].id == 1);
  CHECK(fourth.top_logprobs[1].id == 2);
  // A token tied for the top is rank 1; none asked, none listed.
  const auto tied = model::score_prompt_token(logits, 2, 0);
  CHECK(tied.rank == 1);
  CHECK(tied.top_logprobs.empty());
  CHECK(model::score_prompt_token(logits, 3, 0).rank == 5);
}

TEST_CASE("a prompt token's top entries are the sampler's top_logprobs, ties and all",
          "[model][prompt_logprobs]") {
  // Values on a coarse grid: many ties, at the cut too.
  std::vector<float> logits(1000);
  for (std::size_t i = 0; i < logits.size(); ++i) {
    logits[i] = static_cast<float>((i * 7919) % 61) * 0.25f - 5.0f;
  }
  for (const std::int32_t n : {1, 5, 20}) {
    for (const TokenId target : {0, 17, 999}) {
      const auto s = model::score_prompt_token(logits, target, n);
      CHECK(s.top_logprobs == model::top_logprobs(logits, n));
      const auto own = logits[static_cast<std::size_t>(target)];
      CHECK(s.rank ==
            1 + std::count_if(logits.begin(), logits.end(), [own](float l) { return l > own; }));
    }
  }
}

TEST_CASE("a step that scores a prompt is sampled on the host, each row scored in order",
          "[model][runner][prompt_logprobs]") {
  const auto path = test::write_small_model("runner-prompt");
  const std::vector<TokenId> prompt = {5, 9, 2, 7, 11, 3};
  auto file = gguf::GgufFile::open(path);
  REQUIRE(file.has_value());
  // Every row's logits, straight from the model.
  std::vector<float> all_logits;
  std::size_t vocab = 0;
  {
    cpu::CpuBackend host;
    auto llama = model::LlamaModel::load(*file, host);
    REQUIRE(llama.has_value());
    REQUIRE(host.allocate_kv_cache({2, 8, 16, 2, 16}).has_value());
    auto step = test::make_step({6}, {6}, 16, true, prompt);
    step.logit_rows = {0, 1, 2, 3, 4, 5};
    REQUIRE(llama->forward(step, all_logits).has_value());
    vocab = static_cast<std::size_t>(llama->config().vocab_size);
  }
  SamplingCpuBackend device;
  auto llama = model::LlamaModel::load(*file, device);
  REQUIRE(llama.has_value());
  REQUIRE(device.allocate_kv_cache({2, 8, 16, 2, 16}).has_value());
  model::ModelRunner runner(*llama, {});
  SamplingParams params;
  params.temperature = 0.0f;
  params.prompt_logprobs = 3;
  REQUIRE(runner.add_sequence(1, params, prompt).has_value());
  // Row 5 samples; rows 0..4 score the tokens after them.
  auto step = test::make_step({6}, {6}, 16, true, prompt);
  step.logit_rows.insert(step.logit_rows.end(), {0, 1, 2, 3, 4});
  const std::vector<model::PromptRows> rows = {{1, 0, 3, {9, 2, 7, 11, 3}}};

  SECTION("scored as score_prompt_token scores each row's own logits") {
    std::vector<model::PromptLogprobs> scores;
    const auto results = runner.execute(step, std::vector<std::uint64_t>{1}, rows, &scores);
    REQUIRE(results.has_value());
    CHECK(device.samples == 0);  // the logits were read back: the host samples
    const std::span<const float> last(all_logits.data() + 5 * vocab, vocab);
    CHECK((*results)[0].id ==
          static_cast<TokenId>(std::max_element(last.begin(), last.end()) - last.begin()));
    REQUIRE(scores.size() == 1u);
    CHECK(scores[0].id == 1u);
    CHECK(scores[0].first_position == 0);
    REQUIRE(scores[0].entries.size() == 5u);
    for (std::size_t p = 0; p < 5; ++p) {
      const std::span<const float> row(all_logits.data() + p * vocab, vocab);
      CHECK(scores[0].entries[p] == model::score_prompt_token(row, prompt[p + 1], 3));
      CHECK(scores[0].entries[p].top_logprobs.size() == 3u);
    }
  }
  SECTION("rows and targets that do not add up, or a target outside the vocabulary, refused") {
    const std::vector<model::PromptRows> short_rows = {{1, 0, 3, {9, 2, 7, 11}}};
    const auto uneven = runner.execute(step, std::vector<std::uint64_t>{1}, short_rows);
    REQUIRE_FALSE(uneven.has_value());
    CHECK(uneven.error().code == ErrorCode::invalid_argument);
    const std::vector<model::PromptRows> outside = {
        {1, 0, 3, {9, 2, 7, 11, static_cast<TokenId>(vocab)}}};
    const auto bad = runner.execute(step, std::vector<std::uint64_t>{1}, outside);
    REQUIRE_FALSE(bad.has_value());
    CHECK(bad.error().code == ErrorCode::invalid_argument);
  }
}
