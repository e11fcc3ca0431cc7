// One request's sequence as the scheduler sees it: its tokens, how many of
// them have KV in the cache, the blocks that hold them, and where it stands.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/stop_rule.hpp"
#include "troupe/sampling.hpp"
#include "troupe/types.hpp"

namespace troupe::engine {

using SeqId = std::uint64_t;
using BlockId = std::int32_t;
inline constexpr BlockId kNoBlock = -1;

enum class SequenceStatus {
  waiting,    // admitted to the queue, holds no blocks
  running,    // holds blocks; prefilling (in chunks) or decoding
  preempted,  // lost its blocks to others; waits to recompute its tokens
  finished,   // done, with a FinishReason; holds no blocks
};

struct Sequence {
  SeqId id = 0;
  std::vector<TokenId> tokens;  // the prompt, then every generated token
  std::int32_t num_prompt_tokens = 0;
  std::int32_t max_tokens = 16;  // most tokens to generate
  std::int32_t priority = 0;     // lower is more urgent (policy `priority`)
  std::uint64_t arrival = 0;     // order of arrival, for ties and fcfs
  StopRule stop;
  SequenceStatus status = SequenceStatus::waiting;

  std::int32_t num_computed_tokens = 0;  // tokens whose keys and values are in the cache
  // Of those, the leading ones whose keys and values the worker's draft model has in its
  // own cache (speculative decoding with a draft model); it sees the rest when it next
  // proposes for the sequence.
  std::int32_t num_draft_computed = 0;
  std::int32_t num_cached_tokens = 0;      // of those, found in the prefix cache on admission
  std::vector<BlockId> block_table;        // covers at least num_computed_tokens
  std::int32_t num_registered_blocks = 0;  // leading full blocks entered in the prefix cache
  bool prefix_cache_open = true;           // false once a block of it was a duplicate
  std::int32_t num_preemptions = 0;
  // The LoRA adapter slot its rows run with (0: the base model); its prefix-cache blocks are
  // that adapter's alone.
  std::int32_t adapter = 0;
  // SamplingParams::prompt_logprobs: the prompt's rows are scored until the first token.
  std::optional<std::int32_t> prompt_logprobs = std::nullopt;
  // Its recent drafts' acceptance (accepted of proposed, a moving average from 1), and
  // while that is poor, the decodes left without proposals and the next such pause.
  float draft_acceptance = 1.0f;
  std::int32_t draft_pause = 0;
  std::int32_t draft_backoff = 0;

  std::int32_t num_tokens() const { return static_cast<std::int32_t>(tokens.size()); }
  std::int32_t num_generated() const { return num_tokens() - num_prompt_tokens; }
  // Whether its prefill scores the prompt: every prompt row must run (no cached prefix).
  bool scores_prompt() const { return prompt_logprobs.has_value() && num_generated() == 0; }
  bool is_prefilling() const { return num_computed_tokens < num_tokens() - 1; }
};

}  // namespace troupe::engine
