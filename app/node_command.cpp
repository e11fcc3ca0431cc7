// `troupe node --join HOST:PORT`: a machine that lends its cores (or GPUs) to a head.
#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdio>

#include "actors/cluster/node.hpp"
#include "app/commands.hpp"

namespace troupe::app {

namespace {
// SIGTERM and SIGINT seen: the first drains the node, the second leaves at once.
std::atomic<int> g_signals{0};
void on_signal(int) {
  ++g_signals;
}
}  // namespace

void add_node_command(CLI::App& app) {
  struct Options {
    actors::cluster::NodeSettings node;
    std::string join;
    LogFlags log;
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("node", "join a head (troupe serve --cluster-port) as a node");
  cmd->add_option("--join", opts->join, "the head's cluster address, HOST:PORT")->required();
  cmd->add_option("--cluster-token", opts->node.token,
                  "the token the head printed (or was given); also $TROUPE_CLUSTER_TOKEN")
      ->envname("TROUPE_CLUSTER_TOKEN");
  cmd->add_option("--name", opts->node.name, "this node's name (default: host name and pid)")
      ->check(name_text(kMostModelNameBytes));
  cmd->add_option("--collective-host", opts->node.collective_host,
                  "the address other nodes' tensor-parallel ranks reach this node's on "
                  "(default: this machine's address on the route to the head)");
  cmd->add_option("--threads,-t", opts->node.num_threads,
                  "compute threads for a worker here (0: all cores)")
      ->check(CLI::Range(0, kMostThreads));
  one_of(cmd->add_option("--device", opts->node.device, "where workers here run their model"),
         {"cpu", "cuda"});
  cmd->add_option("--gpus", opts->node.num_gpus,
                  "GPUs this node announces to the head (default: every one it has)")
      ->check(CLI::NonNegativeNumber);
  add_kv_cache_gb_option(cmd, opts->node.kv_cache_gb,
                         "KV cache memory in GiB for a worker here (0: the head's)",
                         /*zero_allowed=*/true);
  cmd->add_option("--model,-m", opts->node.model_path,
                  "this node's copy of the model (default: the head's path); the head checks "
                  "that it is the same file");
  cmd->add_option("--shutdown-timeout", opts->node.shutdown_timeout_s,
                  "seconds the requests running here have to finish once SIGTERM, SIGINT or the "
                  "head's POST /v1/cluster/nodes/{name}/drain drains this node; then the head "
                  "moves them, with the tokens they sent, to another replica")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{kMostSeconds}));
  add_cluster_tls_options(cmd, opts->node.tls_certificate, opts->node.tls_key, opts->node.tls_ca);
  add_log_options(cmd, opts->log);
  bound_flag_values(cmd, kMostFlagBytes);
  cmd->callback([opts] {
    apply_log_options(opts->log);
    const auto colon = opts->join.rfind(':');
    unsigned long port = 0;
    try {
      if (colon != std::string::npos) port = std::stoul(opts->join.substr(colon + 1));
    } catch (const std::exception&) {
      port = 0;
    }
    if (colon == std::string::npos || colon == 0 || port == 0 || port > 65535) {
      std::fprintf(stderr, "troupe node: --join wants HOST:PORT, not '%s'\n", opts->join.c_str());
      throw CLI::RuntimeError(1);
    }
    opts->node.head_host = opts->join.substr(0, colon);
    opts->node.head_port = static_cast<std::uint16_t>(port);
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    const int rc = actors::cluster::run_node(opts->node, g_signals);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace troupe::app
