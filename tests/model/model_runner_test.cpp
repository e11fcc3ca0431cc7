// The runner's two sampling paths: on a backend that samples on its device, only
// ids come back (when no row needs the host); otherwise logits are read and the
// host samples. A CPU backend dressed as a sampling device stands in for the GPU.
#include <catch2/catch.hpp>

#include <algorithm>

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
  Result<model::StepPlan> begin_step(const model::StepInput& s) override {
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
