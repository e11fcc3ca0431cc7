// Speculative decoding on real models (issue 36): with n-gram proposals verified in the
// step, stories260K's greedy continuations are still llama.cpp's (the golden file), and a
// random F16 model's greedy outputs are the ones it gives without speculation, alone and
// batched with chunked prefill beside the decodes.
#include <catch2/catch.hpp>
#include <random>

#include "golden/golden_support.hpp"

using namespace troupe;

namespace {

SpeculativeConfig ngram(std::int32_t k) {
  SpeculativeConfig s;
  s.num_speculative_tokens = k;
  s.prompt_lookup_max = 3;
  s.prompt_lookup_min = 1;
  s.disable_by_batch_size = 64;
  return s;
}

}  // namespace

TEST_CASE("with n-gram speculation, stories260K's greedy output still equals llama.cpp's",
          "[worker][speculative][shared]") {
  const auto cases = test::golden_cases();
  auto m = test::LoadedTestModel::open(test::shared_file("models/stories260K.gguf"), 64);
  test::BatchGenerator generator(*m.model, m.tokenizer->vocabulary().end_of_generation);
  generator.set_speculation(ngram(4));
  std::vector<test::GenerationRequest> all;
  engine::SpecDecodeCounters alone;
  for (const auto& c : cases.array) {
    INFO("prompt '" << c["prompt"].string << "' alone");
    all.push_back(test::golden_request(c));
    auto result = generator.run({all.back()});
    REQUIRE(result.has_value());
    const auto& output = (*result)[0].output;
    CHECK(std::vector<int>(output.begin(), output.end()) == c["output_ids"].ints());
    alone.num_drafts += generator.last_speculation().num_drafts;
    alone.num_accepted_tokens += generator.last_speculation().num_accepted_tokens;
  }
  CHECK(alone.num_drafts > 0);
  CHECK(alone.num_accepted_tokens > 0);
  // All at once, prompts in chunks of 3: prefill chunks run beside speculating decodes.
  auto together = generator.run(all, 3);
  REQUIRE(together.has_value());
  for (std::size_t i = 0; i < all.size(); ++i) {
    INFO("prompt '" << cases.array[i]["prompt"].string << "' in the batch");
    const auto& output = (*together)[i].output;
    CHECK(std::vector<int>(output.begin(), output.end()) == cases.array[i]["output_ids"].ints());
  }
  CHECK(generator.last_speculation().num_accepted_tokens > 0);
}

TEST_CASE("a random F16 model's greedy outputs are the same with and without n-gram speculation",
          "[worker][speculative][shared]") {
  auto m = test::LoadedTestModel::open(test::shared_file("models/rand15M-f16.gguf"), 64);
  test::BatchGenerator generator(*m.model, m.tokenizer->vocabulary().end_of_generation);
  std::mt19937 rng(3);
  std::vector<test::GenerationRequest> requests(4);
  for (auto& r : requests) {
    r.prompt.push_back(1);
    const int n = 4 + static_cast<int>(rng() % 24);
    for (int i = 0; i < n; ++i) r.prompt.push_back(static_cast<TokenId>(100 + rng() % 30000));
    r.params.max_tokens = 96;
    r.params.temperature = 0.0f;
    r.params.ignore_eos = true;
  }
  auto plain = generator.run(requests, 5);
  REQUIRE(plain.has_value());
  for (const std::int32_t k : {1, 3, 6}) {
    INFO("k = " << k);
    generator.set_speculation(ngram(k));
    auto spec = generator.run(requests, 5);
    REQUIRE(spec.has_value());
    for (std::size_t i = 0; i < requests.size(); ++i) {
      INFO("request " << i);
      CHECK((*spec)[i].output == (*plain)[i].output);
    }
    // The random model repeats itself: most of its tokens are proposed and accepted.
    CHECK(generator.last_speculation().num_accepted_tokens > 0);
  }
}
