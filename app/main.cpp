// troupe: an LLM serving runtime. This is the command line.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>

#include "app/commands.hpp"
#include "app/config_file.hpp"
#include "monitoring/log.hpp"

int main(int argc, char** argv) {
  CLI::App app{"troupe: an LLM serving runtime on the actor model"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "troupe " TROUPE_VERSION);
  // Every flag's help says its default, once; a flag given twice takes its last value, as
  // vLLM's argparse does (set before the subcommands: they copy both).
  app.option_defaults()->always_capture_default()->multi_option_policy(
      CLI::MultiOptionPolicy::TakeLast);
  app.formatter(troupe::app::make_help_formatter());
  troupe::app::add_serve_command(app);
  troupe::app::add_node_command(app);
  troupe::app::add_generate_command(app);
  troupe::app::add_make_model_command(app);
  troupe::app::add_make_lora_command(app);
  auto* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  troupe::app::add_bench_forward_command(*bench);
  troupe::app::add_bench_throughput_command(*bench);
  troupe::app::add_bench_serve_command(*bench);
  troupe::app::add_bench_cluster_sim_command(*bench);
  troupe::app::add_bench_allreduce_command(*bench);
  troupe::app::add_bench_grammar_command(*bench);
  troupe::app::add_config_option(app);
  // --config FILE is read here, before CLI11 parses: its flags join the command line.
  auto args = troupe::app::expand_config(app, std::vector<std::string>(argv + 1, argv + argc));
  if (!args) {
    std::fprintf(stderr, "troupe: %s\n", args.error().message.c_str());
    return 2;
  }
  // vLLM's --help=<group> (one section of a command's help), which CLI11 has no form for.
  if (int status = 0; troupe::app::answer_group_help(app, *args, status)) return status;
  std::reverse(args->begin(), args->end());  // CLI11 takes them last first
  int status = 0;
  try {
    app.parse(*args);
  } catch (const CLI::ParseError& e) {
    status = app.exit(e);
  }
  troupe::monitoring::flush_logging();
  return status;
}
