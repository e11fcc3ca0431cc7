// Whether a sequence stops on a token: an end-of-generation or stop token id, once
// min_tokens are out. Scheduler::update applies it, then max_tokens and the context
// length: the engine ends a sequence on its tokens and lengths here. Stop strings (which
// need the text) and deadlines end a request in the request actor
// (actors/request_actor.cpp), which then aborts its sequence in the engine. The sampler
// only masks those ids until min_tokens (that is sampling).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "troupe/sampling.hpp"

namespace troupe::engine {

class StopRule {
 public:
  StopRule() = default;
  // `end_of_generation`: the vocabulary's EOS-like ids (dropped when params.ignore_eos).
  // Under a grammar, the sampler lets an end token through only where the grammar can end
  // (before min_tokens only where it must): it always stops then.
  StopRule(const SamplingParams& params, std::span<const TokenId> end_of_generation)
      : stop_ids_(params.stop_token_ids),
        min_tokens_(params.grammar.empty() ? params.min_tokens : 0) {
    if (!params.ignore_eos || !params.grammar.empty())
      stop_ids_.insert(stop_ids_.end(), end_of_generation.begin(), end_of_generation.end());
  }

  // Whether the sequence stops now that `token` is its `num_generated`-th generated token.
  bool stops_on(TokenId token, std::int32_t num_generated) const {
    return num_generated >= min_tokens_ &&
           std::find(stop_ids_.begin(), stop_ids_.end(), token) != stop_ids_.end();
  }

 private:
  std::vector<TokenId> stop_ids_;
  std::int32_t min_tokens_ = 0;
};

}  // namespace troupe::engine
