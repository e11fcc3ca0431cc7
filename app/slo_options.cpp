#include "app/slo_options.hpp"

namespace troupe::app {

void add_slo_options(CLI::App* cmd, SloFlags& flags) {
  cmd->add_option("--target-tpot-ms", flags.target_tpot_ms,
                  "with --max-num-batched-tokens auto: a time-per-output-token objective; each "
                  "step beside running streams then carries the most prefill that keeps every "
                  "stream's TPOT since its first token within 90% of it (instead of twice the "
                  "decodes' own step; default: none)")
      ->check(number_in(1.0, 600000.0))
      ->default_str("");
}

void settle_slo(const SloFlags& flags, const TokenBudgetFlags& budget, EngineConfig& engine) {
  if (!(flags.target_tpot_ms > 0)) return;
  if (!engine.auto_token_budget) {
    throw CLI::ValidationError("--target-tpot-ms",
                               "applies only with --max-num-batched-tokens auto");
  }
  if (budget.target_itl_ms > 0) {
    throw CLI::ValidationError("--target-tpot-ms",
                               "sizes the steps itself: leave --target-itl-ms out");
  }
  engine.target_tpot_ms = flags.target_tpot_ms;
}

}  // namespace troupe::app
