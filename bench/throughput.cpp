#include "bench/throughput.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>
#include <sstream>

#include "model/tokenizer.hpp"

namespace troupe::bench {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

namespace {

struct Timing {
  Clock::time_point first, last;
  std::vector<double> gaps_ms;  // between consecutive tokens
  std::int32_t num_tokens = 0;
  bool finished = false;
  bool failed = false;
};

}  // namespace

std::vector<BenchRequest> make_dataset(const ThroughputOptions& o,
                                       const model::Tokenizer& tokenizer) {
  std::mt19937_64 rng(o.seed);
  std::vector<TokenId> normal;
  const auto& vocab = tokenizer.vocabulary();
  for (std::size_t i = 0; i < vocab.size(); ++i) {
    if (vocab.types[i] == model::TokenType::normal) normal.push_back(static_cast<TokenId>(i));
  }
  std::uniform_int_distribution<std::size_t> any(0, normal.size() - 1);
  auto tokens = [&](std::int32_t n) {
    std::vector<TokenId> t(static_cast<std::size_t>(std::max(n, 1)));
    for (auto& id : t) id = normal[any(rng)];
    return t;
  };
  auto ranged = [&](std::int32_t mean) {
    const auto lo = static_cast<std::int32_t>(std::floor(mean * (1.0 - o.range_ratio)));
    const auto hi = static_cast<std::int32_t>(std::ceil(mean * (1.0 + o.range_ratio)));
    return std::uniform_int_distribution<std::int32_t>(std::max(1, lo), std::max(1, hi))(rng);
  };
  const std::vector<TokenId> system_prompt = tokens(o.prefix_len);
  std::exponential_distribution<double> exponential(1.0 / std::max(1, o.output_len));
  std::vector<BenchRequest> out;
  for (std::int32_t i = 0; i < o.num_prompts; ++i) {
    BenchRequest r;
    if (o.dataset == "anyscale") {
      // The seed article's workload: fixed prompts, capped-exponential outputs.
      r.prompt = tokens(o.input_len);
      r.output_len =
          std::clamp(static_cast<std::int32_t>(std::lround(exponential(rng))), 1, 4 * o.output_len);
    } else if (o.dataset == "shared-prefix") {
      r.prompt = system_prompt;
      const auto own = tokens(ranged(o.input_len));
      r.prompt.insert(r.prompt.end(), own.begin(), own.end());
      r.output_len = ranged(o.output_len);
    } else {
      r.prompt = tokens(ranged(o.input_len));
      r.output_len = ranged(o.output_len);
    }
    out.push_back(std::move(r));
  }
  return out;
}

Result<ThroughputResult> run_throughput(const ThroughputOptions& o) {
  if (o.dataset != "random" && o.dataset != "anyscale" && o.dataset != "shared-prefix") {
    return make_error(ErrorCode::invalid_argument,
                      "unknown dataset '" + o.dataset + "' (random, anyscale, shared-prefix)");
  }
  if (o.num_prompts <= 0 || o.input_len <= 0 || o.output_len <= 0 || o.range_ratio < 0 ||
      o.range_ratio >= 1) {
    return make_error(
        ErrorCode::invalid_argument,
        "num-prompts, input-len and output-len must be positive; range-ratio in [0, 1)");
  }
  TROUPE_TRY(auto engine, Engine::create(o.engine));
  const auto requests = make_dataset(o, engine->tokenizer());

  std::mutex mutex;
  std::condition_variable done;
  std::vector<Timing> timings(requests.size());
  std::int32_t num_done = 0;
  ThroughputResult result;
  const Clock::time_point start = Clock::now();
  for (std::size_t i = 0; i < requests.size(); ++i) {
    GenerateRequest g;
    g.prompt = requests[i].prompt;
    g.params.temperature = o.temperature;
    g.params.seed = o.seed * 1000003 + i;
    g.params.max_tokens = requests[i].output_len;
    g.params.ignore_eos = true;
    result.total_input_tokens += static_cast<std::int64_t>(g.prompt.size());
    auto submitted = engine->submit(std::move(g), [&, i](const TokenEvent& e) {
      const auto now = Clock::now();
      std::lock_guard lock(mutex);
      Timing& t = timings[i];
      if (e.token != kNoToken) {
        if (t.num_tokens == 0)
          t.first = now;
        else
          t.gaps_ms.push_back(std::chrono::duration<double, std::milli>(now - t.last).count());
        t.last = now;
        ++t.num_tokens;
      }
      if (e.finished) {
        t.finished = true;
        t.failed = e.finish_reason != FinishReason::length;
        ++num_done;
        done.notify_all();
      }
    });
    if (!submitted) return tl::unexpected(submitted.error());
  }
  {
    std::unique_lock lock(mutex);
    done.wait(lock, [&] { return num_done == static_cast<std::int32_t>(requests.size()); });
  }
  result.duration_s = std::chrono::duration<double>(Clock::now() - start).count();
  const EngineStats stats = engine->stats();

  LatencySamples samples;
  for (const Timing& t : timings) {
    if (t.failed || t.num_tokens == 0) {
      ++result.failed;
      continue;
    }
    ++result.completed;
    result.total_output_tokens += t.num_tokens;
    samples.add(start, t.first, t.last, t.num_tokens, t.gaps_ms);
  }
  result.request_throughput = result.completed / result.duration_s;
  result.output_throughput = static_cast<double>(result.total_output_tokens) / result.duration_s;
  result.total_token_throughput =
      static_cast<double>(result.total_input_tokens + result.total_output_tokens) /
      result.duration_s;
  result.latency = samples.summarize();
  result.num_steps = stats.num_steps;
  result.mean_batch_size =
      stats.num_steps ? static_cast<double>(stats.num_step_sequences) / stats.num_steps : 0.0;
  result.peak_kv_usage = stats.peak_kv_usage;
  result.num_preemptions = stats.num_preemptions;
  result.prefix_cache_hit_rate =
      stats.prefix_queried_tokens
          ? static_cast<double>(stats.prefix_hit_tokens) / stats.prefix_queried_tokens
          : 0.0;
  result.mean_step_ms = stats.num_steps ? 1000.0 * stats.step_seconds / stats.num_steps : 0.0;
  result.mean_schedule_ms =
      stats.num_steps ? 1000.0 * stats.schedule_seconds / stats.num_steps : 0.0;
  return result;
}

std::string to_json(const ThroughputOptions& o, const ThroughputResult& r) {
  std::ostringstream out;
  out.precision(6);
  auto field = [&](const char* name, auto value, bool last = false) {
    out << "  \"" << name << "\": " << value << (last ? "\n" : ",\n");
  };
  auto quoted = [](const std::string& s) { return "\"" + s + "\""; };
  out << "{\n";
  field("dataset", quoted(o.dataset));
  field("batching", quoted(o.engine.mode == BatchingMode::continuous ? "continuous" : "static"));
  field("max_num_seqs", o.engine.max_num_seqs);
  field("max_num_batched_tokens", o.engine.max_num_batched_tokens);
  field("enable_prefix_caching", o.engine.enable_prefix_caching ? "true" : "false");
  field("num_prompts", o.num_prompts);
  field("completed", r.completed);
  field("failed", r.failed);
  field("duration", r.duration_s);
  field("total_input_tokens", r.total_input_tokens);
  field("total_output_tokens", r.total_output_tokens);
  field("request_throughput", r.request_throughput);
  field("output_throughput", r.output_throughput);
  field("total_token_throughput", r.total_token_throughput, true);
  write_latencies_json(out, r.latency);
  out << ",\n";
  field("mean_batch_size", r.mean_batch_size);
  field("peak_kv_usage", r.peak_kv_usage);
  field("num_preemptions", r.num_preemptions);
  field("prefix_cache_hit_rate", r.prefix_cache_hit_rate);
  field("num_iterations", r.num_steps);
  field("mean_iteration_ms", r.mean_step_ms);
  field("mean_scheduler_ms", r.mean_schedule_ms, true);
  out << "}\n";
  return out.str();
}

void print(const ThroughputOptions& o, const ThroughputResult& r) {
  std::printf("============ Offline throughput (%s, %s batching) ============\n", o.dataset.c_str(),
              o.engine.mode == BatchingMode::continuous ? "continuous" : "static");
  std::printf("%-36s %d / %d\n", "Completed / failed requests:", r.completed, r.failed);
  std::printf("%-36s %.2f\n", "Duration (s):", r.duration_s);
  std::printf("%-36s %lld / %lld\n",
              "Input / output tokens:", static_cast<long long>(r.total_input_tokens),
              static_cast<long long>(r.total_output_tokens));
  std::printf("%-36s %.3f\n", "Request throughput (req/s):", r.request_throughput);
  std::printf("%-36s %.1f\n", "Output token throughput (tok/s):", r.output_throughput);
  std::printf("%-36s %.1f\n", "Total token throughput (tok/s):", r.total_token_throughput);
  print_latencies(r.latency);
  std::printf("%-36s %.2f\n", "Mean batch size (seqs/iteration):", r.mean_batch_size);
  std::printf("%-36s %.3f\n", "Peak KV-cache usage:", r.peak_kv_usage);
  std::printf("%-36s %lld\n", "Preemptions:", static_cast<long long>(r.num_preemptions));
  std::printf("%-36s %.3f\n", "Prefix-cache hit rate:", r.prefix_cache_hit_rate);
  std::printf("%-36s %lld, %.2f ms each; scheduler %.3f ms (%.2f%%)\n",
              "Iterations:", static_cast<long long>(r.num_steps), r.mean_step_ms,
              r.mean_schedule_ms,
              r.mean_step_ms > 0 ? 100.0 * r.mean_schedule_ms / r.mean_step_ms : 0.0);
}

}  // namespace troupe::bench
