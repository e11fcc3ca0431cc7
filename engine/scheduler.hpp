// The scheduler: one call plans one model iteration. Continuous batching with
// chunked prefill (Orca, Sarathi-Serve): within a token budget, running decodes
// first (one token each), then unfinished prefills, then waiting sequences in
// policy order, their prompts cut to fit. When blocks run out, the
// lowest-priority, latest-arrived running sequence is preempted by recompute; under the
// priority policy, so is one less urgent than a waiting sequence that finds no seat or
// no blocks.
// A `static` mode runs the traditional batch instead, for comparison.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/kv_cache_manager.hpp"
#include "engine/ngram_proposer.hpp"
#include "engine/sequence.hpp"
#include "engine/stop_rule.hpp"
#include "troupe/config.hpp"
#include "troupe/result.hpp"

namespace troupe::engine {

struct SchedulerConfig {
  // Token budget of one iteration; with a budget set per iteration, its ceiling.
  std::int32_t max_num_batched_tokens = 2048;
  std::int32_t max_num_seqs = 256;    // most sequences running at once
  std::int32_t max_model_len = 2048;  // prompt + output
  std::int32_t num_blocks = 0;
  std::int32_t block_size = 16;
  bool enable_prefix_caching = true;
  SchedulingPolicy policy = SchedulingPolicy::fcfs;
  BatchingMode mode = BatchingMode::continuous;
  // Speculative decoding (n-gram proposals verified in the step); off by default.
  SpeculativeConfig speculation = {};
  // A draft model catches up n unseen tokens only where at least n / draft_catch_up_repay
  // tokens are left to generate (0: wherever): a sequence near its end (the tail of a
  // batch, where the sequences fall to disable_by_batch_size) would pay for the catching up
  // and never be repaid. Measured (BENCHMARKS.md, 110M F16 target, Q8_0 draft): a catch-up
  // costs about a prefill token each (0.7-0.85 ms), an accepted draft saves about 2.5 ms a
  // generated token (1.35x on 9.6 ms decodes), so catching up pays from about a third; a
  // half leaves room for acceptance below the draft's best.
  std::int32_t draft_catch_up_repay = 2;
  // Steps planned before the earlier ones are applied (a pipeline's micro-batches): each
  // takes sequences no step in flight holds, and at most its share of the live ones
  // (running and waiting, divided by this), so that the steps split them (a static batch
  // is admitted whole). 1: one at a time.
  std::int32_t max_steps_in_flight = 1;
};

struct SequenceRequest {
  SeqId id = 0;
  std::vector<TokenId> prompt;
  std::int32_t max_tokens = 16;
  std::int32_t priority = 0;
  StopRule stop = {};                                          // stop and end-of-generation ids
  std::optional<std::int32_t> prompt_logprobs = std::nullopt;  // SamplingParams::prompt_logprobs
  std::int32_t adapter = 0;  // its LoRA adapter slot (0: the base model)
  // Tokens an earlier run generated (a resumed request): they follow the prompt and count
  // as generated; fewer than max_tokens.
  std::vector<TokenId> generated = {};
};

// One sequence's share of an iteration: its next num_new_tokens tokens. A decode with a
// `draft` (speculative decoding) runs its last token and then the draft's tokens, at the
// positions after it: num_new_tokens is 1 + draft.size(), every one of them sampled.
// With a draft model, the draft is placeholders the worker's draft model fills in, after it
// has run the sequence's tokens at positions [draft_from, draft_to) (those it has not
// seen); a decode with that range and no draft only catches the draft model up.
struct ScheduledChunk {
  SeqId id = 0;
  std::int32_t num_new_tokens = 0;
  bool samples = false;             // reaches the sequence's last token: a token is sampled
  std::vector<TokenId> draft = {};  // proposed tokens the step verifies
  std::int32_t draft_from = 0;      // the draft model's tokens to run (empty range: none)
  std::int32_t draft_to = 0;

  bool runs_draft_model() const { return draft_to > draft_from; }

  // One token of its own (and its draft's) that samples: what the metrics call a decode.
  bool is_decode() const {
    return samples && num_new_tokens == 1 + static_cast<std::int32_t>(draft.size());
  }
};

struct BatchPlan {
  std::vector<ScheduledChunk> chunks;  // decodes first, then prefill chunks
  std::int32_t num_tokens = 0;         // drafts' tokens included
  std::int32_t num_decodes = 0;
  std::int32_t num_draft_tokens = 0;  // proposed tokens to verify
  // Tokens a draft model runs to catch up (outside num_tokens, inside the step's budget).
  std::int32_t num_catch_up_tokens = 0;
  std::vector<SeqId> preempted;  // in this iteration
};

// What the model produced for one sampling chunk of a plan: `token`, and after it, for a
// chunk with a draft, the tokens verification accepted (the draft's accepted prefix, then
// the model's own token where the draft was first wrong, or after its last).
struct SampledResult {
  TokenId token = kNoToken;
  std::vector<TokenId> more = {};
};

struct FinishedSequence {
  SeqId id = 0;
  FinishReason reason = FinishReason::none;
  std::int32_t num_tokens = 0;  // its tokens (prompt and output) when it ended
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& config);

  const SchedulerConfig& config() const { return config_; }
  const KvCacheManager& kv_cache() const { return kv_; }

  // Queues a new sequence. Errors: an empty prompt, a duplicate id, or a prompt that
  // leaves no room for a token within max_model_len (the message says the lengths).
  Result<void> add(SequenceRequest request);
  // Ends a sequence now (cancelled, a stop string, a deadline, an error); its
  // blocks are free before this returns. False if it is unknown or finished.
  bool abort(SeqId id);

  // The token budget of the iterations from now on (a TokenBudget sized to the
  // machine), within [1, max_num_batched_tokens]; static batching ignores it.
  void set_token_budget(std::int32_t num_tokens);
  std::int32_t token_budget() const { return token_budget_; }

  // Plans the next iteration, of sequences no step in flight holds (none is preempted).
  BatchPlan schedule();
  // The plan went to the worker: its sequences are in flight until update() applies it (or
  // abort() ends them, or reset_kv_cache() loses them) and no plan takes them meanwhile.
  void start(const BatchPlan& plan);
  bool in_flight(SeqId id) const { return in_flight_.contains(id); }
  std::size_t num_in_flight() const { return in_flight_.size(); }
  // Applies an iteration's results: `sampled` has one entry per chunk that samples,
  // in plan order; kNoToken where the row did not sample (a grammar's mask was late): the
  // chunk's last position then counts as not computed, and runs again in the next plan.
  // A chunk with a draft keeps the keys and values of its accepted tokens only: the
  // blocks past what its tokens need go back to the pool, and no block holding a
  // rejected token enters the prefix cache (only computed tokens' blocks do).
  // Returns the sequences that finished: the one place that decides a sequence ended on a
  // stop token, max_tokens or the context length.
  std::vector<FinishedSequence> update(const BatchPlan& plan,
                                       std::span<const SampledResult> sampled);

  // The KV memory behind the blocks was lost (a worker restarted): every running
  // sequence is preempted to recompute, and the prefix cache forgets everything.
  void reset_kv_cache();
  // A LoRA adapter slot now holds another adapter (or none): its cached prefixes go.
  void forget_adapter(std::int32_t slot) { kv_.forget_adapter(slot); }

  const Sequence* find(SeqId id) const;
  std::size_t num_waiting() const { return waiting_.size(); }
  // The waiting (and preempted) sequences, in policy order: none is in a step in flight.
  const std::deque<SeqId>& waiting() const { return waiting_; }
  std::size_t num_running() const { return running_.size(); }
  // Running and waiting sequences by LoRA adapter slot ([slot], 0 the base model), sized
  // to the highest slot among them plus one: the per-adapter metrics.
  struct AdapterCounts {
    std::vector<std::int64_t> running, waiting;
  };
  AdapterCounts adapter_counts() const;
  // Running sequences past their prompt: the decodes the next iteration carries.
  std::int32_t num_decoding() const;
  bool has_unfinished() const { return !waiting_.empty() || !running_.empty(); }
  std::int64_t num_preemptions() const { return num_preemptions_; }

  // Checks every invariant (reference counts match block tables, no block both
  // free and held, limits respected); the message names the first one broken.
  Result<void> check_invariants() const;

 private:
  void schedule_running(BatchPlan& plan, std::int32_t& budget);
  void schedule_waiting(BatchPlan& plan, std::int32_t& budget);
  // The most tokens `seq`'s decode may propose within `budget` (0: none).
  std::int32_t proposal_room(const Sequence& seq, std::int32_t budget) const;
  // The draft for `seq` (empty: none) within `budget`; with a draft model, k placeholders
  // and the unseen tokens it runs first (`chunk`'s draft range), or only some of those.
  // `most_catch_up`: the most tokens it may run to catch a draft model up.
  void plan_draft(const Sequence& seq, std::int32_t budget, std::int32_t most_catch_up,
                  ScheduledChunk& chunk) const;
  // After a verified draft with `accepted` of its `proposed` tokens: a sequence whose drafts
  // are mostly wrong pauses its proposals (a draft costs a verification step's extra rows,
  // and with a draft model its passes, for nothing).
  void note_acceptance(Sequence& seq, std::int32_t accepted, std::int32_t proposed) const;

 public:
  // A moving average of a sequence's acceptance below this pauses its proposals, for
  // kFirstDraftPause of its decodes that could propose, then twice as long each time it is
  // still poor, up to kLongestDraftPause. Measured at batch 1 (BENCHMARKS.md, 110M F16): a
  // verification of a few tokens costs about 1.0-1.2 decode steps, so n-gram proposals
  // (free to make) pay from about 20% accepted; a draft model's passes cost about half a
  // decode step each, so with k = 2 its proposals pay from about 60%.
  static constexpr float kPoorNgramAcceptance = 0.25f;
  static constexpr float kPoorDraftModelAcceptance = 0.5f;
  // The most of a step's budget one sequence's catching up takes while prompts wait for it
  // (prefill chunks, new sequences): they keep the rest, and a draft that has not seen a
  // long prompt catches up over several steps instead of holding them off.
  static constexpr std::int32_t kCatchUpShare = 4;  // a quarter
  static constexpr std::int32_t kFirstDraftPause = 8;
  static constexpr std::int32_t kLongestDraftPause = 64;

 private:
  bool reserve(Sequence& seq, std::int32_t num_new_tokens, BatchPlan& plan, std::int32_t& budget);
  void preempt(Sequence& victim, BatchPlan& plan, std::int32_t& budget);
  Sequence* pick_victim();
  // Policy priority: when `seq` (waiting) is more urgent than the least urgent running
  // sequence, that one is preempted to make room (a seat or blocks); false when none is.
  bool make_room_for(const Sequence& seq, BatchPlan& plan, std::int32_t& budget);
  void enqueue_waiting(SeqId id, bool at_front);
  void finish(Sequence& seq);
  bool admits_new_sequences() const;
  // The most sequences one step takes (max_steps_in_flight > 1): its share of the live ones.
  std::int32_t step_share() const;

  SchedulerConfig config_;
  std::int32_t token_budget_ = 0;  // of a continuous iteration
  KvCacheManager kv_;
  std::unordered_map<SeqId, Sequence> sequences_;  // waiting, preempted and running ones
  std::deque<SeqId> waiting_;                      // in policy order
  std::vector<SeqId> running_;                     // in admission order
  std::uint64_t next_arrival_ = 0;
  std::int64_t num_preemptions_ = 0;
  std::unordered_set<SeqId> in_flight_;  // in a step started and not yet applied
};

}  // namespace troupe::engine
