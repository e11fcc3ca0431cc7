// `troupe serve`: the OpenAI-compatible server (vLLM's flag names).
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "app/commands.hpp"
#include "engine/router.hpp"
#include "monitoring/metrics.hpp"
#include "net/http_server.hpp"
#include "text/jinja_template.hpp"

namespace troupe::app {

namespace {

// A cluster token for a head given none: 128 bits from the system's entropy, in hex.
std::string random_token() {
  std::random_device device;
  std::string token;
  for (int i = 0; i < 4; ++i) {
    char part[9];
    std::snprintf(part, sizeof part, "%08x", static_cast<unsigned>(device()));
    token += part;
  }
  return token;
}

volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) {
  g_stop = 1;
}
}  // namespace

void add_serve_command(CLI::App& app) {
  struct Options {
    EngineConfig engine;
    net::ServerConfig server;
    bool no_prefix_caching = false;
    bool prefix_caching = true;  // vLLM's flag, accepted; on by default
    double kv_cache_gb = 1.0;
    std::uint64_t seed = 0;
    std::string router = "prefix";
    ClusterConfig cluster;
    int cluster_wait_s = 60;
    int step_timeout_s = 60;
    TokenBudgetFlags budget;
    std::string chat_template;  // --chat-template: a file's path or the template's text
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("serve", "serve the OpenAI-compatible API");
  cmd->add_option("--model,-m", opts->engine.model_path,
                  "GGUF model (default: the built-in random model)");
  cmd->add_option("--host", opts->server.host, "address to bind");
  cmd->add_option("--port", opts->server.port, "port (0: any free one)");
  cmd->add_option("--served-model-name", opts->server.served_model_name,
                  "the model's name in the API");
  cmd->add_option("--api-key", opts->server.api_key, "require this key on /v1 routes");
  cmd->add_option("--chat-template", opts->chat_template,
                  "Jinja chat template, a file or the text itself (default: the model's own)");
  cmd->add_option("--tool-call-parser", opts->server.tool_call_parser,
                  "how the model writes tool calls (default: from its chat template)")
      ->check(CLI::IsMember({"hermes", "llama3_json", "mistral"}));
  cmd->add_option("--max-model-len", opts->engine.max_model_len, "context length (0: the model's)");
  cmd->add_option("--max-num-seqs", opts->engine.max_num_seqs, "most sequences per iteration");
  add_token_budget_options(cmd, opts->budget);
  cmd->add_option("--block-size", opts->engine.block_size, "KV block size in tokens");
  cmd->add_flag("--no-enable-prefix-caching", opts->no_prefix_caching, "turn the prefix cache off");
  cmd->add_flag("--enable-prefix-caching", opts->prefix_caching,
                "the prefix cache (on by default)");
  cmd->add_option("--kv-cache-gb", opts->kv_cache_gb, "KV cache memory in GiB (per replica)");
  cmd->add_option("--threads,-t", opts->engine.num_threads,
                  "compute threads per replica (0: the cores shared among replicas)");
  cmd->add_option("--data-parallel-size,--dp", opts->engine.data_parallel_size,
                  "replicas, each with its own worker and KV cache, behind the router")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--router", opts->router,
                  "which replica takes a request: prefix, least-loaded or round-robin")
      ->check(CLI::IsMember({"prefix", "least-loaded", "round-robin"}));
  add_device_options(cmd, opts->engine);
  add_tensor_parallel_options(cmd, opts->engine);
  cmd->add_option("--cluster-port", opts->cluster.port,
                  "be a cluster's head: nodes join here, and each replica's worker runs on one "
                  "(0: any free port)");
  cmd->add_option("--cluster-host", opts->cluster.host,
                  "address of the cluster port (loopback unless told otherwise)");
  cmd->add_option("--cluster-token", opts->cluster.token,
                  "the token nodes must present (default: one is generated and printed); "
                  "required off loopback; also $TROUPE_CLUSTER_TOKEN")
      ->envname("TROUPE_CLUSTER_TOKEN");
  cmd->add_option("--cluster-wait", opts->cluster_wait_s,
                  "seconds to wait for enough nodes to place every replica");
  add_cluster_tls_options(cmd, opts->cluster.tls_certificate, opts->cluster.tls_key,
                          opts->cluster.tls_ca);
  cmd->add_flag("--head-replica", opts->cluster.head_hosts_replica,
                "with --cluster-port: replica 0 runs in the head itself, the others on nodes");
  cmd->add_option("--step-timeout", opts->step_timeout_s,
                  "seconds a node's worker may take for one step before it counts as lost");
  cmd->add_option("--seed", opts->seed, "seed for requests that bring none");
  cmd->add_option("--max-concurrent-requests", opts->server.max_concurrent_requests,
                  "generation requests in flight before 429");
  cmd->add_option("--max-connections", opts->server.max_connections,
                  "open connections before 503 (the descriptor limit must hold them)");
  cmd->add_option("--max-buffered-output-bytes", opts->server.max_buffered_output_bytes,
                  "output a connection may leave unread before it is closed (1008 on a socket)");
  cmd->callback([opts, cmd] {
    auto fail = [](const std::string& message) {
      std::fprintf(stderr, "troupe serve: %s\n", message.c_str());
      throw CLI::RuntimeError(1);
    };
    // Before the model loads: a limit that cannot hold the connections fails at once.
    if (auto fits = net::HttpServer::prepare_descriptor_limit(opts->server); !fits) {
      fail(fits.error().message);
    }
    if (!opts->chat_template.empty()) {
      // A path to an existing file is read; anything else is the template's text (as vLLM).
      std::error_code ec;
      if (std::filesystem::is_regular_file(opts->chat_template, ec)) {
        std::ifstream in(opts->chat_template, std::ios::binary);
        std::stringstream text;
        text << in.rdbuf();
        if (!in) fail("cannot read the chat template " + opts->chat_template);
        opts->server.chat_template = text.str();
        opts->server.chat_template_origin = "--chat-template file " + opts->chat_template;
      } else {
        if (opts->chat_template.find("{{") == std::string::npos &&
            opts->chat_template.find("{%") == std::string::npos) {
          fail("--chat-template: no file " + opts->chat_template +
               ", and as a template it has no Jinja tags");
        }
        opts->server.chat_template = opts->chat_template;
        opts->server.chat_template_origin = "--chat-template text";
      }
      // A template the user named must work: refuse it now, before the model loads.
      if (auto parsed = text::jinja::Template::parse(opts->server.chat_template); !parsed) {
        fail(opts->server.chat_template_origin + ": " + parsed.error().message);
      }
    }
    EngineConfig config = opts->engine;
    settle_token_budget(opts->budget, config);
    if (config.model_path.empty()) config.model_path = builtin_model_path();
    if (config.model_path.empty()) fail("the built-in model could not be written");
    config.enable_prefix_caching = !opts->no_prefix_caching;
    if (cmd->count("--seed")) config.seed = opts->seed;
    config.routing = *engine::parse_routing_policy(opts->router);
    if (cmd->count("--cluster-port")) {
      ClusterConfig cluster = opts->cluster;
      cluster.wait = std::chrono::seconds(opts->cluster_wait_s);
      cluster.step_timeout = std::chrono::seconds(opts->step_timeout_s);
      // Off loopback the token must be the user's (STACK.md: the link is not authenticated
      // by itself); on loopback one is made and printed for the nodes.
      const bool loopback = cluster.host == "localhost" || cluster.host.rfind("127.", 0) == 0;
      const bool generated = cluster.token.empty();
      if (generated && !loopback) {
        fail("refusing to open the cluster port on " + cluster.host +
             " without a cluster token: give one with --cluster-token");
      }
      if (generated) cluster.token = random_token();
      cluster.on_listening = [cluster, generated,
                              replicas = config.data_parallel_size](std::uint16_t port) {
        std::fprintf(stderr, "troupe: cluster port %s:%u; waiting for %d node(s)\n",
                     cluster.host.c_str(), port, replicas - (cluster.head_hosts_replica ? 1 : 0));
        if (generated) {
          std::fprintf(stderr,
                       "troupe: cluster token %s (troupe node --join %s:%u --cluster-token %s)\n",
                       cluster.token.c_str(), cluster.host.c_str(), port, cluster.token.c_str());
        }
      };
      config.cluster = std::move(cluster);
    }
    auto metrics = std::make_shared<monitoring::Metrics>();
    config.metrics = metrics;
    opts->server.metrics = metrics;
    config.kv_cache_bytes = static_cast<std::int64_t>(opts->kv_cache_gb * (1 << 30));
    std::fprintf(stderr, "troupe: loading %s\n", config.model_path.c_str());
    auto engine = Engine::create(config);
    if (!engine) fail(engine.error().message);
    const auto stats = (*engine)->stats();
    if (config.data_parallel_size > 1) {
      std::fprintf(stderr, "troupe: %d replicas behind the %s router\n", config.data_parallel_size,
                   opts->router.c_str());
    }
    std::fprintf(
        stderr, "troupe: %s; KV cache: %d blocks of %d tokens = %lld tokens; max model length %d\n",
        (*engine)->device_description().c_str(), stats.num_kv_blocks, stats.block_size,
        static_cast<long long>(stats.num_kv_blocks) * stats.block_size, (*engine)->max_model_len());
    std::fprintf(stderr, "troupe: token budget: %s\n",
                 (*engine)->token_budget_description().c_str());
    net::HttpServer server(**engine, opts->server);
    if (!server.chat_template().warning().empty()) {
      std::fprintf(stderr, "troupe: warning: %s\n", server.chat_template().warning().c_str());
    }
    std::fprintf(stderr, "troupe: chat template: %s; tool calls read as %s%s\n",
                 server.chat_template().description().c_str(),
                 std::string(server.tool_call_parser()).c_str(),
                 opts->server.tool_call_parser.empty() ? " (from the template)" : "");
    if (auto started = server.start(); !started) fail(started.error().message);
    std::fprintf(stderr, "troupe: serving '%s' at http://%s:%u (Ctrl-C stops)\n",
                 opts->server.served_model_name.c_str(), opts->server.host.c_str(), server.port());
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::fprintf(stderr, "troupe: stopping\n");
    server.stop();
  });
}

}  // namespace troupe::app
