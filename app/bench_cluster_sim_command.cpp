// `troupe bench cluster-sim`: routers in front of many simulated replicas (bench/cluster_sim),
// one run per policy and the single-replica reference, printed as a table.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "app/commands.hpp"
#include "bench/cluster_sim.hpp"

namespace troupe::app {

namespace {

struct Run {
  bench::SimRunResult result;
  double wall_s = 0.0;  // what the simulation took on this machine
};

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "troupe bench cluster-sim: %s\n", message.c_str());
  throw CLI::RuntimeError(1);
}

template <class Simulate>
Run timed(Simulate simulate) {
  const auto start = std::chrono::steady_clock::now();
  auto result = simulate();
  if (!result) fail(result.error().message);
  return {std::move(*result),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
}

void print_header(const bench::ClusterSimOptions& o) {
  const auto& r = o.replica;
  const auto& m = o.step_model;
  std::printf("workload %s: %d requests at %.1f/s (seed %llu), %d replicas\n",
              std::string(to_string(o.workload)).c_str(), o.num_requests, o.rate,
              static_cast<unsigned long long>(o.seed), o.num_replicas);
  std::printf("replica: %d blocks of %d tokens, %d sequences, %d tokens/step, context %d\n",
              r.num_blocks, r.block_size, r.max_num_seqs, r.max_num_batched_tokens,
              r.max_model_len);
  std::printf("router: max load gap %d, max KV usage %.2f\n", o.router.max_load_gap,
              o.router.max_kv_usage);
  std::printf("step model: %.3f ms + %.4f ms/token + %.4f ms/sequence (%s)\n\n", 1e3 * m.a,
              1e3 * m.b, 1e3 * m.c, m.name.c_str());
  std::printf("%-15s %8s | %8s %8s %8s | %8s %8s %8s | %9s %4s %5s %7s %7s %6s\n", "policy",
              "hit rate", "TTFT p50", "p90", "p99", "E2E p50", "p90", "p99", "imbalance", "used",
              "busy", "prefix", "preempt", "wall");
}

void print_row(const Run& run) {
  const auto& r = run.result;
  const auto used =
      std::ranges::count_if(r.requests_per_replica, [](std::int32_t n) { return n > 0; });
  std::printf(
      "%-15s %7.1f%% | %7.3fs %7.3fs %7.3fs | %7.2fs %7.2fs %7.2fs | %9.2f %4lld %4.0f%% %7d %7lld "
      "%5.1fs\n",
      r.name.c_str(), 100.0 * r.hit_rate(), r.ttft_s.p50, r.ttft_s.p90, r.ttft_s.p99, r.e2e_s.p50,
      r.e2e_s.p90, r.e2e_s.p99, r.load_imbalance, static_cast<long long>(used), 100.0 * r.mean_busy,
      r.num_prefix_routes, static_cast<long long>(r.num_preemptions), run.wall_s);
}

const Run* find(const std::vector<Run>& runs, std::string_view name) {
  for (const Run& run : runs) {
    if (run.result.name == name) return &run;
  }
  return nullptr;
}

// The two numbers issue 11 sets targets for, where the runs needed were made.
void print_targets(const std::vector<Run>& runs) {
  const Run* prefix = find(runs, "prefix");
  const Run* single = find(runs, "single replica");
  const Run* round_robin = find(runs, "round-robin");
  std::printf("\n");
  if (prefix && single && single->result.hit_rate() > 0) {
    std::printf("prefix hit rate / single replica's: %.3f (target >= 0.90)\n",
                prefix->result.hit_rate() / single->result.hit_rate());
  }
  if (prefix && round_robin && prefix->result.ttft_s.p50 > 0) {
    std::printf("median TTFT, round-robin / prefix: %.2fx (target >= 3x on multi-turn)\n",
                round_robin->result.ttft_s.p50 / prefix->result.ttft_s.p50);
  }
}

boost::json::object quantiles_json(const bench::LatencyQuantiles& q) {
  return {{"p50", q.p50}, {"p90", q.p90}, {"p99", q.p99}};
}

std::string to_json(const bench::ClusterSimOptions& o, const std::vector<Run>& runs) {
  const auto& r = o.replica;
  boost::json::object json{{"workload", to_string(o.workload)},
                           {"num_replicas", o.num_replicas},
                           {"num_requests", o.num_requests},
                           {"rate", o.rate},
                           {"seed", o.seed},
                           {"blocks_per_replica", r.num_blocks},
                           {"block_size", r.block_size},
                           {"max_num_seqs", r.max_num_seqs},
                           {"max_num_batched_tokens", r.max_num_batched_tokens},
                           {"max_model_len", r.max_model_len},
                           {"max_load_gap", o.router.max_load_gap},
                           {"step_model",
                            {{"a", o.step_model.a},
                             {"b", o.step_model.b},
                             {"c", o.step_model.c},
                             {"name", o.step_model.name}}}};
  boost::json::array out;
  for (const Run& run : runs) {
    const auto& s = run.result;
    out.push_back(boost::json::object{
        {"name", s.name},
        {"num_replicas", s.num_replicas},
        {"num_finished", s.num_finished},
        {"hit_rate", s.hit_rate()},
        {"num_queried_tokens", s.num_queried_tokens},
        {"num_hit_tokens", s.num_hit_tokens},
        {"ttft_s", quantiles_json(s.ttft_s)},
        {"e2e_s", quantiles_json(s.e2e_s)},
        {"load_imbalance", s.load_imbalance},
        {"mean_busy", s.mean_busy},
        {"duration_s", s.duration_s},
        {"num_steps", s.num_steps},
        {"num_preemptions", s.num_preemptions},
        {"num_prefix_routes", s.num_prefix_routes},
        {"requests_per_replica",
         boost::json::array(s.requests_per_replica.begin(), s.requests_per_replica.end())},
        {"wall_s", run.wall_s}});
  }
  json["runs"] = std::move(out);
  return boost::json::serialize(json) + "\n";
}

}  // namespace

void add_bench_cluster_sim_command(CLI::App& bench) {
  struct Options {
    bench::ClusterSimOptions sim;
    std::string workload = "multi-turn", step_model, json;
    std::vector<std::string> policies = {"prefix", "least-loaded", "round-robin"};
  };
  auto opts = std::make_shared<Options>();
  auto& o = opts->sim;
  auto* cmd = bench.add_subcommand(
      "cluster-sim", "the router over many simulated replicas (real schedulers, modelled steps)");
  cmd->add_option("--workload", opts->workload, "multi-turn or shared-prefix");
  cmd->add_option("--policy", opts->policies, "router policies to run (default: all three)")
      ->delimiter(',');
  cmd->add_option("--replicas", o.num_replicas, "data-parallel replicas")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--requests", o.num_requests, "requests in the workload")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--rate", o.rate,
                  "mean requests/s, Poisson (multi-turn: sessions start at rate / mean turns)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--blocks-per-replica", o.replica.num_blocks, "KV blocks of one replica")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--block-size", o.replica.block_size, "KV block size in tokens")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-num-seqs", o.replica.max_num_seqs, "most sequences per iteration")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-num-batched-tokens", o.replica.max_num_batched_tokens,
                  "token budget per iteration")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-model-len", o.replica.max_model_len, "context length")
      ->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--max-load-gap", o.router.max_load_gap,
                  "prefix: how much busier than the least loaded a cache holder may be")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", o.seed, "workload seed");
  cmd->add_option("--step-model", opts->step_model,
                  "step times from FILE: \"a b c [name]\" or JSON {a, b, c, name}, seconds")
      ->check(CLI::ExistingFile);
  cmd->add_option("--json", opts->json, "also write the results here");
  cmd->callback([opts] {
    auto& o = opts->sim;
    const auto workload = bench::parse_sim_workload(opts->workload);
    if (!workload) fail("--workload must be multi-turn or shared-prefix");
    o.workload = *workload;
    if (!opts->step_model.empty()) {
      std::ifstream in(opts->step_model);
      std::stringstream text;
      text << in.rdbuf();
      auto model = bench::parse_step_time_model(text.str());
      if (!in || !model) {
        fail(opts->step_model + ": " + (model ? "cannot read it" : model.error().message));
      }
      o.step_model = std::move(*model);
    }
    std::vector<RoutingPolicy> policies;
    for (const std::string& name : opts->policies) {
      const auto policy = engine::parse_routing_policy(name);
      if (!policy) fail("unknown policy " + name + " (prefix, least-loaded, round-robin)");
      policies.push_back(*policy);
    }

    print_header(o);
    std::vector<Run> runs;
    for (const RoutingPolicy policy : policies) {
      runs.push_back(timed([&] { return bench::simulate_cluster(o, policy); }));
      print_row(runs.back());
      std::fflush(stdout);
    }
    runs.push_back(timed([&] { return bench::simulate_single_replica(o); }));
    print_row(runs.back());
    print_targets(runs);

    if (!opts->json.empty()) {
      std::ofstream out(opts->json);
      out << to_json(o, runs);
      if (!out) fail("cannot write " + opts->json);
    }
  });
}

}  // namespace troupe::app
