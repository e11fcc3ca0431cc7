// The token budget of a step sized to the machine (Sarathi-Serve's principle):
// prefill runs in pieces small enough that a step carrying one stays under a target
// inter-token latency, so running decodes never stall behind a long prompt. Pure:
// it is fed what each step cost and holds no clock.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

namespace troupe::engine {

// What one step cost the worker.
struct StepCost {
  std::int32_t num_tokens = 0;   // run through the model, decodes included
  std::int32_t num_decodes = 0;  // of which one-token decodes
  double seconds = 0.0;

  bool operator==(const StepCost&) const = default;
};

struct TokenBudgetConfig {
  double target_step_seconds = 0.150;  // the inter-token latency a decode should see
  // > 0: a step with decodes also stays within this multiple of the predicted step of
  // its decodes alone, so that a prefill chunk at most doubles (at 2) what a stream waits
  // (the stall bound of Sarathi-Serve); 0: the target alone.
  double decode_step_multiple = 0.0;
  // With decode_step_multiple: once a request has waited this long without a seat (none of
  // its prompt has run), the step beside decodes takes target_step_seconds alone. Prompts
  // then queue faster than steps held to the decodes' own clear them (past saturation), and
  // each small step pays the step's fixed part again: goodput goes to throughput and to the
  // queue's TTFT, while the target still bounds what a stream waits. Negative: never.
  double backlog_wait_seconds = -1.0;
  std::int32_t max_tokens = 2048;  // the most a step carries (the worker's activations)
  // A step's prefill share is a multiple of this (the block size: chunks stay
  // block-aligned for the prefix cache), and at least one of it, so that prompts
  // progress even when the decodes alone overrun the target.
  std::int32_t granularity = 16;
  // The budget beside decodes before any step is measured (no calibration).
  std::int32_t initial_tokens = 256;
  // The weight a measurement keeps per later step: about the last 1 / (1 - f) steps
  // count, so the model follows costs that change (contexts grow, the machine is shared)
  // and is fitted near the sizes the steps now have.
  double forgetting = 0.9;
  // Exploration (0: none). Steps of one size cannot show the slope: a load that keeps
  // every step at the budget would keep a wrong slope (a calibration taken on a busy
  // machine) for a server's whole life, the budget stuck where the wrong line puts it.
  // So a step offers more prefill than the model allows (a probe: half the prefill share
  // more, at least a granule) when probe_period steps have passed since the last; each
  // probe that comes within probe_tolerance of its prediction doubles the period (up to
  // max_probe_period), and one that does not brings it back to probe_period.
  std::int32_t probe_period = 2;
  std::int32_t max_probe_period = 64;
  double probe_tolerance = 0.1;
  // A TPOT objective (> 0; --target-tpot-ms): EngineCore then sizes each step beside
  // decodes by the running streams' slack instead of the target above: the longest step
  // after which every stream's time per output token since its first stays within
  // tpot_margin x this (tpot_step_seconds), so that prefill gets every moment the streams
  // can spare and the queue clears for TTFT.
  double target_tpot_seconds = 0.0;
  double tpot_margin = 0.9;  // for what the step's timing misses (the HTTP path, sampling)
};

// seconds = fixed + per_token * tokens: a step's fixed part (reading the weights, the
// step's frame) and what each token adds (the matmuls, its attention).
struct LinearStepCost {
  double fixed_seconds = 0.0;
  double seconds_per_token = 0.0;

  double predict(std::int32_t num_tokens) const {
    return fixed_seconds + seconds_per_token * num_tokens;
  }
};

// A decoding stream's progress, for a TPOT objective: tokens since its first, and seconds.
struct StreamProgress {
  std::int32_t num_after_first = 0;
  double seconds_since_first = 0.0;
};

// With config.target_tpot_seconds: the longest next step after which every stream's time
// per output token since its first, (seconds + step) / (tokens + 1), stays within
// tpot_margin x the objective; negative for a stream already behind. None without an
// objective or with no stream.
std::optional<double> tpot_step_seconds(const TokenBudgetConfig& config,
                                        std::span<const StreamProgress> streams);

class TokenBudget {
 public:
  explicit TokenBudget(const TokenBudgetConfig& config);

  // Starts afresh from a worker's calibration steps (at load, of at least two sizes):
  // what was measured before is forgotten (a new worker may be another machine).
  // Steps all of one size set only the fixed part.
  void calibrate(std::span<const StepCost> steps);
  // One more measured step.
  void observe(const StepCost& step);

  // The tokens the next step may carry when `num_decodes` running sequences decode in
  // it: with none, everything (no decode waits on the step); else the decodes and the
  // most prefill tokens whose predicted step time stays within target_seconds, rounded
  // down to the granularity, at least one granule, at most max_tokens.
  std::int32_t budget(std::int32_t num_decodes) const;
  // The same for a step that may take `seconds` (beside decodes: at least a granule of
  // prefill, at most max_tokens).
  std::int32_t budget_within(std::int32_t num_decodes, double seconds) const;
  // What the next step may carry: budget() (or budget_within(seconds) when given), or
  // more when a probe is due (see TokenBudgetConfig::probe_period). Only the steps
  // observed decide it: a probe offered but not filled (too little prefill waiting) is
  // offered again. Call once per step, before the step is observed.
  std::int32_t step_budget(std::int32_t num_decodes, std::optional<double> seconds = std::nullopt);
  // The step time a step with `num_decodes` decodes aims for: the target, or less where
  // decode_step_multiple bounds it by the decodes' own step (once a measured model has a
  // positive fixed part to predict that step from).
  double target_seconds(std::int32_t num_decodes) const;

  const LinearStepCost& model() const { return model_; }
  const TokenBudgetConfig& config() const { return config_; }
  // Steps measured so far (calibration included).
  std::int64_t num_observed() const { return num_observed_; }
  // Steps that carried more than budget() allowed them (probes), and the period between
  // probes now.
  std::int64_t num_probes() const { return num_probes_; }
  std::int32_t probe_period() const { return probe_period_; }

 private:
  void refit();
  // A probe's extra prefill beside the steady budget (0: none fits under max_tokens).
  std::int32_t probe_tokens(std::int32_t num_decodes, std::int32_t steady) const;

  TokenBudgetConfig config_;
  LinearStepCost model_;
  // Exponentially forgotten sums over the measured steps: weights, tokens, seconds.
  double sum_w_ = 0.0, sum_x_ = 0.0, sum_y_ = 0.0, sum_xx_ = 0.0, sum_xy_ = 0.0;
  std::int64_t num_observed_ = 0;
  std::int64_t num_probes_ = 0;
  std::int32_t probe_period_ = 0;
  std::int32_t steps_since_probe_ = 0;
  // The steady budget step_budget offered for the step to be observed next: a step past
  // it was a probe.
  std::optional<std::int32_t> offered_;
};

}  // namespace troupe::engine
