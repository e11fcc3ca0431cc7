#include "bench/throughput.hpp"

#include <boost/json/serialize.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>

#include "model/loaded_model.hpp"
#include "model/lora_adapter.hpp"
#include "text/tokenizer.hpp"

namespace troupe::bench {

namespace {

using Clock = std::chrono::steady_clock;

// The mean time LoraAdapter::open takes for each adapter, against the model's file.
Result<double> mean_lora_load_ms(const EngineConfig& engine) {
  if (engine.lora_adapters.empty()) return 0.0;
  TROUPE_TRY(const auto model, model::LoadedModel::open(engine.model_path));
  double total_ms = 0.0;
  for (const auto& path : engine.lora_adapters) {
    const Clock::time_point start = Clock::now();
    TROUPE_TRY(const auto adapter, model::LoraAdapter::open(path, *model.file, model.config));
    total_ms += std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  }
  return total_ms / static_cast<double>(engine.lora_adapters.size());
}

struct Timing {
  Clock::time_point first, last;
  std::vector<double> gaps_ms;  // between consecutive tokens
  std::int32_t num_tokens = 0;
  bool finished = false;
  FinishReason reason = FinishReason::none;
};

}  // namespace

Result<ThroughputResult> run_throughput(const ThroughputOptions& o) {
  const std::optional<Dataset> dataset = parse_dataset(o.dataset);
  if (!dataset) {
    return make_error(ErrorCode::invalid_argument,
                      "unknown dataset '" + o.dataset + "' (random, anyscale, shared-prefix)");
  }
  const WorkloadOptions& w = o.workload;
  if (w.num_prompts <= 0 || w.input_len <= 0 || w.output_len <= 0 || w.range_ratio < 0 ||
      w.range_ratio >= 1) {
    return make_error(
        ErrorCode::invalid_argument,
        "num-prompts, input-len and output-len must be positive; range-ratio in [0, 1)");
  }
  TROUPE_TRY(const double lora_load_ms, mean_lora_load_ms(o.engine));
  TROUPE_TRY(auto engine, Engine::create(o.engine));
  WorkloadOptions workload = w;
  workload.dataset = *dataset;
  workload.vocab_size = static_cast<std::int32_t>(engine->tokenizer().vocabulary().size());
  TROUPE_TRY(const auto requests, make_workload(workload));

  std::mutex mutex;
  std::condition_variable done;
  std::vector<Timing> timings(requests.size());
  std::int32_t num_done = 0;
  ThroughputResult result;
  result.token_budget = engine->token_budget_description();
  result.mean_lora_load_ms = lora_load_ms;
  const auto num_adapters = static_cast<std::int32_t>(o.engine.lora_adapters.size());
  RequestTotals& totals = result.totals;
  const Clock::time_point start = Clock::now();
  for (std::size_t i = 0; i < requests.size(); ++i) {
    GenerateRequest g;
    g.prompt = requests[i].prompt;
    g.params.temperature = o.temperature;
    g.params.seed = w.seed * 1000003 + i;
    g.params.max_tokens = requests[i].output_len;
    g.params.ignore_eos = true;
    g.params.grammar = o.grammar;
    if (num_adapters > 0) g.lora_adapter = 1 + static_cast<std::int32_t>(i) % num_adapters;
    totals.total_input_tokens += static_cast<std::int64_t>(g.prompt.size());
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
        t.reason = e.finish_reason;
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
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const EngineStats stats = engine->stats();

  LatencySamples samples;
  // EOS is ignored, so an output ends at its length; under a grammar, also at the grammar's end.
  const bool constrained = !o.grammar.empty();
  for (const Timing& t : timings) {
    const bool grammar_end = constrained && t.reason == FinishReason::stop;
    if ((t.reason != FinishReason::length && !grammar_end) || t.num_tokens == 0) {
      ++totals.failed;
      continue;
    }
    ++totals.completed;
    if (grammar_end) ++result.num_grammar_ends;
    totals.total_output_tokens += t.num_tokens;
    samples.add(start, t.first, t.last, t.num_tokens, t.gaps_ms);
  }
  totals.set_duration(seconds);
  result.mean_output_len =
      totals.completed ? static_cast<double>(totals.total_output_tokens) / totals.completed : 0.0;
  result.total_token_throughput =
      static_cast<double>(totals.total_input_tokens + totals.total_output_tokens) / seconds;
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
  result.num_decode_steps = stats.num_decode_steps;
  result.spec_num_drafts = stats.spec_num_drafts;
  result.spec_num_draft_tokens = stats.spec_num_draft_tokens;
  result.spec_num_accepted_tokens = stats.spec_num_accepted_tokens;
  result.mean_decode_step_ms =
      stats.num_decode_steps ? 1000.0 * stats.decode_step_seconds / stats.num_decode_steps : 0.0;
  return result;
}

std::string to_json(const ThroughputOptions& o, const ThroughputResult& r) {
  boost::json::object json;
  json["dataset"] = o.dataset;
  json["batching"] = o.engine.mode == BatchingMode::continuous ? "continuous" : "static";
  json["max_num_seqs"] = o.engine.max_num_seqs;
  json["max_num_batched_tokens"] = o.engine.max_num_batched_tokens;
  // Static batching has no token budget: the flag is not in force there.
  const bool auto_budget = o.engine.auto_token_budget && o.engine.mode == BatchingMode::continuous;
  json["auto_token_budget"] = auto_budget;
  if (auto_budget) json["target_itl_ms"] = o.engine.target_itl_ms;
  json["token_budget"] = r.token_budget;
  json["enable_prefix_caching"] = o.engine.enable_prefix_caching;
  json["num_prompts"] = o.workload.num_prompts;
  json["temperature"] = o.temperature;
  json["constraint"] = o.constraint;
  json["num_lora_adapters"] = static_cast<std::int64_t>(o.engine.lora_adapters.size());
  if (!o.engine.lora_adapters.empty()) json["mean_lora_load_ms"] = r.mean_lora_load_ms;
  add_totals(json, r.totals);
  json["mean_output_len"] = r.mean_output_len;
  json["num_grammar_ends"] = r.num_grammar_ends;
  json["total_token_throughput"] = r.total_token_throughput;
  add_latencies(json, r.latency);
  json["mean_batch_size"] = r.mean_batch_size;
  json["peak_kv_usage"] = r.peak_kv_usage;
  json["num_preemptions"] = r.num_preemptions;
  json["prefix_cache_hit_rate"] = r.prefix_cache_hit_rate;
  json["num_iterations"] = r.num_steps;
  json["mean_iteration_ms"] = r.mean_step_ms;
  json["num_decode_iterations"] = r.num_decode_steps;
  json["mean_decode_iteration_ms"] = r.mean_decode_step_ms;
  json["mean_scheduler_ms"] = r.mean_schedule_ms;
  if (o.engine.speculative.enabled()) {
    json["num_speculative_tokens"] = o.engine.speculative.num_speculative_tokens;
    json["spec_num_drafts"] = r.spec_num_drafts;
    json["spec_num_draft_tokens"] = r.spec_num_draft_tokens;
    json["spec_num_accepted_tokens"] = r.spec_num_accepted_tokens;
  }
  return boost::json::serialize(json) + "\n";
}

void print(const ThroughputOptions& o, const ThroughputResult& r) {
  std::printf("============ Offline throughput (%s, %s batching) ============\n", o.dataset.c_str(),
              o.engine.mode == BatchingMode::continuous ? "continuous" : "static");
  std::printf("%-36s %s\n", "Token budget:", r.token_budget.c_str());
  std::printf("%-36s %s\n", "Output constraint:", o.constraint.c_str());
  if (!o.engine.lora_adapters.empty()) {
    std::printf("%-36s %zu, requests spread evenly; %.1f ms to load each\n",
                "LoRA adapters:", o.engine.lora_adapters.size(), r.mean_lora_load_ms);
  }
  std::printf("%-36s %d / %d\n", "Completed / failed requests:", r.totals.completed,
              r.totals.failed);
  std::printf("%-36s %.2f\n", "Duration (s):", r.totals.duration_s);
  std::printf("%-36s %lld / %lld\n",
              "Input / output tokens:", static_cast<long long>(r.totals.total_input_tokens),
              static_cast<long long>(r.totals.total_output_tokens));
  std::printf("%-36s %.1f", "Mean output length (tokens):", r.mean_output_len);
  if (!o.grammar.empty()) {
    std::printf("; %d of %d ended by the grammar", r.num_grammar_ends, r.totals.completed);
  }
  std::printf("\n");
  std::printf("%-36s %.3f\n", "Request throughput (req/s):", r.totals.request_throughput);
  std::printf("%-36s %.1f\n", "Output token throughput (tok/s):", r.totals.output_throughput);
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
  if (r.num_decode_steps > 0) {
    std::printf("%-36s %lld, %.2f ms each; median TPOT / it %.2f\n",
                "Decode-only iterations:", static_cast<long long>(r.num_decode_steps),
                r.mean_decode_step_ms, r.latency.tpot_ms.median / r.mean_decode_step_ms);
  }
  if (o.engine.speculative.enabled()) {
    const double rate =
        r.spec_num_draft_tokens > 0
            ? static_cast<double>(r.spec_num_accepted_tokens) / r.spec_num_draft_tokens
            : 0.0;
    const double length =
        r.spec_num_drafts > 0
            ? 1.0 + static_cast<double>(r.spec_num_accepted_tokens) / r.spec_num_drafts
            : 0.0;
    std::printf(
        "%-36s %lld drafts, %lld tokens, %lld accepted (%.1f%%); %.2f tokens per draft step\n",
        "Speculative decoding:", static_cast<long long>(r.spec_num_drafts),
        static_cast<long long>(r.spec_num_draft_tokens),
        static_cast<long long>(r.spec_num_accepted_tokens), 100.0 * rate, length);
  }
}

}  // namespace troupe::bench
