// How a request wants its tokens chosen, and why a sequence ended.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/types.hpp"

namespace troupe {

struct SamplingParams {
  float temperature = 1.0f;           // 0: greedy (argmax, lowest id on ties)
  std::int32_t top_k = 0;             // 0 or -1: off
  float top_p = 1.0f;                 // 1: off
  float min_p = 0.0f;                 // 0: off; keeps tokens with p >= min_p * p_max
  std::optional<std::uint64_t> seed;  // same seed, same output
  float repetition_penalty = 1.0f;    // on prompt and output tokens (1: off)
  float presence_penalty = 0.0f;      // on output tokens
  float frequency_penalty = 0.0f;     // on output tokens, per occurrence
  // As vLLM: none (no log-probabilities computed), 0 (the sampled token's), or
  // n (the sampled token's and the n most likely).
  std::optional<std::int32_t> logprobs;
  // As vLLM's prompt_logprobs: none, 0 (each prompt token's own log-probability given the
  // tokens before it), or n (and the n most likely at that position). A request that asks
  // computes its whole prompt: the prefix cache does not serve it.
  std::optional<std::int32_t> prompt_logprobs;
  std::int32_t max_tokens = 16;
  std::int32_t min_tokens = 0;  // end-of-generation and stop ids are masked until then
  std::vector<TokenId> stop_token_ids;
  bool ignore_eos = false;
  // A grammar the output must match, as GBNF text (net/ writes it from a JSON schema, a
  // regex, a choice or GBNF); empty: free. Its end ends the output even with ignore_eos.
  std::string grammar;
  // The grammar holds from after these tokens, once the output has written them (a
  // reasoning model's end of thinking, such as "</think>"); empty: from the first token.
  std::vector<TokenId> grammar_after;
  // OpenAI's logit_bias: (token, bias in [-100, 100]) added to the token's logit before
  // penalties and sampling; sorted by token.
  std::vector<std::pair<TokenId, float>> logit_bias;

  bool operator==(const SamplingParams&) const = default;
};

enum class FinishReason {
  none,     // still running
  stop,     // an end-of-generation token, a stop token id or a stop string
  length,   // max_tokens or the context length
  abort,    // cancelled by the client
  timeout,  // the request's deadline passed
  error,
};

inline std::string_view finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::none:
      return "none";
    case FinishReason::stop:
      return "stop";
    case FinishReason::length:
      return "length";
    case FinishReason::abort:
      return "abort";
    case FinishReason::timeout:
      return "timeout";
    case FinishReason::error:
      return "error";
  }
  return "none";
}

}  // namespace troupe
