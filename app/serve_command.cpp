// `troupe serve`: the OpenAI-compatible server (vLLM's flag names).
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "app/commands.hpp"
#include "app/config_file.hpp"
#include "app/data_parallel_option.hpp"
#include "app/lora_options.hpp"
#include "app/slo_options.hpp"
#include "app/speculative_options.hpp"
#include "engine/router.hpp"
#include "gguf/gguf_file.hpp"
#include "model/loaded_model.hpp"
#include "monitoring/log.hpp"
#include "monitoring/metrics.hpp"
#include "monitoring/stats_logger.hpp"
#include "monitoring/step_events.hpp"
#include "net/http_server.hpp"
#include "text/jinja/template.hpp"

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

// vLLM takes a JSON list (--allowed-origins '["https://a.example"]'); a comma-separated
// list and the flag given again are read too.
std::vector<std::string> cors_list(const std::vector<std::string>& given) {
  std::vector<std::string> items;
  for (std::string value : given) {
    if (!value.empty() && value.front() == '[' && value.back() == ']') {
      value = value.substr(1, value.size() - 2);
    }
    std::stringstream parts(value);
    for (std::string item; std::getline(parts, item, ',');) {
      const auto first = item.find_first_not_of(" \t\"'");
      const auto last = item.find_last_not_of(" \t\"'");
      if (first != std::string::npos) items.push_back(item.substr(first, last - first + 1));
    }
  }
  return items;
}

// The largest chat templates models ship are tens of kilobytes.
constexpr std::size_t kMostChatTemplateBytes = std::size_t{1} << 20;

// Descriptors kept for HTTP beyond --max-connections, free of the cluster port's.
constexpr int kHttpDescriptorMargin = 16;

// The help's sections, by topic as vLLM's: every flag of `troupe serve` is in one (the
// vLLM flags without effect have theirs, app/vllm_flags.cpp).
void group_serve_flags(CLI::App* cmd) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> groups = {
      {"Model",
       {"--model", "--served-model-name", "--chat-template", "--tool-call-parser",
        "--reasoning-parser", "--max-model-len", "--max-logprobs", "--seed"}},
      {"LoRA",
       {"--lora-modules", "--max-loras", "--max-lora-rank", "--enable-runtime-lora-updating"}},
      {"Server",
       {"--host", "--port", "--api-key", "--max-concurrent-requests", "--max-requests-per-socket",
        "--max-connections", "--max-buffered-output-bytes", "--shutdown-timeout",
        "--disable-web-page", "--web-dir"}},
      {"HTTPS", {"--ssl-keyfile", "--ssl-certfile", "--ssl-ca-certs", "--ssl-cert-reqs"}},
      {"CORS",
       {"--allowed-origins", "--allowed-methods", "--allowed-headers", "--allow-credentials"}},
      {"Scheduler",
       {"--max-num-seqs", "--scheduling-policy", "--max-num-batched-tokens", "--target-itl-ms",
        "--target-tpot-ms"}},
      {"KV cache",
       {"--block-size", "--kv-cache-gb", "--kv-cache-dtype", "--enable-prefix-caching",
        "--no-enable-prefix-caching"}},
      {"Device and parallelism",
       {"--device", "--gpu-memory-utilization", "--enforce-eager", "--threads",
        "--data-parallel-size", "--router", "--tensor-parallel-size", "--pipeline-parallel-size",
        "--pp-layer-partition", "--collective-timeout"}},
      {"Cluster",
       {"--cluster-port", "--cluster-host", "--cluster-token", "--cluster-wait",
        "--cluster-tls-cert", "--cluster-tls-key", "--cluster-tls-ca",
        "--cluster-handshake-timeout", "--head-replica", "--step-timeout", "--failover-timeout"}},
      {"Logging",
       {"--log-level", "--log-format", "--disable-access-log", "--disable-log-stats",
        "--log-stats-interval"}},
  };
  for (const auto& [group, names] : groups) {
    for (const auto& name : names) {
      CLI::Option* option = cmd->get_option_no_throw(name);
      // A name here that is no flag is this table's slip: found by any run of serve.
      if (option == nullptr) throw std::logic_error("serve help group: no flag " + name);
      option->group(group);
    }
  }
}

std::string gib(std::int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
  return text;
}

// 1.2B, 15.0M, 260.1K: a parameter count as model cards write it.
std::string parameters(std::int64_t n) {
  char text[32];
  const double v = static_cast<double>(n);
  if (v >= 1e9) {
    std::snprintf(text, sizeof text, "%.1fB", v / 1e9);
  } else if (v >= 1e6) {
    std::snprintf(text, sizeof text, "%.1fM", v / 1e6);
  } else {
    std::snprintf(text, sizeof text, "%.1fK", v / 1e3);
  }
  return text;
}

// What vLLM's start-up log says of a model: its architecture, size and weight type (the
// type holding most of the weights' bytes), read from the GGUF file's header; empty when
// the file cannot be read here.
std::string model_summary(const std::string& path) {
  auto file = gguf::GgufFile::open(path);
  if (!file) return {};
  const auto arch = file->get_string("general.architecture");
  std::int64_t num_parameters = 0;
  std::map<std::string_view, std::uint64_t> bytes_by_type;
  for (const auto& tensor : file->tensors()) {
    num_parameters += tensor.num_elements();
    bytes_by_type[gguf::tensor_type_name(tensor.type)] += tensor.num_bytes;
  }
  std::string_view type = "?";
  std::uint64_t most = 0;
  for (const auto& [name, bytes] : bytes_by_type) {
    if (bytes > most) {
      most = bytes;
      type = name;
    }
  }
  return std::string(arch ? *arch : std::string_view("?")) + ", " + parameters(num_parameters) +
         " parameters, weights mostly " + std::string(type);
}

// SIGTERM and SIGINT received: the first drains, the second stops at once.
volatile std::sig_atomic_t g_signals = 0;
void on_signal(int) {
  if (g_signals < 2) g_signals = g_signals + 1;
}

// After a drain's cut, how long the cut generations have to write their ends.
constexpr auto kCutGrace = std::chrono::seconds(5);

// Waits (polling) until `done`, the deadline, or a second signal; false when a second
// signal came.
template <class Done>
bool wait_until(Done done, std::chrono::steady_clock::time_point deadline) {
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    if (g_signals >= 2) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return g_signals < 2;
}

// The one way `troupe serve` ends once it serves: on the first SIGTERM or SIGINT (or
// POST /v1/admin/drain) the server drains: it admits nothing new, and the generations
// that run have `timeout` to end; what is left then is cut (each ends with its error),
// and the server stops. A second signal stops it at once.
void drain_and_stop(net::HttpServer& server, std::chrono::seconds timeout) {
  while (g_signals == 0 && !server.draining()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  server.drain(g_signals > 0 ? "signal" : "request");
  monitoring::log_info("the running requests have " + std::to_string(timeout.count()) +
                       " s to end (--shutdown-timeout); a second SIGTERM or Ctrl-C stops now");
  // Done when every generation has ended and every WebSocket has said goodbye (1001).
  auto idle = [&server] { return server.drained(); };
  bool patient = wait_until(idle, std::chrono::steady_clock::now() + timeout);
  if (patient && server.num_generations() > 0) {
    monitoring::log_warning("shutdown timeout: cutting " +
                            std::to_string(server.num_generations()) + " running generation(s)");
    server.cut_generations();
    patient = wait_until(idle, std::chrono::steady_clock::now() + kCutGrace);
  }
  if (!patient) monitoring::log_warning("second signal: stopping at once");
  monitoring::log_info("stopping");
  server.stop();
}
}  // namespace

void add_serve_command(CLI::App& app) {
  struct Options {
    EngineConfig engine;
    net::ServerConfig server;
    bool no_prefix_caching = false;
    bool prefix_caching = true;       // vLLM's flag, accepted; on by default
    std::string data_parallel = "1";  // --data-parallel-size: N, MIN:MAX or auto
    double kv_cache_gb = 1.0;
    std::uint64_t seed = 0;
    std::string router = "prefix";
    ClusterConfig cluster;
    int cluster_wait_s = 60;
    double cluster_handshake_timeout_s = 10.0;
    int step_timeout_s = 60;
    int failover_timeout_s = 30;
    int shutdown_timeout_s = 30;
    TokenBudgetFlags budget;
    SloFlags slo;
    LoraFlags lora;
    std::string chat_template;  // --chat-template: a file's path or the template's text
    LogFlags log;
    bool disable_access_log = false;
    bool disable_log_stats = false;
    bool disable_web_page = false;
    double log_stats_interval_s = 10.0;
    std::vector<std::string> allowed_origins{"*"}, allowed_methods{"*"}, allowed_headers{"*"};
    std::vector<std::string> served_model_names;  // the first answers; all are accepted
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("serve", "serve the OpenAI-compatible API");
  // vLLM's positional model (`vllm serve MODEL`), or --model as before; the API names it
  // by its path as given unless --served-model-name says otherwise, as vLLM does.
  cmd->add_option("model,--model,-m", opts->engine.model_path,
                  "GGUF model file; the API's name for it unless --served-model-name (default: "
                  "the built-in random model, named troupe)")
      ->type_name("PATH");
  cmd->add_option("--host", opts->server.host, "address to bind");
  cmd->add_option("--port", opts->server.port, "port (0: any free one)")
      ->check(CLI::Range(0, 65535));
  // vLLM's nargs="+": several names, the first in answers and metrics, each one accepted
  // in requests and listed by /v1/models.
  cmd->add_option("--served-model-name", opts->served_model_names,
                  "the model's names in the API, the first in its answers (default: the "
                  "model's path as given)")
      ->check(name_text(kMostModelNameBytes))
      ->expected(1, CLI::detail::expected_max_vector_size)
      ->type_name("NAME")
      ->default_str("");
  add_lora_options(cmd, opts->lora);
  cmd->add_option("--max-logprobs", opts->server.max_logprobs,
                  "the most alternatives a token's logprobs may ask for (top_logprobs, "
                  "logprobs, prompt_logprobs)")
      ->check(CLI::Range(0, 20));
  cmd->add_option("--api-key", opts->server.api_key, "require this key on /v1 routes");
  // HTTPS, as vLLM's (uvicorn's) flags: HTTP, SSE and the WebSocket (wss://) all over TLS.
  cmd->add_option("--ssl-keyfile", opts->server.tls.keyfile,
                  "serve HTTPS: the PEM private key (default: in --ssl-certfile)")
      ->type_name("PATH");
  cmd->add_option("--ssl-certfile", opts->server.tls.certfile,
                  "serve HTTPS: the PEM certificate chain, the server's own first")
      ->type_name("PATH");
  cmd->add_option("--ssl-ca-certs", opts->server.tls.ca_certs,
                  "PEM CAs that client certificates are checked against (--ssl-cert-reqs)")
      ->type_name("PATH");
  cmd->add_option("--ssl-cert-reqs", opts->server.tls.cert_reqs,
                  "client certificates, as Python's ssl.CERT_*: 0 none asked, 1 checked when "
                  "given, 2 required")
      ->check(CLI::Range(0, 2));
  cmd->add_option("--chat-template", opts->chat_template,
                  "Jinja chat template, a file or the text itself (default: the model's own)");
  one_of(cmd->add_option("--tool-call-parser", opts->server.tool_call_parser,
                         "how the model writes tool calls (default: from its chat template)"),
         {"hermes", "llama3_json", "mistral"});
  one_of(cmd->add_option("--reasoning-parser", opts->server.reasoning_parser,
                         "give a chat's thinking apart as reasoning_content, as the model "
                         "writes it: <think> tags (deepseek_r1, qwen3) or gpt-oss's channels "
                         "(gpt_oss) (default: none, the thinking stays in content)"),
         {"deepseek_r1", "qwen3", "gpt_oss", "deepseek_v3", "glm45"});
  add_engine_size_options(cmd, opts->engine, opts->kv_cache_gb);
  add_scheduling_policy_option(cmd, opts->engine);
  add_token_budget_options(cmd, opts->budget);
  add_slo_options(cmd, opts->slo);
  cmd->add_flag("--no-enable-prefix-caching", opts->no_prefix_caching, "turn the prefix cache off");
  cmd->add_flag("--enable-prefix-caching", opts->prefix_caching,
                "the prefix cache (on by default)");
  cmd->add_option("--threads,-t", opts->engine.num_threads,
                  "compute threads per replica (0: the cores shared among replicas)")
      ->check(CLI::Range(0, kMostThreads));
  cmd->add_option("--data-parallel-size,--dp", opts->data_parallel,
                  "replicas, each with its own worker and KV cache, behind the router: N, or "
                  "with --cluster-port a range MIN:MAX or auto (a replica on each node that "
                  "joins with room, leaving with its node; the head waits for MIN at start)")
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            auto parsed = parse_data_parallel_size(value);
            return parsed ? std::string() : parsed.error().message;
          },
          ""))
      ->type_name("N|RANGE|auto")
      ->default_str("1");
  one_of(cmd->add_option("--router", opts->router,
                         "which replica takes a request: the one holding the prompt's prefix, "
                         "the least loaded, or each in turn"),
         {"prefix", "least-loaded", "round-robin"});
  add_device_options(cmd, opts->engine);
  add_speculative_option(cmd, opts->engine);
  add_tensor_parallel_options(cmd, opts->engine);
  add_pipeline_parallel_options(cmd, opts->engine);
  cmd->add_option("--cluster-port", opts->cluster.port,
                  "be a cluster's head: nodes join here, and each replica's worker runs on one "
                  "(0: any free port)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--cluster-host", opts->cluster.host,
                  "address of the cluster port (loopback unless told otherwise)");
  cmd->add_option("--cluster-token", opts->cluster.token,
                  "the token nodes must present (default: one is generated and printed); "
                  "required off loopback")
      ->envname("TROUPE_CLUSTER_TOKEN");
  cmd->add_option("--cluster-wait", opts->cluster_wait_s,
                  "seconds to wait for enough nodes to place every replica")
      ->check(CLI::Range(0, kMostSeconds));
  add_cluster_tls_options(cmd, opts->cluster.tls_certificate, opts->cluster.tls_key,
                          opts->cluster.tls_ca);
  cmd->add_option("--cluster-handshake-timeout", opts->cluster_handshake_timeout_s,
                  "seconds a connection to the cluster port has for its node to join (TLS, "
                  "handshake and token); later, it is closed")
      ->check(number_in(0.1, 3600.0));
  cmd->add_flag("--head-replica", opts->cluster.head_hosts_replica,
                "with --cluster-port: replica 0 runs in the head itself, the others on nodes");
  cmd->add_option("--step-timeout", opts->step_timeout_s,
                  "seconds a node's worker may take for one step before it counts as lost")
      ->check(CLI::Range(1, kMostSeconds));
  cmd->add_option("--failover-timeout", opts->failover_timeout_s,
                  "seconds a request moved off a lost node waits for a replica to take it "
                  "before it ends with an error (0: at once)")
      ->check(CLI::Range(0, kMostSeconds));
  cmd->add_option("--seed", opts->seed, "seed for requests that bring none (default: none)")
      ->default_str("");
  cmd->add_option("--max-concurrent-requests", opts->server.max_concurrent_requests,
                  "generation requests in flight before 429")
      ->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--max-requests-per-socket", opts->server.max_requests_per_socket,
                  "generate messages one WebSocket may have running before 429")
      ->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--max-connections", opts->server.max_connections,
                  "open connections before 503 (the descriptor limit must hold them)")
      ->check(CLI::Range(1, 1 << 24));
  add_log_options(cmd, opts->log);
  cmd->add_flag("--disable-access-log,--disable-uvicorn-access-log", opts->disable_access_log,
                "no line per request in the log");
  cmd->add_flag("--disable-log-stats", opts->disable_log_stats,
                "no periodic engine line (throughput, load, KV cache) in the log");
  cmd->add_option("--log-stats-interval", opts->log_stats_interval_s,
                  "seconds between the engine's lines while it is busy")
      ->check(number_in(0.01, 86400.0));
  cmd->add_option("--allowed-origins", opts->allowed_origins,
                  "origins browsers may call from: a JSON list, a comma-separated list, or * "
                  "(CORS)");
  cmd->add_option("--allowed-methods", opts->allowed_methods,
                  "methods cross-origin requests may use (CORS)");
  cmd->add_option("--allowed-headers", opts->allowed_headers,
                  "headers cross-origin requests may send (CORS)");
  cmd->add_flag("--allow-credentials", opts->server.cors.allow_credentials,
                "cross-origin requests may carry cookies or an Authorization header (CORS)");
  auto* no_page =
      cmd->add_flag("--disable-web-page", opts->disable_web_page,
                    "no built-in page at GET / (the playground and the live view of the engine)");
  cmd->add_option("--web-dir", opts->server.web_dir,
                  "serve the page's files from this directory instead of the built-in ones, "
                  "read at each request, without the API key (for developing the page: net/web)")
      ->check(CLI::ExistingDirectory)
      ->excludes(no_page);
  cmd->add_option("--shutdown-timeout", opts->shutdown_timeout_s,
                  "seconds the running requests have to end once SIGTERM, SIGINT or POST "
                  "/v1/admin/drain drains the server (new ones get 503); then they are cut "
                  "with an error (0: at once)")
      ->check(CLI::Range(0, kMostSeconds));
  cmd->add_option("--max-buffered-output-bytes", opts->server.max_buffered_output_bytes,
                  "output a connection may leave unread before it is closed (1008 on a socket)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 34));
  add_vllm_flags(cmd);
  group_serve_flags(cmd);
  // No flag holds more than a path or a name; a config file could give megabytes. The
  // chat template's text is bounded by the config file's size (and its file, when read).
  bound_flag_values(cmd, kMostFlagBytes, {"--chat-template"});
  cmd->callback([opts, cmd] {
    auto fail = [](const std::string& message) {
      monitoring::flush_logging();
      std::fprintf(stderr, "troupe serve: %s\n", message.c_str());
      throw CLI::RuntimeError(1);
    };
    apply_log_options(opts->log);
    log_vllm_flag_notices(cmd);
    if (!opts->served_model_names.empty()) {
      opts->server.served_model_name = opts->served_model_names.front();
      opts->server.other_model_names.assign(opts->served_model_names.begin() + 1,
                                            opts->served_model_names.end());
    }
    // vLLM's default name: the model as given (a client sends back the path it served).
    if (cmd->count("--served-model-name") == 0 && !opts->engine.model_path.empty()) {
      std::string name = opts->engine.model_path;
      if (const std::string why = name_text(kMostModelNameBytes)(name); !why.empty()) {
        fail("the model's path cannot be its name in the API (" + why +
             "): give one with --served-model-name");
      }
      opts->server.served_model_name = std::move(name);
    }
    opts->server.access_log = !opts->disable_access_log;
    opts->server.shutdown_timeout = std::chrono::seconds(opts->shutdown_timeout_s);
    opts->server.web_page = !opts->disable_web_page;
    opts->server.cors.allowed_origins = cors_list(opts->allowed_origins);
    opts->server.cors.allowed_methods = cors_list(opts->allowed_methods);
    opts->server.cors.allowed_headers = cors_list(opts->allowed_headers);
    // Before the model loads: a limit that cannot hold the connections fails at once.
    if (auto fits = net::HttpServer::prepare_descriptor_limit(opts->server); !fits) {
      fail(fits.error().message);
    }
    // HTTPS's files are read now: a missing or bad key fails at once, not after the load.
    if (opts->server.tls.enabled()) {
      if (auto tls = net::check_tls_config(opts->server.tls); !tls) fail(tls.error().message);
      if (!opts->server.tls.ca_certs.empty() && opts->server.tls.cert_reqs == 0) {
        monitoring::log_info(
            "--ssl-ca-certs is read, but no client certificate is asked for (--ssl-cert-reqs 0)");
      }
    } else if (cmd->count("--ssl-ca-certs") > 0 || cmd->count("--ssl-cert-reqs") > 0) {
      fail("--ssl-ca-certs and --ssl-cert-reqs need --ssl-certfile: they are for HTTPS");
    }
    // The port is bound now, and held while the model loads: a port in use is found at
    // once, not minutes later (the server takes the socket over when it starts).
    auto listener = net::bind_listener(opts->server.host, opts->server.port);
    if (!listener) fail(listener.error().message);
    opts->server.listen_fd = *listener;
    if (!opts->chat_template.empty()) {
      // A path to an existing file is read; anything else is the template's text (as vLLM).
      std::error_code ec;
      const auto status = std::filesystem::status(opts->chat_template, ec);
      if (!ec && std::filesystem::exists(status)) {
        // A FIFO or a device is refused unopened; a file's size is bounded.
        auto text = read_small_file(opts->chat_template, "chat template", kMostChatTemplateBytes);
        if (!text) fail("--chat-template: " + text.error().message);
        opts->server.chat_template = std::move(*text);
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
    // The adapters are checked now (file, type, rank), before the model loads.
    if (auto lora = settle_lora(opts->lora, opts->server, config); !lora) {
      fail(lora.error().message);
    }
    settle_token_budget(opts->budget, config);
    settle_slo(opts->slo, opts->budget, config);
    if (config.model_path.empty()) config.model_path = builtin_model_path();
    if (config.model_path.empty()) fail("the built-in model could not be written");
    config.enable_prefix_caching = !opts->no_prefix_caching;
    if (cmd->count("--seed")) config.seed = opts->seed;
    config.routing = *engine::parse_routing_policy(opts->router);
    const DataParallelSize dp = *parse_data_parallel_size(opts->data_parallel);  // checked
    config.data_parallel_size = dp.min;
    config.data_parallel_max = dp.max;
    if (config.elastic() && cmd->count("--cluster-port") == 0) {
      fail("--data-parallel-size " + opts->data_parallel +
           " needs --cluster-port: elastic replicas come and go with the nodes that join "
           "(without a cluster, give a number)");
    }
    if (cmd->count("--cluster-port")) {
      ClusterConfig cluster = opts->cluster;
      cluster.wait = std::chrono::seconds(opts->cluster_wait_s);
      cluster.step_timeout = std::chrono::seconds(opts->step_timeout_s);
      cluster.failover_timeout = std::chrono::seconds(opts->failover_timeout_s);
      cluster.handshake_timeout = std::chrono::milliseconds(
          static_cast<std::int64_t>(opts->cluster_handshake_timeout_s * 1000.0));
      // The HTTP server's connections keep their descriptors whatever reaches the cluster
      // port (and a few more: the 503s past --max-connections, files it opens).
      cluster.reserved_descriptors = opts->server.max_connections + kHttpDescriptorMargin;
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
        const std::string address = cluster.host + ":" + std::to_string(port);
        monitoring::log_info("cluster port " + address + "; waiting for " +
                             std::to_string(replicas - (cluster.head_hosts_replica ? 1 : 0)) +
                             " node(s)");
        if (generated) {
          monitoring::log_info("cluster token " + cluster.token + " (troupe node --join " +
                               address + " --cluster-token " + cluster.token + ")");
        }
      };
      config.cluster = std::move(cluster);
    }
    auto metrics = std::make_shared<monitoring::Metrics>(opts->server.served_model_name,
                                                         config.data_parallel_size);
    std::vector<std::string> lora_names;
    for (const auto& lora : opts->server.lora_modules) lora_names.push_back(lora.name);
    metrics->set_lora_adapters(lora_names);
    config.metrics = metrics;
    opts->server.metrics = metrics;
    // The live page's timeline (GET /v1/engine/events): built only while someone watches.
    auto step_events = std::make_shared<monitoring::StepEvents>();
    config.step_events = step_events;
    opts->server.step_events = step_events;
    config.kv_cache_bytes = static_cast<std::int64_t>(opts->kv_cache_gb * (1 << 30));
    monitoring::log_info("loading " + config.model_path);
    auto engine = Engine::create(config);
    if (!engine) fail(engine.error().message);
    const auto stats = (*engine)->stats();
    if (config.elastic()) {
      const std::string most = config.data_parallel_max == EngineConfig::kUnboundedReplicas
                                   ? std::string("one per node")
                                   : std::to_string(config.data_parallel_max);
      monitoring::log_info("elastic replicas, " + std::to_string(config.data_parallel_size) +
                           " to " + most + " (" + std::to_string((*engine)->num_replicas()) +
                           " now), behind the " + opts->router + " router");
    } else if (config.data_parallel_size > 1) {
      monitoring::log_info(std::to_string(config.data_parallel_size) + " replicas behind the " +
                           opts->router + " router");
    }
    monitoring::log_info(
        (*engine)->device_description() + "; weights " +
            model::format_bytes((*engine)->weight_bytes()) + "; KV cache " +
            model::format_bytes((*engine)->kv_cache_bytes()) + ": " +
            std::to_string(stats.num_kv_blocks) + " blocks of " + std::to_string(stats.block_size) +
            " tokens = " +
            std::to_string(static_cast<long long>(stats.num_kv_blocks) * stats.block_size) +
            " tokens; max model length " + std::to_string((*engine)->max_model_len()),
        {{"kv_blocks", stats.num_kv_blocks},
         {"block_size", stats.block_size},
         {"max_model_len", (*engine)->max_model_len()},
         {"weight_bytes", (*engine)->weight_bytes()},
         {"kv_cache_bytes", (*engine)->kv_cache_bytes()}});
    {
      // vLLM's lines: the model, its memory, and how many whole contexts the KV cache holds.
      const std::string summary = model_summary(config.model_path);
      const double kv_tokens = static_cast<double>(stats.num_kv_blocks) * stats.block_size;
      const std::int32_t context = (*engine)->max_model_len();
      char concurrency[64];
      std::snprintf(concurrency, sizeof concurrency, "%.2fx",
                    context > 0 ? kv_tokens / context : 0.0);
      monitoring::log_info((summary.empty() ? std::string() : "model: " + summary + "; ") +
                               "weights " + gib((*engine)->weight_bytes()) + ", KV cache " +
                               gib((*engine)->kv_cache_bytes()) + "; maximum concurrency for " +
                               std::to_string(context) + " tokens per request: " + concurrency,
                           {{"max_concurrency", context > 0 ? kv_tokens / context : 0.0}});
    }
    monitoring::log_info("token budget: " + (*engine)->token_budget_description());
    net::HttpServer server(**engine, opts->server);
    if (!server.chat_template().warning().empty()) {
      monitoring::log_warning(server.chat_template().warning());
    }
    monitoring::log_info("chat template: " + server.chat_template().description() +
                         "; tool calls read as " + std::string(server.tool_call_parser()) +
                         (opts->server.tool_call_parser.empty() ? " (from the template)" : "") +
                         (opts->server.reasoning_parser.empty()
                              ? std::string()
                              : "; thinking read as " + opts->server.reasoning_parser));
    if (auto started = server.start(); !started) fail(started.error().message);
    monitoring::log_info("serving '" + opts->server.served_model_name + "' at " +
                         (opts->server.tls.enabled() ? "https://" : "http://") + opts->server.host +
                         ":" + std::to_string(server.port()) +
                         (opts->server.web_page
                              ? " (the live page is at /; Ctrl-C drains and stops)"
                              : " (Ctrl-C drains and stops)"));
    std::optional<monitoring::StatsLogger> stats_logger;
    if (!opts->disable_log_stats) {
      stats_logger.emplace([&engine] { return (*engine)->stats(); },
                           std::chrono::milliseconds(
                               static_cast<std::int64_t>(opts->log_stats_interval_s * 1000.0)));
    }
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    drain_and_stop(server, opts->server.shutdown_timeout);
    stats_logger.reset();
    monitoring::flush_logging();
  });
}

}  // namespace troupe::app
