// `troupe bench throughput`: the offline throughput benchmark (bench/throughput).
#include <CLI/CLI.hpp>
#include <boost/json/parse.hpp>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "app/commands.hpp"
#include "app/speculative_options.hpp"
#include "bench/throughput.hpp"
#include "grammar/json_schema.hpp"

namespace troupe::app {

namespace {

std::string read_text(const std::string& option, const std::string& path) {
  std::ifstream in(path);
  if (!in) throw CLI::ValidationError(option, "cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The GBNF of --json-schema or --grammar (empty: neither), converted once for all requests.
std::string output_grammar(const std::string& schema_file, const std::string& grammar_file) {
  if (!grammar_file.empty()) {
    std::string gbnf = read_text("--grammar", grammar_file);
    if (gbnf.empty()) throw CLI::ValidationError("--grammar", grammar_file + " is empty");
    return gbnf;
  }
  if (schema_file.empty()) return {};
  boost::system::error_code ec;
  const auto schema = boost::json::parse(read_text("--json-schema", schema_file), ec);
  if (ec) throw CLI::ValidationError("--json-schema", "not JSON: " + ec.message());
  auto gbnf = grammar::json_schema_to_gbnf(schema);
  if (!gbnf) throw CLI::ValidationError("--json-schema", gbnf.error().message);
  return std::move(*gbnf);
}

}  // namespace

void add_bench_throughput_command(CLI::App& bench) {
  struct Options {
    bench::ThroughputOptions run;
    std::string batching = "continuous", output_json;
    std::string json_schema_file, grammar_file;
    bool no_prefix_caching = false;
    double kv_cache_gb = 1.0;
    TokenBudgetFlags budget;
  };
  auto opts = std::make_shared<Options>();
  auto& r = opts->run;
  auto& w = r.workload;
  auto* cmd = bench.add_subcommand("throughput",
                                   "offline throughput of the engine (like vllm bench throughput)");
  cmd->add_option("--model,-m", r.engine.model_path,
                  "GGUF model (default: the built-in random model)");
  cmd->add_option("--dataset-name", r.dataset, "random, anyscale or shared-prefix");
  cmd->add_option("--num-prompts", w.num_prompts, "requests, all submitted at once");
  cmd->add_option("--input-len", w.input_len, "prompt tokens (own tokens for shared-prefix)");
  cmd->add_option("--output-len", w.output_len, "output tokens (the mean for anyscale)");
  cmd->add_option("--prefix-len", w.prefix_len, "shared-prefix: the system prompt's tokens");
  cmd->add_option("--range-ratio", w.range_ratio, "random lengths within L*(1-R)..L*(1+R)");
  cmd->add_option("--seed", w.seed, "dataset and sampling seed");
  cmd->add_option("--temperature", r.temperature, "sampling temperature (0: greedy)");
  auto* schema = cmd->add_option("--json-schema", opts->json_schema_file,
                                 "hold every output to this JSON schema (a file)");
  cmd->add_option("--grammar", opts->grammar_file,
                  "hold every output to this GBNF grammar (a file)")
      ->excludes(schema);
  cmd->add_option("--lora", r.engine.lora_adapters,
                  "LoRA adapter files (GGUF); request i runs under adapter i mod their number");
  cmd->add_option("--batching", opts->batching, "continuous or static");
  add_scheduling_policy_option(cmd, r.engine);
  add_engine_size_options(cmd, r.engine, opts->kv_cache_gb);
  add_token_budget_options(cmd, opts->budget);
  cmd->add_flag("--no-prefix-caching", opts->no_prefix_caching, "turn the prefix cache off");
  cmd->add_option("--threads,-t", r.engine.num_threads, "compute threads (0: all cores)")
      ->check(CLI::Range(0, kMostThreads));
  add_device_options(cmd, r.engine);
  add_speculative_option(cmd, r.engine);
  add_tensor_parallel_options(cmd, r.engine);
  add_pipeline_parallel_options(cmd, r.engine);
  cmd->add_option("--output-json", opts->output_json, "also write the results here");
  cmd->callback([opts] {
    auto& run = opts->run;
    if (run.engine.model_path.empty()) run.engine.model_path = builtin_model_path();
    if (opts->batching != "continuous" && opts->batching != "static") {
      throw CLI::ValidationError("--batching", "continuous or static");
    }
    run.engine.mode =
        opts->batching == "static" ? BatchingMode::static_batch : BatchingMode::continuous;
    run.engine.enable_prefix_caching = !opts->no_prefix_caching;
    settle_token_budget(opts->budget, run.engine);
    run.engine.kv_cache_bytes = static_cast<std::int64_t>(opts->kv_cache_gb * (1 << 30));
    run.grammar = output_grammar(opts->json_schema_file, opts->grammar_file);
    if (!opts->grammar_file.empty()) run.constraint = "grammar " + opts->grammar_file;
    if (!opts->json_schema_file.empty()) run.constraint = "json-schema " + opts->json_schema_file;
    auto result = bench::run_throughput(run);
    if (!result) {
      std::fprintf(stderr, "troupe bench throughput: %s\n", result.error().message.c_str());
      throw CLI::RuntimeError(1);
    }
    bench::print(run, *result);
    if (!opts->output_json.empty()) {
      std::ofstream out(opts->output_json);
      out << bench::to_json(run, *result);
      if (!out) {
        std::fprintf(stderr, "troupe bench throughput: cannot write %s\n",
                     opts->output_json.c_str());
        throw CLI::RuntimeError(1);
      }
    }
  });
}

}  // namespace troupe::app
