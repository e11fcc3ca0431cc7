// troupe: an LLM serving runtime. This is the command line.
#include <CLI/CLI.hpp>

#include "app/commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"troupe: an LLM serving runtime on the actor model"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "troupe 0.1.0");
  troupe::app::add_serve_command(app);
  troupe::app::add_node_command(app);
  troupe::app::add_generate_command(app);
  troupe::app::add_make_model_command(app);
  auto* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  troupe::app::add_bench_forward_command(*bench);
  troupe::app::add_bench_throughput_command(*bench);
  troupe::app::add_bench_serve_command(*bench);
  troupe::app::add_bench_cluster_sim_command(*bench);
  troupe::app::add_bench_allreduce_command(*bench);
  troupe::app::add_bench_grammar_command(*bench);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
