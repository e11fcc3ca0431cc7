// The engine's step loop, once: the registry of live requests and the scheduler,
// with no threads, actors or I/O. A driver (the scheduler actor, BatchGenerator,
// the GPU benchmark) adds and cancels requests, asks for the next step's work,
// hands it to a worker, and applies the worker's output, which turns into one
// update per request: a token, its end, or both.
#pragma once

#include <any>
#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/scheduler.hpp"
#include "engine/token_budget.hpp"
#include "engine/worker_protocol.hpp"
#include "troupe/logprobs.hpp"
#include "troupe/stats.hpp"

namespace troupe::engine {

struct CoreRequest {
  SeqId id = 0;
  std::vector<TokenId> prompt;
  SamplingParams params;
  std::int32_t priority = 0;
  std::any reply_to;  // the driver's handle for whoever hears of this request
  // The LoRA adapter its sequence runs with: the worker model's slot
  // (model::LlamaModel::attach_adapter), 0 for the base model.
  std::int32_t adapter = 0;
  // Internal (no API field): the tokens an earlier run of this request generated and sent
  // (its worker or node was lost). The sequence starts as prompt + these, they count as
  // generated (max_tokens, penalties, min_tokens, the grammar, the draws' position), and
  // only the tokens after them are sent. Empty: a fresh request.
  std::vector<TokenId> resumed = {};
};

// What happened to one request in a step (or when it was cancelled): what the one
// who listens for the request hears. A plain value (it may cross to another process).
struct RequestEvent {
  SeqId id = 0;
  model::SampledToken token;  // token.id is kNoToken when the event carries none
  FinishReason finish_reason = FinishReason::none;
  std::string error;
  ErrorCode error_code = ErrorCode::internal;  // whose fault: invalid_argument, the request's
  std::int32_t num_cached_tokens = 0;          // prompt tokens the prefix cache served
  std::chrono::steady_clock::time_point first_scheduled;  // its first step
  // With the request's first token (or its end, when it ends before any, once they are
  // all known), when it asked for prompt_logprobs: prompt positions 1 .. n-1.
  std::vector<PromptLogprob> prompt_logprobs = {};
};

// An event with the driver's handle for its listener.
struct AddressedEvent : RequestEvent {
  std::any reply_to;
};

// A request's first token: how long after add() it came.
struct FirstToken {
  SeqId id = 0;
  double seconds = 0.0;
};

struct AppliedStep {
  std::vector<AddressedEvent> updates;
  BatchPlan plan;                        // the step's work (who ran, how many tokens each)
  std::vector<FirstToken> first_tokens;  // requests whose first token came in this step
  std::int32_t num_tokens = 0;           // run through the model
  std::int32_t num_decodes = 0;          // of which one-token decodes
  std::int32_t num_generated = 0;        // tokens sampled (a prompt's first token included)
  // Speculative decoding: per chunk of `plan` that samples, in plan order, the proposed
  // tokens verification accepted (empty when the step had no draft).
  std::vector<std::int32_t> num_accepted;
  double worker_seconds = 0.0;
  bool worker_lost = false;  // the worker must be replaced (then call reset_worker)
};

// Speculative decoding's counts, as vLLM's spec-decode metrics: drafts (a sequence's
// proposal in one step), their tokens, the tokens accepted, and accepted by position.
struct SpecDecodeCounters {
  std::int64_t num_drafts = 0;
  std::int64_t num_draft_tokens = 0;
  std::int64_t num_accepted_tokens = 0;
  std::vector<std::int64_t> num_accepted_tokens_per_pos;  // [k]: accepted at position i

  bool operator==(const SpecDecodeCounters&) const = default;
};

struct CoreCounters {
  std::int64_t num_steps = 0;
  std::int64_t num_step_tokens = 0;
  std::int64_t num_step_sequences = 0;
  std::int64_t num_prompt_tokens = 0;     // prompt tokens run through the model (not cached)
  std::int64_t num_generated_tokens = 0;  // tokens sampled
  double peak_kv_usage = 0.0;
  std::int64_t num_worker_restarts = 0;
  double step_seconds = 0.0;          // in the worker, as it reported
  std::int64_t num_decode_steps = 0;  // steps that carried decodes only
  double decode_step_seconds = 0.0;   // their time in the worker
  double schedule_seconds = 0.0;      // in next_step() and apply()
  SpecDecodeCounters spec;
};

class EngineCore {
 public:
  // `end_of_generation`: the vocabulary's EOS-like ids, which end a sequence. With
  // `token_budget`, each step's token budget is chosen from the measured cost of the
  // steps before it (up to config.max_num_batched_tokens); without, it is that number.
  EngineCore(const SchedulerConfig& config, std::vector<TokenId> end_of_generation,
             std::optional<TokenBudgetConfig> token_budget = std::nullopt);

  // Queues a request; refused (with the scheduler's reason) when it cannot fit.
  Result<void> add(CoreRequest request);
  // Ends a request now: its blocks are free when this returns, and the worker forgets
  // it with the next step. Nothing when it is unknown or over.
  std::optional<AddressedEvent> cancel(SeqId id, FinishReason reason, std::string error = {},
                                       ErrorCode error_code = ErrorCode::internal);
  // Ends every request (shutdown, or no worker can be made).
  std::vector<AddressedEvent> end_all(FinishReason reason, const std::string& error);

  // The next step's work, or nothing when config.max_steps_in_flight steps are in flight
  // or nothing can run. Steps in flight together hold disjoint sequences.
  std::optional<StepWork> next_step();
  // Applies the output of the oldest step in flight (steps apply in the order they were
  // issued; the driver holds back a later step's output that comes first). A fatal failure
  // loses every step in flight: their sequences resume on the next worker (reset_worker).
  AppliedStep apply(const StepOutput& output);
  // A new worker took over: the KV memory is gone, so every running sequence is
  // recomputed and every live request is announced to the worker again, with the tokens
  // it generated (its sampler resumes). Returns how many requests the old worker had
  // started (migrated: they resume on the new one).
  std::int64_t reset_worker();
  // How often one request may lose its worker in a step and resume on the next (a request
  // that kills every worker it runs on ends with the error after that).
  static constexpr std::int32_t kMaxMigrations = 3;
  // A worker's calibration steps (its load report): the token budget starts from
  // them, forgetting what the last worker measured. Nothing without a token budget.
  void calibrate(std::span<const StepCost> steps);

  // The worker is gone with its KV memory and its samplers' state (a lost node), and
  // the step in flight with it. Every live request leaves this core to run elsewhere:
  // those that have produced no token unseen by their callers, the others with the tokens
  // they sent (CoreRequest::resumed), to continue their streams; `ended` stays empty
  // (kept for requests that cannot move).
  struct LostWorker {
    std::vector<CoreRequest> unstarted;  // in arrival order (the moved ones too)
    std::int64_t num_resumed = 0;        // of them, those that carry resumed tokens
    std::vector<AddressedEvent> ended;
  };
  LostWorker lose_worker(const std::string& error);
  // The waiting requests (a preempted one with the tokens it sent) leave this core to run
  // elsewhere, as lose_worker's do; the running ones and the step in flight stay (a
  // replica draining off its node). The worker forgets those it held.
  LostWorker take_waiting();

  bool step_in_flight() const { return !in_flight_.empty(); }
  // The id of the oldest step in flight, the one apply() takes next (0 when none).
  std::uint64_t step_in_flight_id() const {
    return in_flight_.empty() ? 0 : in_flight_.front().step_id;
  }
  // Whether step `step_id` is in flight (not applied, nor lost with its worker).
  bool in_flight(std::uint64_t step_id) const;
  std::size_t num_steps_in_flight() const { return in_flight_.size(); }
  bool has_work() const { return scheduler_.has_unfinished(); }
  std::size_t num_requests() const { return requests_.size(); }
  const Scheduler& scheduler() const { return scheduler_; }
  // A LoRA adapter slot now holds another adapter (or none): its cached prefixes go.
  void forget_adapter(std::int32_t slot) { scheduler_.forget_adapter(slot); }
  // The budget sized to the machine (null when the budget is a fixed number).
  const TokenBudget* token_budget() const { return token_budget_ ? &*token_budget_ : nullptr; }
  const CoreCounters& counters() const { return counters_; }
  // The engine's numbers as far as the loop knows them (all but the live actors).
  EngineStats stats() const;

 private:
  struct LiveRequest {
    SamplingParams params;
    std::any reply_to;
    bool announced = false;  // the worker holds its sampler
    std::chrono::steady_clock::time_point first_scheduled;
    std::chrono::steady_clock::time_point arrival;  // add()
    bool has_token = false;                         // its first token has come
    std::chrono::steady_clock::time_point first_token;
    std::int32_t num_after_first = 0;  // tokens since the first (TPOT's count)
    // prompt_logprobs: entry p scores prompt position p + 1, filled as chunks run (from
    // position 0: a scored prompt is never served by the prefix cache).
    std::vector<PromptLogprob> prompt_logprobs;
    std::int32_t num_scored = 0;  // entries [0, num_scored) are known
    bool prompt_logprobs_sent = false;
    std::int32_t num_migrations = 0;  // workers lost under it in a step (kMaxMigrations)
  };
  struct InFlight {
    BatchPlan plan;
    std::vector<SeqId> sampled_ids;
    std::vector<model::PromptRows> prompt_rows;
    std::vector<std::int32_t> num_drafts;  // per sampled sequence (empty: no drafts)
    std::uint64_t step_id = 0;
  };
  // Whether the worker's accepted tokens fit the drafts the step sent.
  static bool drafts_match(const InFlight& step, const StepOutput& output);
  // Counts the step's drafts and what verification accepted of them.
  void note_speculation(const InFlight& step, const StepOutput& output);

  // Takes `ids` out (lose_worker, take_waiting): each into `lost.unstarted` with its
  // tokens, or (not in the scheduler) ended with `error`.
  void move_out(std::span<const SeqId> ids, const std::string& error, LostWorker& lost);
  AddressedEvent end_update(SeqId id, LiveRequest& request, FinishReason reason, std::string error,
                            ErrorCode error_code = ErrorCode::internal);
  // Whether the worker's prompt scores are the ones the step asked for.
  static bool scores_match(const InFlight& step, const StepOutput& output);
  // The request's first token, once: its time from add() goes to `applied`.
  static void note_first_token(SeqId id, LiveRequest& request, const model::SampledToken& token,
                               AppliedStep& applied);
  // With a TPOT objective: the longest next step that keeps every decoding stream within
  // it (tpot_step_seconds); none when no stream decodes.
  std::optional<double> slo_step_seconds(std::chrono::steady_clock::time_point now);
  // Whether a waiting request has waited backlog_wait_seconds for a seat.
  bool backlogged(std::chrono::steady_clock::time_point now) const;
  // Keeps a step's prompt scores with their requests.
  void keep_scores(const StepOutput& output);
  // The request's prompt_logprobs for its first event: once, and only when all are known.
  static void attach_prompt_logprobs(LiveRequest& request, RequestEvent& event);
  void forget(SeqId id);
  // A failed step: fatal, every step in flight is lost with the worker (all of `steps`).
  AppliedStep fail_steps(std::span<const InFlight> steps, const WorkerError& error);

  Scheduler scheduler_;
  std::optional<TokenBudget> token_budget_;
  std::vector<TokenId> end_of_generation_;
  std::unordered_map<SeqId, LiveRequest> requests_;
  std::vector<std::uint64_t> removed_;  // for the worker, with the next step
  std::deque<InFlight> in_flight_;      // in the order they were issued
  std::uint64_t next_step_id_ = 1;
  std::vector<StreamProgress> progress_;  // slo_step_seconds' scratch
  CoreCounters counters_;
};

}  // namespace troupe::engine
