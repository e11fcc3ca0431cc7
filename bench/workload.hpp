// The benchmarks' requests, drawn from one seed: the same options give the same prompts
// (token ids and lengths) and output lengths in troupe bench throughput, troupe bench serve
// and troupe-gpu-bench. Standard library only, so the GPU-only build (no Boost) has it too.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "troupe/result.hpp"
#include "troupe/types.hpp"

namespace troupe::bench {

enum class Dataset {
  random,         // prompt and output lengths uniform in L*(1-R)..L*(1+R)
  anyscale,       // prompts of input_len; outputs exponential with mean output_len, in 1..4x
  shared_prefix,  // one system prompt of prefix_len tokens, then a random dataset's request
};

// "random", "anyscale" or "shared-prefix"; nothing for any other name.
std::optional<Dataset> parse_dataset(std::string_view name);

// Prompt ids are uniform in [kFirstPromptToken, vocab_size): past <unk> <s> </s> and the 256
// byte tokens of SentencePiece vocabularies (Llama-2's, the built-in one), whose normal pieces
// start here. A tool that knows only the vocabulary's size draws the same ids as one that
// holds the tokenizer.
inline constexpr TokenId kFirstPromptToken = 259;

struct WorkloadOptions {
  Dataset dataset = Dataset::random;
  std::int32_t num_prompts = 256;
  std::int32_t input_len = 512;   // shared-prefix: the tokens after the system prompt
  std::int32_t output_len = 128;  // anyscale: the mean
  std::int32_t prefix_len = 512;  // shared-prefix only
  double range_ratio = 0.0;       // random and shared-prefix; lengths below 1 become 1
  std::int32_t vocab_size = 32000;
  std::uint64_t seed = 0;
};

struct BenchRequest {
  std::vector<TokenId> prompt;
  std::int32_t output_len = 0;
};

// An error unless input_len and output_len are positive, num_prompts and range_ratio are not
// negative and vocab_size is above kFirstPromptToken.
Result<std::vector<BenchRequest>> make_workload(const WorkloadOptions& options);

}  // namespace troupe::bench
