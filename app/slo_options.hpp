// --target-tpot-ms: a service level objective the auto token budget keeps running streams
// within (issue 35). Its own file: serve adds it beside the token budget's flags.
#pragma once

#include <CLI/CLI.hpp>

#include "app/commands.hpp"
#include "troupe/engine.hpp"

namespace troupe::app {

struct SloFlags {
  double target_tpot_ms = 0.0;  // 0: not given
};

void add_slo_options(CLI::App* cmd, SloFlags& flags);
// After settle_token_budget: the objective needs the auto budget and replaces
// --target-itl-ms (both given, or a fixed budget, is a CLI::ValidationError).
void settle_slo(const SloFlags& flags, const TokenBudgetFlags& budget, EngineConfig& engine);

}  // namespace troupe::app
