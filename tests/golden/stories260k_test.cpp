// troupe's greedy continuations of stories260K equal llama.cpp's, token for token.
#include <catch2/catch.hpp>

#include "golden/golden_support.hpp"

using namespace troupe;

TEST_CASE("greedy output equals llama.cpp's for every golden prompt", "[golden][shared]") {
  const auto cases = test::golden_cases();
  auto m = test::LoadedTestModel::open(test::shared_file("models/stories260K.gguf"), 64);
  test::BatchGenerator generator(*m.model, m.tokenizer->vocabulary().end_of_generation);
  for (const auto& c : cases.array) {
    INFO("prompt '" << c["prompt"].string << "'");
    // The tokenizer gives the golden prompt ids from the prompt text.
    const auto prompt = m.tokenizer->encode(c["prompt"].string, true);
    CHECK(std::vector<int>(prompt.begin(), prompt.end()) == c["prompt_ids"].ints());
    auto result = generator.run({test::golden_request(c)});
    REQUIRE(result.has_value());
    const auto& output = (*result)[0].output;
    CHECK(std::vector<int>(output.begin(), output.end()) == c["output_ids"].ints());
    CHECK(m.tokenizer->decode(output) == c["output_text"].string);
    // First-step logits agree with llama.cpp's (which keeps its KV cache in F16).
    for (const auto& top : c["top5_first"].array) {
      const auto id = static_cast<std::size_t>(top["id"].number);
      CHECK((*result)[0].first_logits[id] == Approx(top["logit"].number).margin(0.02));
    }
  }
}

TEST_CASE("each golden output piece is the token's text", "[golden][shared]") {
  const auto cases = test::golden_cases();
  auto m = test::LoadedTestModel::open(test::shared_file("models/stories260K.gguf"), 1);
  for (const auto& c : cases.array) {
    const auto ids = c["output_ids"].ints();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      CHECK(m.tokenizer->piece(ids[i]) == c["output_pieces"].array[i].string);
    }
  }
}
