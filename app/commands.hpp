// The `troupe` subcommands: each registers its options on the CLI and runs.
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace troupe {
struct EngineConfig;
}

namespace troupe::app {

// Narrows `option` to one of `words`; its help reads `--flag a|b|c=default`.
CLI::Option* one_of(CLI::Option* option, const std::vector<std::string>& words,
                    bool ignore_case = false);

// --device, --gpu-memory-utilization and --enforce-eager, on any command that runs an engine.
void add_device_options(CLI::App* cmd, EngineConfig& engine);
// --tensor-parallel-size and --collective-timeout.
void add_tensor_parallel_options(CLI::App* cmd, EngineConfig& engine);
// --max-num-batched-tokens (a number of tokens, or auto) and --target-itl-ms, as given.
struct TokenBudgetFlags {
  std::string max_num_batched_tokens;  // empty: the device's default
  double target_itl_ms = 0.0;          // 0: not given
};
void add_token_budget_options(CLI::App* cmd, TokenBudgetFlags& flags);
// Sets the engine's budget from the flags once --device is known: auto by default on the
// CPU (whose long prefill steps would stall every running stream), 2048 tokens on CUDA; a
// number turns auto off. A target without auto is a CLI::ValidationError.
void settle_token_budget(const TokenBudgetFlags& flags, EngineConfig& engine);
// --cluster-tls-cert, --cluster-tls-key and --cluster-tls-ca, on the head and on a node.
void add_cluster_tls_options(CLI::App* cmd, std::string& certificate, std::string& key,
                             std::string& ca);

// --log-level and --log-format, as given; apply them before the first line is logged.
struct LogFlags {
  std::string level = "info";
  std::string format = "text";
};
void add_log_options(CLI::App* cmd, LogFlags& flags);
void apply_log_options(const LogFlags& flags);

void add_generate_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_node_command(CLI::App& app);
void add_make_model_command(CLI::App& app);
void add_bench_forward_command(CLI::App& bench);
void add_bench_throughput_command(CLI::App& bench);
void add_bench_serve_command(CLI::App& bench);
void add_bench_cluster_sim_command(CLI::App& bench);
void add_bench_allreduce_command(CLI::App& bench);
void add_bench_grammar_command(CLI::App& bench);

// The built-in random-weight model, written to the user's cache on first use.
// Returns its path, or an empty string after printing why it could not be made.
std::string builtin_model_path();

}  // namespace troupe::app
