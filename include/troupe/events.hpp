// A request as the engine takes it, and the events of its stream.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "troupe/logprobs.hpp"
#include "troupe/result.hpp"
#include "troupe/sampling.hpp"
#include "troupe/types.hpp"

namespace troupe {

struct GenerateRequest {
  std::vector<TokenId> prompt;
  SamplingParams params;
  std::vector<std::string> stop;  // stop strings (cut from the output)
  // vLLM's: the output's text shows control tokens (as the vocabulary spells them) unless
  // skip_special_tokens; and the stop string, or the EOS or stop token, that ended it when
  // include_stop_str_in_output.
  bool skip_special_tokens = true;
  bool include_stop_str_in_output = false;
  std::int32_t priority = 0;  // lower is more urgent (policy priority)
  // Which LoRA adapter computes it: EngineConfig::lora_adapters[lora_adapter - 1]; 0: the
  // base model. The request's, not SamplingParams': it picks the model, not the draw.
  std::int32_t lora_adapter = 0;
  std::chrono::milliseconds timeout{
      0};  // 0: none; else the request ends with FinishReason::timeout
};

// One event of a request's stream: a token (and the text it completed), or the end.
struct TokenEvent {
  RequestId request_id = 0;
  TokenId token = kNoToken;  // kNoToken on an end event that carries no token
  std::string text;          // new text, whole UTF-8 characters (may be empty)
  float logprob = 0.0f;
  std::vector<TokenLogprob> top_logprobs;
  bool finished = false;
  FinishReason finish_reason = FinishReason::none;
  std::string error;  // when finish_reason is error
  // Whose fault the error is: invalid_argument, the request's (a constraint that cannot be
  // followed: 400); internal or unavailable, the server's (a lost node: 500, 503).
  ErrorCode error_code = ErrorCode::internal;
  // On the request's first event, when it asked for prompt_logprobs: one entry for each
  // prompt position from 1 (position 0 has no context; vLLM's null).
  std::vector<PromptLogprob> prompt_logprobs;
  // Set on the end event.
  std::int32_t num_prompt_tokens = 0;
  std::int32_t num_cached_tokens = 0;  // prompt tokens served by the prefix cache
  std::int32_t num_generated_tokens = 0;
};

using TokenCallback = std::function<void(const TokenEvent&)>;

}  // namespace troupe
