// A sequence's result does not depend on what shares its batch, nor on how its
// prompt is chunked: same tokens, and bit-identical logits.
#include <catch2/catch.hpp>
#include <filesystem>
#include <random>

#include "golden/golden_support.hpp"
#include "support/small_model.hpp"

using namespace troupe;
using namespace troupe::gguf;
using namespace troupe::model;

namespace {

std::string tiny_random_model(TensorType type) {
  return test::write_small_model("batch-" + std::string(tensor_type_name(type)),
                                 [type](RandomModelSpec& spec) {
                                   spec.dim = 128;
                                   spec.ffn_dim = 256;
                                   spec.vocab_size = 1024;
                                   spec.type = type;
                                   spec.stddev = 0.08f;
                                 });
}

std::vector<float> logits_of(LlamaModel& model, const StepInput& step) {
  std::vector<float> logits;
  auto r = model.forward(step, logits);
  REQUIRE(r.has_value());
  return logits;
}

}  // namespace

TEST_CASE("golden prompts run together give exactly the outputs each gives alone",
          "[golden][shared]") {
  const auto cases = test::golden_cases();
  auto m = test::LoadedTestModel::open(test::shared_file("models/stories260K.gguf"), 64);
  test::BatchGenerator generator(*m.model, {});
  std::vector<test::GenerationRequest> all;
  for (const auto& c : cases.array) all.push_back(test::golden_request(c));
  auto together = generator.run(all);
  REQUIRE(together.has_value());
  for (std::size_t i = 0; i < all.size(); ++i) {
    auto alone = generator.run({all[i]});
    REQUIRE(alone.has_value());
    CHECK((*together)[i].output == (*alone)[0].output);
    CHECK((*together)[i].first_logits == (*alone)[0].first_logits);
    CHECK(std::vector<int>((*together)[i].output.begin(), (*together)[i].output.end()) ==
          cases.array[i]["output_ids"].ints());
  }
  SECTION("chunked prefill changes nothing") {
    auto chunked = generator.run(all, /*prefill_chunk=*/2);
    REQUIRE(chunked.has_value());
    for (std::size_t i = 0; i < all.size(); ++i)
      CHECK((*chunked)[i].output == (*together)[i].output);
  }
}

TEST_CASE("logits are bit-identical alone or in a batch of 32", "[golden]") {
  for (const TensorType type :
       {TensorType::f32, TensorType::f16, TensorType::q8_0, TensorType::q4_0}) {
    INFO(tensor_type_name(type));
    const std::string path = tiny_random_model(type);
    auto m = test::LoadedTestModel::open(path, 32 * 8, 16);
    std::mt19937 rng(11);
    std::uniform_int_distribution<TokenId> any(3, 1023);
    auto table = [](std::int32_t seq) {
      std::vector<std::int32_t> t(8);
      for (int i = 0; i < 8; ++i) t[i] = seq * 8 + i;
      return t;
    };
    // Sequence 0 alone: a 37-token prompt, then a decode step.
    std::vector<TokenId> prompt(37);
    for (auto& t : prompt) t = any(rng);
    const TokenId next = any(rng);
    StepInput alone_prefill, alone_decode;
    append_sequence(alone_prefill, prompt, 0, table(0), true);
    const auto alone1 = logits_of(*m.model, alone_prefill);
    append_sequence(alone_decode, std::span(&next, 1), 37, table(0), true);
    const auto alone2 = logits_of(*m.model, alone_decode);

    // The same, sharing each step with 31 others: prefills and decodes of other lengths.
    // Their blocks must hold real history first, so each writes its prompt in a first step.
    StepInput warm;
    for (std::int32_t s = 1; s < 32; ++s) {
      std::vector<TokenId> p(5 + s);
      for (auto& t : p) t = any(rng);
      append_sequence(warm, p, 0, table(s), false);
    }
    (void)logits_of(*m.model, warm);
    StepInput batch_prefill, batch_decode;
    for (std::int32_t s = 0; s < 32; ++s) {
      if (s == 7) append_sequence(batch_prefill, prompt, 0, table(0), true);
      const TokenId t = any(rng);
      if (s > 0) append_sequence(batch_prefill, std::span(&t, 1), 5 + s, table(s), true);
    }
    const auto batch1 = logits_of(*m.model, batch_prefill);
    for (std::int32_t s = 0; s < 32; ++s) {
      const TokenId t = any(rng);
      if (s == 20) append_sequence(batch_decode, std::span(&next, 1), 37, table(0), true);
      if (s > 0) append_sequence(batch_decode, std::span(&t, 1), 6 + s, table(s), true);
    }
    const auto batch2 = logits_of(*m.model, batch_decode);
    const std::size_t vocab = 1024;
    // Sequence 0 is the 7th logit row of the first batch and the 20th of the second.
    REQUIRE(batch1.size() == 32 * vocab);
    const std::vector<float> in_batch1(batch1.begin() + 6 * vocab, batch1.begin() + 7 * vocab);
    const std::vector<float> in_batch2(batch2.begin() + 19 * vocab, batch2.begin() + 20 * vocab);
    CHECK(in_batch1 == alone1);
    CHECK(in_batch2 == alone2);

    // Chunked prefill gives the same logits bit for bit.
    StepInput c1, c2;
    append_sequence(c1, std::span(prompt).first(16), 0, table(0), false);
    (void)logits_of(*m.model, c1);
    append_sequence(c2, std::span(prompt).subspan(16), 16, table(0), true);
    CHECK(logits_of(*m.model, c2) == alone1);
    std::filesystem::remove(path);
  }
}
