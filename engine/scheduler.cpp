#include "engine/scheduler.hpp"

#include <algorithm>
#include <limits>
#include <string>
#include <unordered_set>

namespace troupe::engine {

namespace {

// Larger is less urgent: the order in which victims are chosen.
bool less_urgent(const Sequence& a, const Sequence& b, SchedulingPolicy policy) {
  if (policy == SchedulingPolicy::priority && a.priority != b.priority)
    return a.priority > b.priority;
  return a.arrival > b.arrival;
}

}  // namespace

Scheduler::Scheduler(const SchedulerConfig& config)
    : config_(config),
      token_budget_(config.max_num_batched_tokens),
      kv_(config.num_blocks, config.block_size, config.enable_prefix_caching) {
  TROUPE_ASSERT(config.num_blocks > 0 && config.block_size > 0 && config.max_num_seqs > 0 &&
                    config.max_num_batched_tokens > 0 && config.max_model_len > 1 &&
                    config.max_steps_in_flight > 0,
                "scheduler limits must be positive");
}

Result<void> Scheduler::add(SequenceRequest request) {
  const auto n = static_cast<std::int32_t>(request.prompt.size());
  if (n == 0) return make_error(ErrorCode::invalid_argument, "the prompt is empty");
  if (sequences_.contains(request.id)) {
    return make_error(ErrorCode::invalid_argument,
                      "sequence " + std::to_string(request.id) + " is already queued");
  }
  if (request.adapter < 0) {
    return make_error(ErrorCode::invalid_argument, "a LoRA adapter slot is negative");
  }
  if (request.max_tokens < 1) {
    return make_error(ErrorCode::invalid_argument, "max_tokens must be at least 1");
  }
  const auto num_generated = static_cast<std::int32_t>(request.generated.size());
  if (num_generated >= request.max_tokens) {
    return make_error(ErrorCode::invalid_argument,
                      "a resumed sequence has generated " + std::to_string(num_generated) +
                          " tokens already, which leaves none of its max_tokens " +
                          std::to_string(request.max_tokens));
  }
  if (n + num_generated >= config_.max_model_len) {
    if (num_generated > 0) {
      return make_error(ErrorCode::out_of_range,
                        "a resumed sequence's prompt and generated tokens fill the model's "
                        "context of " +
                            std::to_string(config_.max_model_len) + " tokens");
    }
    return make_error(ErrorCode::out_of_range, "the prompt has " + std::to_string(n) +
                                                   " tokens; the model's context is " +
                                                   std::to_string(config_.max_model_len) +
                                                   " tokens, which leaves no room to generate");
  }
  if (kv_.blocks_for(n + num_generated + 1) > config_.num_blocks) {
    return make_error(ErrorCode::out_of_range,
                      "the prompt has " + std::to_string(n) +
                          " tokens but the KV cache holds only " +
                          std::to_string(config_.num_blocks * config_.block_size));
  }
  Sequence seq;
  seq.id = request.id;
  seq.tokens = std::move(request.prompt);
  seq.tokens.insert(seq.tokens.end(), request.generated.begin(), request.generated.end());
  seq.num_prompt_tokens = n;
  seq.max_tokens = request.max_tokens;
  seq.stop = std::move(request.stop);
  seq.priority = request.priority;
  seq.arrival = next_arrival_++;
  seq.prompt_logprobs = request.prompt_logprobs;
  seq.adapter = request.adapter;
  sequences_.emplace(seq.id, std::move(seq));
  enqueue_waiting(request.id, false);
  return {};
}

void Scheduler::enqueue_waiting(SeqId id, bool at_front) {
  Sequence& seq = sequences_.at(id);
  seq.status = seq.status == SequenceStatus::running ? SequenceStatus::preempted : seq.status;
  if (config_.policy == SchedulingPolicy::priority) {
    // Sorted by (priority, arrival): a preempted sequence goes back to its place.
    const auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](SeqId other) {
      return less_urgent(sequences_.at(other), seq, config_.policy);
    });
    waiting_.insert(it, id);
  } else if (at_front) {
    waiting_.push_front(id);
  } else {
    waiting_.push_back(id);
  }
}

bool Scheduler::abort(SeqId id) {
  const auto it = sequences_.find(id);
  if (it == sequences_.end()) return false;
  finish(it->second);
  return true;
}

void Scheduler::finish(Sequence& seq) {
  kv_.free(seq);
  const SeqId id = seq.id;
  in_flight_.erase(id);
  std::erase(running_, id);
  if (const auto w = std::find(waiting_.begin(), waiting_.end(), id); w != waiting_.end()) {
    waiting_.erase(w);
  }
  sequences_.erase(id);
}

void Scheduler::set_token_budget(std::int32_t num_tokens) {
  token_budget_ = std::clamp(num_tokens, 1, config_.max_num_batched_tokens);
}

std::int32_t Scheduler::num_decoding() const {
  return static_cast<std::int32_t>(std::count_if(running_.begin(), running_.end(), [&](SeqId id) {
    return !sequences_.at(id).is_prefilling();
  }));
}

bool Scheduler::admits_new_sequences() const {
  return config_.mode == BatchingMode::continuous || running_.empty();
}

void Scheduler::start(const BatchPlan& plan) {
  for (const ScheduledChunk& chunk : plan.chunks) in_flight_.insert(chunk.id);
}

std::int32_t Scheduler::step_share() const {
  // A static batch is one: it is admitted whole (and the steps after it wait for it).
  if (config_.max_steps_in_flight <= 1 || config_.mode != BatchingMode::continuous) {
    return std::numeric_limits<std::int32_t>::max();
  }
  // The live sequences split between the steps in flight: while one step runs some, the
  // next takes the others (a step that took all would leave the next none).
  const auto live = static_cast<std::int32_t>(running_.size() + waiting_.size());
  return std::max(1, (live + config_.max_steps_in_flight - 1) / config_.max_steps_in_flight);
}

BatchPlan Scheduler::schedule() {
  BatchPlan plan;
  // Static batching prefills its whole batch at once, whatever the budget.
  std::int32_t budget = config_.mode == BatchingMode::continuous
                            ? token_budget_
                            : std::numeric_limits<std::int32_t>::max();
  schedule_running(plan, budget);
  // After a preemption, nothing new is admitted this iteration: room is short.
  if (plan.preempted.empty() && admits_new_sequences()) schedule_waiting(plan, budget);
  return plan;
}

void Scheduler::schedule_running(BatchPlan& plan, std::int32_t& budget) {
  // First the decodes (one token each: stall-free), then the unfinished prefills.
  // A sequence in a step in flight waits for its output (its next token follows it), and
  // a step takes at most its share of the sequences.
  const auto share = static_cast<std::size_t>(step_share());
  std::vector<SeqId> order;
  order.reserve(running_.size());
  for (SeqId id : running_) {
    if (!sequences_.at(id).is_prefilling() && !in_flight(id) && order.size() < share) {
      order.push_back(id);
    }
  }
  const auto num_decodes = static_cast<std::int32_t>(order.size());
  for (SeqId id : running_) {
    if (sequences_.at(id).is_prefilling() && !in_flight(id) && order.size() < share) {
      order.push_back(id);
    }
  }
  // Speculative decoding: only while the sequences are few enough that a step's cost is
  // reading the weights, not computing with them. They count running and waiting (vLLM
  // counts its queue too): while a queue waits to prefill, the steps are compute-bound
  // already, and a draft would take budget from the prompts (a draft model's passes and
  // catching up delay every sequence of the step) for a speed-up that ends as soon as
  // those prompts decode.
  const SpeculativeConfig& spec = config_.speculation;
  const auto num_live = running_.size() + waiting_.size();
  const bool speculate = spec.enabled() && config_.mode == BatchingMode::continuous &&
                         num_live <= static_cast<std::size_t>(spec.disable_by_batch_size);
  // With prompts to prefill, a draft model's catching up takes a share of the budget only.
  const bool prompts_wait =
      !waiting_.empty() || static_cast<std::size_t>(num_decodes) < order.size();
  const std::int32_t most_catch_up =
      prompts_wait ? std::max(2, token_budget_ / kCatchUpShare) : token_budget_;
  for (SeqId id : order) {
    if (budget <= 0) break;
    const auto it = sequences_.find(id);
    if (it == sequences_.end() || it->second.status != SequenceStatus::running)
      continue;  // preempted
    Sequence& seq = it->second;
    // A draft never takes the token a later decode of this step needs.
    const std::int32_t later_decodes =
        std::max<std::int32_t>(0, num_decodes - 1 - plan.num_decodes);
    ScheduledChunk chunk{id};
    if (speculate && seq.draft_pause > 0 && seq.num_tokens() - seq.num_computed_tokens == 1) {
      --seq.draft_pause;  // its drafts were poor lately: a plain decode
    } else if (speculate) {
      plan_draft(seq, budget - later_decodes, most_catch_up, chunk);
    }
    // A draft takes only free blocks: it never preempts anyone.
    if (!chunk.draft.empty() &&
        !kv_.allocate_slots(seq, 1 + static_cast<std::int32_t>(chunk.draft.size()))) {
      // No blocks for the draft: the draft model still catches up (it writes only blocks
      // the sequence holds), short of the decode's own token.
      chunk.draft.clear();
      chunk.draft_to = std::max(chunk.draft_from, chunk.draft_to - 1);
    }
    const auto num_draft = static_cast<std::int32_t>(chunk.draft.size());
    chunk.num_new_tokens = num_draft == 0
                               ? std::min(seq.num_tokens() - seq.num_computed_tokens, budget)
                               : 1 + num_draft;
    if (num_draft == 0 && !reserve(seq, chunk.num_new_tokens, plan, budget)) continue;
    chunk.samples = seq.num_computed_tokens + chunk.num_new_tokens - num_draft == seq.num_tokens();
    // The draft model's catching up is compute as a prefill's tokens are: it counts in the
    // budget (its proposing passes, one token a sequence each, do not).
    const std::int32_t num_catch_up =
        chunk.draft_to - chunk.draft_from - (num_draft > 0 && chunk.runs_draft_model() ? 1 : 0);
    plan.num_draft_tokens += num_draft;
    plan.num_catch_up_tokens += num_catch_up;
    plan.num_tokens += chunk.num_new_tokens;
    budget -= chunk.num_new_tokens + num_catch_up;
    plan.chunks.push_back(std::move(chunk));
    if (plan.chunks.back().is_decode()) ++plan.num_decodes;
  }
  // Decodes stay ahead of prefill chunks in the plan.
  std::stable_partition(plan.chunks.begin(), plan.chunks.end(),
                        [&](const ScheduledChunk& c) { return c.is_decode(); });
}

std::int32_t Scheduler::proposal_room(const Sequence& seq, std::int32_t budget) const {
  if (seq.num_tokens() - seq.num_computed_tokens != 1 || seq.num_generated() < 1) {
    return 0;
  }
  // The draft's tokens count in the budget; no token is proposed past max_tokens (the
  // model's own token after the draft is one more), the context, or a draft model's own
  // context (it would read positions past it).
  const SpeculativeConfig& spec = config_.speculation;
  const std::int32_t draft_room = spec.uses_draft_model() && spec.draft_context_length > 0
                                      ? spec.draft_context_length - seq.num_tokens()
                                      : spec.num_speculative_tokens;
  return std::max(0, std::min({spec.num_speculative_tokens, budget - 1,
                               seq.max_tokens - seq.num_generated() - 1,
                               config_.max_model_len - seq.num_tokens(), draft_room}));
}

void Scheduler::plan_draft(const Sequence& seq, std::int32_t budget, std::int32_t most_catch_up,
                           ScheduledChunk& chunk) const {
  const SpeculativeConfig& spec = config_.speculation;
  const std::int32_t room = proposal_room(seq, budget);
  if (room <= 0) return;
  if (!spec.uses_draft_model()) {
    chunk.draft = propose_ngram(seq.tokens, spec.prompt_lookup_min, spec.prompt_lookup_max, room);
    return;
  }
  // The draft model first runs what it has not seen before the decode's own token (after
  // the prefill, a preemption or steps without proposals); the budget holds those too, and
  // one sequence's catching up takes at most a share of the step's.
  const std::int32_t last = seq.num_tokens() - 1;
  const std::int32_t unseen = last - seq.num_draft_computed;
  // Too near its end to repay catching up: a plain decode (and so every step after).
  const std::int32_t repay = config_.draft_catch_up_repay;
  if (repay > 0 && unseen > repay * (seq.max_tokens - seq.num_generated())) return;
  chunk.draft_from = seq.num_draft_computed;
  const std::int32_t k = std::min(room, budget - 1 - unseen);
  if (k > 0 && unseen <= most_catch_up) {
    chunk.draft.assign(static_cast<std::size_t>(k), TokenId{0});
    chunk.draft_to = last + 1;
    return;
  }
  // No room to propose this step: catch up as far as the budget and the share go; by two
  // tokens at least, or not at all (the sequence grows by one a step).
  const std::int32_t catch_up = std::min({unseen, budget - 1, most_catch_up});
  chunk.draft_to = chunk.draft_from + (catch_up >= 2 ? catch_up : 0);
}

void Scheduler::note_acceptance(Sequence& seq, std::int32_t accepted, std::int32_t proposed) const {
  const float rate = static_cast<float>(accepted) / static_cast<float>(proposed);
  seq.draft_acceptance = 0.7f * seq.draft_acceptance + 0.3f * rate;
  const float poor =
      config_.speculation.uses_draft_model() ? kPoorDraftModelAcceptance : kPoorNgramAcceptance;
  if (seq.draft_acceptance < poor) {
    seq.draft_backoff = std::clamp(seq.draft_backoff * 2, kFirstDraftPause, kLongestDraftPause);
    seq.draft_pause = seq.draft_backoff;
    // After the pause it tries again from just above the bar: a poor draft then pauses it
    // again (for longer), a good one keeps it going.
    seq.draft_acceptance = poor + 0.2f;
  } else if (rate >= 0.5f) {
    seq.draft_backoff = 0;
  }
}

bool Scheduler::reserve(Sequence& seq, std::int32_t num_new_tokens, BatchPlan& plan,
                        std::int32_t& budget) {
  while (!kv_.allocate_slots(seq, num_new_tokens)) {
    Sequence* victim = pick_victim();
    // `seq` itself is one (it is running and in no step in flight).
    TROUPE_ASSERT(victim != nullptr, "a running sequence but no victim");
    preempt(*victim, plan, budget);
    if (victim == &seq) return false;
  }
  return true;
}

Sequence* Scheduler::pick_victim() {
  // Never one in a step in flight: that step writes its blocks and its output needs it.
  Sequence* victim = nullptr;
  for (SeqId id : running_) {
    if (in_flight(id)) continue;
    Sequence& s = sequences_.at(id);
    if (victim == nullptr || less_urgent(s, *victim, config_.policy)) victim = &s;
  }
  return victim;
}

void Scheduler::preempt(Sequence& victim, BatchPlan& plan, std::int32_t& budget) {
  // Preemption by recompute: the blocks go back to the pool; the sequence will
  // prefill its prompt and what it had generated again (the prefix cache may help).
  kv_.free(victim);
  victim.num_computed_tokens = 0;
  victim.num_draft_computed = 0;
  victim.num_cached_tokens = 0;
  ++victim.num_preemptions;
  ++num_preemptions_;
  std::erase(running_, victim.id);
  const auto chunk = std::find_if(plan.chunks.begin(), plan.chunks.end(),
                                  [&](const ScheduledChunk& c) { return c.id == victim.id; });
  if (chunk != plan.chunks.end()) {
    budget += chunk->num_new_tokens;
    plan.num_tokens -= chunk->num_new_tokens;
    plan.num_draft_tokens -= static_cast<std::int32_t>(chunk->draft.size());
    if (chunk->is_decode()) --plan.num_decodes;
    plan.chunks.erase(chunk);
  }
  plan.preempted.push_back(victim.id);
  enqueue_waiting(victim.id, true);
}

bool Scheduler::make_room_for(const Sequence& seq, BatchPlan& plan, std::int32_t& budget) {
  if (config_.policy != SchedulingPolicy::priority) return false;
  Sequence* victim = pick_victim();
  if (victim == nullptr || !less_urgent(*victim, seq, config_.policy)) return false;
  preempt(*victim, plan, budget);
  return true;
}

void Scheduler::schedule_waiting(BatchPlan& plan, std::int32_t& budget) {
  // Each pass admits the most urgent waiting sequence, preempts a less urgent running one
  // for it (priority policy; running_ shrinks), or stops: the loop ends.
  const auto share = static_cast<std::size_t>(step_share());
  while (!waiting_.empty() && budget > 0 && plan.chunks.size() < share) {
    const SeqId id = waiting_.front();
    Sequence& seq = sequences_.at(id);
    if (static_cast<std::int32_t>(running_.size()) >= config_.max_num_seqs) {
      if (make_room_for(seq, plan, budget)) continue;
      break;
    }
    const std::vector<BlockId> prefix = kv_.find_cached_prefix(seq);
    const auto computed = static_cast<std::int32_t>(prefix.size()) * config_.block_size;
    const std::int32_t num_new = std::min(seq.num_tokens() - computed, budget);
    if (!kv_.allocate_slots(seq, num_new, prefix)) {
      // Under fcfs a newcomer never preempts; under priority, a less urgent one gives way.
      if (make_room_for(seq, plan, budget)) continue;
      break;
    }
    waiting_.pop_front();
    seq.status = SequenceStatus::running;
    running_.push_back(id);
    const bool samples = seq.num_computed_tokens + num_new == seq.num_tokens();
    plan.chunks.push_back({id, num_new, samples});
    plan.num_tokens += num_new;
    if (plan.chunks.back().is_decode()) ++plan.num_decodes;
    budget -= num_new;
  }
}

std::vector<FinishedSequence> Scheduler::update(const BatchPlan& plan,
                                                std::span<const SampledResult> sampled) {
  std::vector<FinishedSequence> finished;
  std::size_t next = 0;
  for (const ScheduledChunk& chunk : plan.chunks) {
    const SampledResult* result = chunk.samples ? &sampled[next++] : nullptr;
    in_flight_.erase(chunk.id);
    const auto it = sequences_.find(chunk.id);
    if (it == sequences_.end()) continue;  // aborted while its step ran
    Sequence& seq = it->second;
    if (result == nullptr) {
      seq.num_computed_tokens += chunk.num_new_tokens;
      kv_.cache_full_blocks(seq);
      continue;
    }
    // The positions before the chunk's last own token are computed whatever came back.
    // With m tokens back, the last own token and the draft's first m - 1 tokens (those the
    // model's tokens confirmed) are too; with none (kNoToken: its grammar's mask was late)
    // the last position runs again in the next step, writing the same key and value into
    // the slot it already holds.
    const auto num_draft = static_cast<std::int32_t>(chunk.draft.size());
    const std::int32_t start = seq.num_computed_tokens + chunk.num_new_tokens - 1 - num_draft;
    std::int32_t num_back = 0;
    FinishReason reason = FinishReason::none;
    if (result->token != kNoToken) {
      // Each token as a plain decode would take it: the first that ends the sequence
      // ends it, and the ones after are dropped.
      for (std::size_t i = 0; i <= result->more.size() && reason == FinishReason::none; ++i) {
        const TokenId token = i == 0 ? result->token : result->more[i - 1];
        seq.tokens.push_back(token);
        ++num_back;
        if (seq.stop.stops_on(token, seq.num_generated())) {
          reason = FinishReason::stop;
        } else if (seq.num_generated() >= seq.max_tokens ||
                   seq.num_tokens() >= config_.max_model_len) {
          reason = FinishReason::length;
        }
      }
    }
    if (num_draft > 0 && result->token != kNoToken) {
      note_acceptance(seq, static_cast<std::int32_t>(result->more.size()), num_draft);
    }
    seq.num_computed_tokens = std::min(start + num_back, seq.num_tokens() - 1);
    kv_.cache_full_blocks(seq);
    // The draft model ran its range and then each proposal but the last: of those, it keeps
    // what the model computed too (a rejected proposal's slot is written again).
    if (chunk.runs_draft_model()) {
      seq.num_draft_computed = num_draft > 0 ? chunk.draft_to - 1 + num_draft : chunk.draft_to;
    }
    seq.num_draft_computed = std::min(seq.num_draft_computed, seq.num_computed_tokens);
    if (reason != FinishReason::none) {
      finished.push_back({seq.id, reason, seq.num_tokens()});
      finish(seq);
      continue;
    }
    // The rejected tokens' slots: blocks wholly past the tokens go back to the pool.
    if (num_draft > 0) kv_.release_blocks_after(seq, seq.num_tokens());
  }
  TROUPE_ASSERT(next == sampled.size(), "one sampled token per sampling chunk");
  return finished;
}

void Scheduler::reset_kv_cache() {
  BatchPlan unused;
  std::int32_t budget = 0;
  in_flight_.clear();  // the steps in flight were lost with the KV memory
  // Latest first, so that enqueueing at the front restores arrival order.
  while (!running_.empty()) preempt(sequences_.at(running_.back()), unused, budget);
  kv_.clear_prefix_cache();
}

Scheduler::AdapterCounts Scheduler::adapter_counts() const {
  AdapterCounts counts;
  const auto count = [this](SeqId id, std::vector<std::int64_t>& into) {
    const auto it = sequences_.find(id);
    if (it == sequences_.end()) return;
    const auto slot = static_cast<std::size_t>(std::max(0, it->second.adapter));
    if (into.size() <= slot) into.resize(slot + 1, 0);
    ++into[slot];
  };
  for (const SeqId id : running_) count(id, counts.running);
  for (const SeqId id : waiting_) count(id, counts.waiting);
  return counts;
}

const Sequence* Scheduler::find(SeqId id) const {
  const auto it = sequences_.find(id);
  return it == sequences_.end() ? nullptr : &it->second;
}

Result<void> Scheduler::check_invariants() const {
  auto broken = [](const std::string& what) { return make_error(ErrorCode::internal, what); };
  if (static_cast<std::int32_t>(running_.size()) > config_.max_num_seqs) {
    return broken("more running sequences than max_num_seqs");
  }
  std::vector<std::int32_t> refs(kv_.num_blocks(), 0);
  for (const auto& [id, seq] : sequences_) {
    const bool is_running = seq.status == SequenceStatus::running;
    if (!is_running && !seq.block_table.empty()) {
      return broken("waiting sequence " + std::to_string(id) + " holds blocks");
    }
    if (is_running && kv_.blocks_for(seq.num_computed_tokens) >
                          static_cast<std::int32_t>(seq.block_table.size())) {
      return broken("sequence " + std::to_string(id) + " has computed tokens without blocks");
    }
    std::unordered_set<BlockId> own(seq.block_table.begin(), seq.block_table.end());
    if (own.size() != seq.block_table.size()) {
      return broken("sequence " + std::to_string(id) + " holds a block twice");
    }
    for (BlockId b : seq.block_table) ++refs[b];
    // Blocks it registered or reused from the cache are the tree's nodes for its prefix.
    for (std::int32_t i = 0; i < seq.num_registered_blocks; ++i) {
      if (!kv_.prefix_cache().contains(seq.block_table[i])) {
        return broken("sequence " + std::to_string(id) + " lost a cached prefix block");
      }
    }
  }
  std::int32_t num_unreferenced = 0;
  for (BlockId b = 0; b < kv_.num_blocks(); ++b) {
    if (refs[b] != kv_.pool().ref_count(b)) {
      return broken("block " + std::to_string(b) + " has " +
                    std::to_string(kv_.pool().ref_count(b)) + " references but " +
                    std::to_string(refs[b]) + " holders");
    }
    num_unreferenced += refs[b] == 0 ? 1 : 0;
    if (kv_.pool().is_cached(b) != kv_.prefix_cache().contains(b)) {
      return broken("block " + std::to_string(b) + " is cached in the pool but not the tree");
    }
  }
  if (num_unreferenced != kv_.num_free_blocks()) {
    return broken(std::to_string(num_unreferenced) + " blocks are unreferenced but " +
                  std::to_string(kv_.num_free_blocks()) + " are free");
  }
  if (running_.size() + waiting_.size() != sequences_.size()) {
    return broken("a sequence is in neither queue");
  }
  for (SeqId id : in_flight_) {
    const auto it = sequences_.find(id);
    if (it == sequences_.end() || it->second.status != SequenceStatus::running) {
      return broken("sequence " + std::to_string(id) + " is in flight but not running");
    }
  }
  return {};
}

}  // namespace troupe::engine
