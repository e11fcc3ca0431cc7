// The `troupe` subcommands: each registers its options on the CLI and runs.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace CLI {
class App;
class FormatterBase;
class Option;
class Validator;
}  // namespace CLI

namespace troupe {
struct EngineConfig;
}

namespace troupe::app {

// --- checks of flag values (app/flag_checks.cpp) ---
// A finite number in [lo, hi] (in (lo, hi] when `above_lo`): NaN, infinities and numbers
// out of range are the flag's error.
CLI::Validator number_in(double lo, double hi, bool above_lo = false);
// At most `most` bytes.
CLI::Validator text_at_most(std::size_t most);
// A name written into responses, metrics and logs: non-empty UTF-8 of at most `most`
// bytes, without control characters.
CLI::Validator name_text(std::size_t most);
// A path that, where it exists, is a regular file: a FIFO, a socket, a device or a
// directory is refused without being opened (a missing file is left to its reader).
CLI::Validator not_special_file();
// Bounds every value of every flag of `cmd` to `most` bytes, but the flags named in
// `unbounded` ("--chat-template"): none holds more than a path or a name, and a config
// file could give megabytes.
void bound_flag_values(CLI::App* cmd, std::size_t most,
                       const std::vector<std::string>& unbounded = {});
// The most bytes of any flag's value, and of a served model's name.
inline constexpr std::size_t kMostFlagBytes = 4096;
inline constexpr std::size_t kMostModelNameBytes = 256;
// Bounds no machine comes near: past them a value is a slip (or an attack), refused as
// the flag's error rather than met as an overflow or a huge allocation later.
inline constexpr double kMostKvCacheGb = 65536.0;  // 64 TiB
inline constexpr int kMostThreads = 4096;
inline constexpr int kMostSeconds = 1000000;  // about 11 days

// Narrows `option` to one of `words`; its help reads `--flag a|b|c=default`.
CLI::Option* one_of(CLI::Option* option, const std::vector<std::string>& words,
                    bool ignore_case = false);

// --max-model-len, --max-num-seqs, --block-size and --kv-cache-gb (GiB per replica, into
// `kv_cache_gb`), each refused as the flag's error out of its range.
void add_engine_size_options(CLI::App* cmd, EngineConfig& engine, double& kv_cache_gb);
// --scheduling-policy fcfs|priority (EngineConfig::policy).
void add_scheduling_policy_option(CLI::App* cmd, EngineConfig& engine);
// --kv-cache-gb alone: a finite number of GiB in (0, kMostKvCacheGb] (from 0 where
// `zero_allowed`: a node's 0 is the head's size).
CLI::Option* add_kv_cache_gb_option(CLI::App* cmd, double& kv_cache_gb, const std::string& help,
                                    bool zero_allowed = false);

// --device, --gpu-memory-utilization and --enforce-eager, on any command that runs an engine.
void add_device_options(CLI::App* cmd, EngineConfig& engine);
// --tensor-parallel-size and --collective-timeout.
void add_tensor_parallel_options(CLI::App* cmd, EngineConfig& engine);
// --pipeline-parallel-size (--pp) and --pp-layer-partition.
void add_pipeline_parallel_options(CLI::App* cmd, EngineConfig& engine);
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

// The help's formatter (app/help_format.cpp): each flag's type and range once, its
// default once at the end of its description.
std::shared_ptr<CLI::FormatterBase> make_help_formatter();
// vLLM's --help=<group>: `which` is a section of `command`'s help (its name in any case,
// with spaces, '-' and '_' alike: "kv-cache", "Model"), "listgroup" (the sections), or a
// flag ("--port"). The text to print; empty when `which` names none of these.
std::string group_help(const CLI::App& command, const std::string& which);
// The argument list's --help=<which> for the (sub)command it follows, answered: true when
// there was one (its text printed, or an error naming the sections; `status` set).
bool answer_group_help(const CLI::App& app, const std::vector<std::string>& args, int& status);

// vLLM's serve flags that have no effect here (app/vllm_flags.cpp): accepted, each in
// the help's last group, so that a vLLM launch line starts; log_vllm_flag_notices writes
// one line for each one given, saying why it has no effect (never silently).
void add_vllm_flags(CLI::App* cmd);
void log_vllm_flag_notices(const CLI::App* cmd);

void add_generate_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_node_command(CLI::App& app);
void add_make_model_command(CLI::App& app);
void add_make_lora_command(CLI::App& app);
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
