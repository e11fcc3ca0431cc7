// `troupe bench serve`: the online benchmark client (bench/serve_client).
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "app/commands.hpp"
#include "bench/serve_client.hpp"

namespace troupe::app {

void add_bench_serve_command(CLI::App& bench) {
  struct Options {
    bench::ServeOptions run;
    std::string request_rate = "inf", output_json;
    std::vector<std::string> goodput;
    std::string percentile_metrics = "ttft,tpot,itl", metric_percentiles = "99";
    bool disable_progress = false;
  };
  auto opts = std::make_shared<Options>();
  auto& r = opts->run;
  auto& w = r.workload;
  auto* cmd = bench.add_subcommand(
      "serve", "benchmark a running OpenAI-compatible server (like vllm bench serve)");
  cmd->add_option("--host", r.host, "server address");
  cmd->add_option("--port", r.port, "server port");
  cmd->add_option("--model", r.model,
                  "model name to send (default: the server's, from /v1/models)");
  cmd->add_option("--api-key", r.api_key, "bearer key");
  cmd->add_option("--dataset-name", "random (the only dataset)")->check(CLI::IsMember({"random"}));
  cmd->add_option("--num-prompts", w.num_prompts, "requests to send");
  cmd->add_option("--random-input-len,--input-len", w.input_len, "prompt tokens");
  cmd->add_option("--random-output-len,--output-len", w.output_len, "output tokens");
  cmd->add_option("--random-range-ratio,--range-ratio", w.range_ratio,
                  "lengths within L*(1-R)..L*(1+R)");
  cmd->add_option("--request-rate", opts->request_rate,
                  "requests/s (Poisson arrivals, or gamma with --burstiness), or inf: all at once");
  cmd->add_option("--burstiness", r.burstiness,
                  "the arrivals' gamma shape: 1 a Poisson process, below 1 burstier, above 1 "
                  "more even (vLLM's)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--goodput", opts->goodput,
                  "service level objectives NAME:MS (ttft, tpot, e2el), e.g. ttft:4000 tpot:250: "
                  "also report the completed requests/s that met every one (vLLM's)");
  cmd->add_option("--percentile-metrics", opts->percentile_metrics,
                  "the metrics whose percentiles are reported: ttft, tpot, itl, e2el, "
                  "comma-separated")
      ->capture_default_str();
  cmd->add_option("--metric-percentiles", opts->metric_percentiles,
                  "the percentiles reported, comma-separated, e.g. 50,90,99")
      ->capture_default_str();
  cmd->add_option("--max-concurrency", r.max_concurrency, "most requests in flight (0: no limit)");
  cmd->add_option("--seed", w.seed, "dataset seed");
  cmd->add_option("--vocab-size", w.vocab_size,
                  "prompt token ids are drawn below this (default: the vocab_size the server "
                  "reports in /v1/models, less the control tokens at its end)");
  cmd->add_option("--output-json,--result-filename", opts->output_json,
                  "also write the results here");
  cmd->add_flag("--disable-tqdm", opts->disable_progress, "no progress on stderr");
  cmd->callback([opts] {
    auto& run = opts->run;
    run.progress = !opts->disable_progress;
    if (opts->request_rate != "inf") {
      std::size_t end = 0;
      try {
        run.request_rate = std::stod(opts->request_rate, &end);
      } catch (const std::exception&) {
        end = 0;
      }
      if (end != opts->request_rate.size() || !(run.request_rate > 0) ||
          !std::isfinite(run.request_rate)) {
        throw CLI::ValidationError("--request-rate", "a positive number or inf");
      }
    }
    auto goodput = bench::parse_goodput(opts->goodput);
    if (!goodput) throw CLI::ValidationError("--goodput", goodput.error().message);
    run.goodput = *goodput;
    auto metrics = bench::parse_percentile_metrics(opts->percentile_metrics);
    if (!metrics) throw CLI::ValidationError("--percentile-metrics", metrics.error().message);
    run.percentile_metrics = std::move(*metrics);
    auto percentiles = bench::parse_metric_percentiles(opts->metric_percentiles);
    if (!percentiles) {
      throw CLI::ValidationError("--metric-percentiles", percentiles.error().message);
    }
    run.metric_percentiles = std::move(*percentiles);
    auto result = bench::run_serve_benchmark(run);
    if (!result) {
      std::fprintf(stderr, "troupe bench serve: %s\n", result.error().message.c_str());
      throw CLI::RuntimeError(1);
    }
    std::fputs(bench::summary(run, *result).c_str(), stdout);
    if (result->totals.failed > 0) {
      std::fprintf(stderr, "troupe bench serve: %d of %d requests failed; the first: %s\n",
                   result->totals.failed, run.workload.num_prompts, result->first_error.c_str());
    }
    if (!opts->output_json.empty()) {
      std::ofstream out(opts->output_json);
      out << bench::to_json(run, *result);
      if (!out.flush()) {
        std::fprintf(stderr, "troupe bench serve: cannot write %s\n", opts->output_json.c_str());
        throw CLI::RuntimeError(1);
      }
    }
    if (result->totals.completed == 0) throw CLI::RuntimeError(1);
  });
}

}  // namespace troupe::app
