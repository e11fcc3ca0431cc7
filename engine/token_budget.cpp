#include "engine/token_budget.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "troupe/result.hpp"

namespace troupe::engine {

std::optional<double> tpot_step_seconds(const TokenBudgetConfig& config,
                                        std::span<const StreamProgress> streams) {
  if (!(config.target_tpot_seconds > 0)) return std::nullopt;
  std::optional<double> least;
  for (const StreamProgress& s : streams) {
    const double allowed = config.tpot_margin * config.target_tpot_seconds *
                               (static_cast<double>(s.num_after_first) + 1.0) -
                           s.seconds_since_first;
    least = least ? std::min(*least, allowed) : allowed;
  }
  return least;
}

TokenBudget::TokenBudget(const TokenBudgetConfig& config) : config_(config) {
  TROUPE_ASSERT(config.target_step_seconds > 0 && config.max_tokens > 0 && config.granularity > 0 &&
                    config.initial_tokens > 0 && config.forgetting > 0 && config.forgetting <= 1 &&
                    config.probe_period >= 0 && config.max_probe_period >= config.probe_period &&
                    config.probe_tolerance > 0 && config.target_tpot_seconds >= 0 &&
                    config.tpot_margin > 0 && config.tpot_margin <= 1,
                "token budget settings must be positive");
  calibrate({});
}

void TokenBudget::calibrate(std::span<const StepCost> steps) {
  // Before any measurement: steps of initial_tokens fill the target exactly.
  model_ = {0.0, config_.target_step_seconds / config_.initial_tokens};
  sum_w_ = sum_x_ = sum_y_ = sum_xx_ = sum_xy_ = 0.0;
  num_observed_ = 0;
  num_probes_ = 0;
  probe_period_ = config_.probe_period;
  steps_since_probe_ = 0;
  for (const StepCost& step : steps) observe(step);
  // The calibration's sizes differ by design: its slope owes nothing to the guess.
  if (sum_w_ > 0) {
    const double mean_x = sum_x_ / sum_w_;
    const double var_x = sum_xx_ / sum_w_ - mean_x * mean_x;
    const double slope = (sum_xy_ / sum_w_ - mean_x * sum_y_ / sum_w_) / var_x;
    if (var_x > 0 && slope > 0 && std::isfinite(slope)) {
      model_ = {sum_y_ / sum_w_ - slope * mean_x, slope};
    }
  }
  // Trust in the calibration is bounded: it was measured once, at load, maybe on a busy
  // machine. Its line stays as the slope the first steps are fitted against (worth a
  // spread of a quarter granule, see refit), not as samples: two steps 255 tokens apart
  // would outweigh every later step of a load that keeps one size for tens of steps.
  sum_w_ = sum_x_ = sum_y_ = sum_xx_ = sum_xy_ = 0.0;
}

void TokenBudget::observe(const StepCost& step) {
  const std::optional<std::int32_t> offered = std::exchange(offered_, std::nullopt);
  if (step.num_tokens <= 0 || !(step.seconds >= 0) || !std::isfinite(step.seconds)) return;
  const double f = config_.forgetting;
  const double x = step.num_tokens;
  const double predicted = model_.predict(step.num_tokens);
  // A step beside decodes that carried more than the model allowed is a probe: whether it
  // came where the model said tells how far to trust the model until the next.
  if (config_.probe_period > 0 && step.num_decodes > 0 && num_observed_ >= 2) {
    ++steps_since_probe_;
    // A step far off the line (the machine changed: a neighbour came or went) puts the
    // model on trial again at once, not a long period later.
    if (predicted > 0 &&
        std::abs(step.seconds - predicted) > 2 * config_.probe_tolerance * predicted) {
      probe_period_ = config_.probe_period;
    }
    if (step.num_tokens > offered.value_or(budget(step.num_decodes))) {
      ++num_probes_;
      steps_since_probe_ = 0;
      // A line with no positive fixed part is no machine's (reading the weights costs):
      // it fits a wrong slope through the steps' one size, so it stays on trial.
      const bool confirmed =
          predicted > 0 && model_.fixed_seconds > 0 &&
          std::abs(step.seconds - predicted) <= config_.probe_tolerance * predicted;
      probe_period_ =
          confirmed ? std::min(config_.max_probe_period, 2 * probe_period_) : config_.probe_period;
    }
  }
  // Once measured, one step's surprise counts at most threefold: a step stalled by
  // something else on the machine moves the line less than a real change, which
  // persists until the line has followed it.
  const double y = num_observed_ >= 2 && predicted > 0
                       ? std::clamp(step.seconds, predicted / 3, predicted * 3)
                       : step.seconds;
  sum_w_ = f * sum_w_ + 1.0;
  sum_x_ = f * sum_x_ + x;
  sum_y_ = f * sum_y_ + y;
  sum_xx_ = f * sum_xx_ + x * x;
  sum_xy_ = f * sum_xy_ + x * y;
  ++num_observed_;
  refit();
}

void TokenBudget::refit() {
  // Weighted least squares of seconds on tokens over the remembered steps, the slope
  // held to the one known so far in proportion to how little the step sizes varied:
  // steps all of one size (decodes alone, a steady batch) cannot show a slope, so they
  // keep it and move the line through their mean; a spread of a quarter granule weighs
  // as much as the slope known so far.
  const double mean_x = sum_x_ / sum_w_;
  const double mean_y = sum_y_ / sum_w_;
  const double var_x = std::max(0.0, sum_xx_ / sum_w_ - mean_x * mean_x);
  const double cov_xy = sum_xy_ / sum_w_ - mean_x * mean_y;
  const double prior = std::max(1.0, std::pow(config_.granularity / 4.0, 2));
  const double slope = (cov_xy + prior * model_.seconds_per_token) / (var_x + prior);
  // A slope of noise that says tokens are free (or pay back) is no estimate.
  if (slope > 0 && std::isfinite(slope)) model_.seconds_per_token = slope;
  model_.fixed_seconds = mean_y - model_.seconds_per_token * mean_x;
}

double TokenBudget::target_seconds(std::int32_t num_decodes) const {
  // The decodes' own step is known only from a measured model with a fixed part (the
  // guess before any step has none, and would leave a chunk one granule).
  if (config_.decode_step_multiple <= 0 || num_observed_ == 0 || !(model_.fixed_seconds > 0)) {
    return config_.target_step_seconds;
  }
  return std::min(config_.target_step_seconds,
                  config_.decode_step_multiple * model_.predict(num_decodes));
}

std::int32_t TokenBudget::probe_tokens(std::int32_t num_decodes, std::int32_t steady) const {
  const std::int32_t granule = config_.granularity;
  const std::int32_t half_share = (steady - num_decodes) / 2 / granule * granule;
  return std::max(0, std::min(std::max(granule, half_share), config_.max_tokens - steady));
}

std::int32_t TokenBudget::step_budget(std::int32_t num_decodes, std::optional<double> seconds) {
  const std::int32_t steady =
      seconds && num_decodes > 0 ? budget_within(num_decodes, *seconds) : budget(num_decodes);
  offered_ = steady;
  // With no decode nothing waits on the step (it already gets the maximum); before a
  // measurement there is no model to test; a line with no positive fixed part is on
  // trial until it has one.
  const std::int32_t period = model_.fixed_seconds > 0 ? probe_period_ : config_.probe_period;
  if (num_decodes <= 0 || config_.probe_period <= 0 || num_observed_ < 2 ||
      steps_since_probe_ < period) {
    return steady;
  }
  return steady + probe_tokens(num_decodes, steady);
}

std::int32_t TokenBudget::budget(std::int32_t num_decodes) const {
  if (num_decodes <= 0) return config_.max_tokens;
  return budget_within(num_decodes, target_seconds(num_decodes));
}

std::int32_t TokenBudget::budget_within(std::int32_t num_decodes, double seconds) const {
  num_decodes = std::max(num_decodes, 0);
  const std::int32_t granule = config_.granularity;
  // Prefill tokens that fit beside the decodes, capped before the conversion.
  const double room =
      std::min<double>((seconds - model_.fixed_seconds) / model_.seconds_per_token - num_decodes,
                       static_cast<double>(config_.max_tokens) + granule);
  const std::int32_t prefill =
      room >= granule ? static_cast<std::int32_t>(std::floor(room / granule)) * granule : granule;
  return static_cast<std::int32_t>(
      std::min<std::int64_t>(config_.max_tokens, std::int64_t{num_decodes} + prefill));
}

}  // namespace troupe::engine
