// Thousands of truncated and corrupted variants of real GGUF files go through
// the reader (and the model loader's metadata reads). Every one must either
// parse or fail with a message; under ASan/UBSan none may read outside the bytes.
#include <catch2/catch.hpp>
#include <filesystem>
#include <random>

#include "gguf/dequantize.hpp"
#include "gguf/gguf_file.hpp"
#include "gguf/gguf_writer.hpp"
#include "model/llama_config.hpp"
#include "support/test_support.hpp"
#include "text/tokenizer.hpp"

using namespace troupe;
using namespace troupe::gguf;
using namespace troupe::model;
using namespace troupe::text;

namespace {

// Reads everything a loader would read from a file that parsed.
void exercise(const GgufFile& file) {
  (void)LlamaConfig::from_gguf(file);
  auto tokenizer = Tokenizer::from_gguf(file);
  if (tokenizer) {
    const auto ids = tokenizer->encode("Once upon a time, <s> héllo 🦙", true, true);
    (void)tokenizer->decode(ids);
  }
  std::vector<float> row;
  for (const auto& t : file.tensors()) {
    row.resize(static_cast<std::size_t>(t.dims[0]));
    if (t.dims[0] <= 4096) (void)dequantize_row(t.type, t.data, t.dims[0], row.data());
  }
}

std::vector<std::byte> synthetic_model() {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_uint32("llama.embedding_length", 64);
  w.add_uint32("llama.block_count", 1);
  w.add_uint32("llama.feed_forward_length", 96);
  w.add_uint32("llama.attention.head_count", 4);
  w.add_string("tokenizer.ggml.model", "llama");
  const std::vector<std::string> tokens = {"<unk>", "<s>", "</s>",
                                           "\xe2\x96\x81"
                                           "a",
                                           "b"};
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  const std::vector<float> scores = {0, 0, 0, -1, -2};
  w.add_float32_array("tokenizer.ggml.scores", scores);
  const std::vector<std::int32_t> types = {2, 3, 3, 1, 1};
  w.add_int32_array("tokenizer.ggml.token_type", types);
  std::vector<float> values(64 * 5, 0.25f);
  w.add_tensor("token_embd.weight", TensorType::q8_0, {64, 5},
               *quantize(TensorType::q8_0, values, 64));
  w.add_tensor("output_norm.weight", TensorType::f32, {64},
               *quantize(TensorType::f32, std::span(values).first(64), 64));
  return w.to_bytes();
}

void fuzz(const std::vector<std::byte>& original, int num_mutations, std::uint32_t seed) {
  std::mt19937 rng(seed);
  int parsed = 0, rejected = 0;
  // Every truncation point in the header region, then a spread over the rest.
  const std::size_t n = original.size();
  for (std::size_t cut = 0; cut < n; cut += (cut < 4096 ? 1 : 1 + cut / 64)) {
    auto file = GgufFile::parse(std::span(original).first(cut));
    if (file) {
      ++parsed;
      exercise(*file);
    } else {
      ++rejected;
      REQUIRE_FALSE(file.error().message.empty());
    }
  }
  // Random corruption, weighted toward the header and metadata where it matters.
  std::vector<std::byte> bytes;
  for (int i = 0; i < num_mutations; ++i) {
    bytes = original;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const std::size_t region = std::min<std::size_t>(n, (rng() % 2) ? 8192 : n);
      const std::size_t at = rng() % region;
      switch (rng() % 4) {
        case 0:
          bytes[at] = static_cast<std::byte>(rng());
          break;
        case 1:
          bytes[at] ^= static_cast<std::byte>(1u << (rng() % 8));
          break;
        case 2:
          bytes[at] = std::byte{0xff};
          break;
        default: {  // a 64-bit count or offset made absurd
          const std::uint64_t big = (rng() % 2) ? ~0ULL : (1ULL << (rng() % 64));
          for (int k = 0; k < 8 && at + k < n; ++k)
            bytes[at + k] = static_cast<std::byte>(big >> (8 * k));
        }
      }
    }
    if (rng() % 4 == 0) bytes.resize(rng() % n);
    auto file = GgufFile::parse(bytes);
    if (file) {
      ++parsed;
      exercise(*file);
    } else {
      ++rejected;
      REQUIRE_FALSE(file.error().message.empty());
    }
  }
  INFO("parsed " << parsed << ", rejected " << rejected);
  CHECK(rejected > 0);
  CHECK(parsed > 0);
}

}  // namespace

TEST_CASE("mutated and truncated synthetic models never crash the reader", "[gguf][fuzz]") {
  fuzz(synthetic_model(), 5000, 1);
}

TEST_CASE("mutated and truncated stories260K never crashes the reader", "[gguf][fuzz][shared]") {
  fuzz(test::read_bytes(test::shared_file("models/stories260K.gguf")), 3000, 2);
}
