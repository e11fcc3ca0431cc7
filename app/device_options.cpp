#include <CLI/CLI.hpp>
#include <cstdint>
#include <exception>
#include <limits>
#include <string>

#include "app/commands.hpp"
#include "model/pipeline_parallel.hpp"
#include "troupe/engine.hpp"

namespace troupe::app {

CLI::Option* one_of(CLI::Option* option, const std::vector<std::string>& words, bool ignore_case) {
  std::string names;
  for (const auto& w : words) names += (names.empty() ? "" : "|") + w;
  auto member = ignore_case ? CLI::IsMember(words, CLI::ignore_case) : CLI::IsMember(words);
  return option->check(member.description(""))->type_name(names);
}

CLI::Option* add_kv_cache_gb_option(CLI::App* cmd, double& kv_cache_gb, const std::string& help,
                                    bool zero_allowed) {
  return cmd->add_option("--kv-cache-gb", kv_cache_gb, help)
      ->check(number_in(0.0, kMostKvCacheGb, /*above_lo=*/!zero_allowed));
}

void add_engine_size_options(CLI::App* cmd, EngineConfig& engine, double& kv_cache_gb) {
  cmd->add_option("--max-model-len", engine.max_model_len, "context length (0: the model's)")
      ->check(CLI::Range(0, std::numeric_limits<std::int32_t>::max()));
  cmd->add_option("--max-num-seqs", engine.max_num_seqs, "most sequences per iteration")
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--block-size", engine.block_size, "KV block size in tokens")
      ->check(CLI::Range(1, 1024));
  add_kv_cache_gb_option(cmd, kv_cache_gb, "KV cache memory in GiB (per replica)");
}

void add_scheduling_policy_option(CLI::App* cmd, EngineConfig& engine) {
  cmd->add_option_function<std::string>(
         "--scheduling-policy",
         [&engine](const std::string& policy) {
           engine.policy =
               policy == "priority" ? SchedulingPolicy::priority : SchedulingPolicy::fcfs;
         },
         "the order waiting requests run in: fcfs (first come, first served), or priority (a "
         "request's `priority`, lower first; a more urgent arrival preempts the least urgent "
         "running request when the batch is full)")
      ->check(CLI::IsMember({"fcfs", "priority"}).description(""))
      ->type_name("fcfs|priority")
      ->default_str("fcfs");
}

void add_device_options(CLI::App* cmd, EngineConfig& engine) {
  static const std::map<std::string, Device> kDevices = {{"cpu", Device::cpu},
                                                         {"cuda", Device::cuda}};
  cmd->add_option("--device", engine.device, "where the model runs: cpu or cuda")
      ->transform(CLI::CheckedTransformer(kDevices, CLI::ignore_case).description(""))
      ->type_name("cpu|cuda")
      ->default_str(engine.device == Device::cuda ? "cuda" : "cpu");
  cmd->add_option("--gpu-memory-utilization", engine.gpu_memory_utilization,
                  "cuda: share of the GPU memory left after the weights for the KV cache")
      ->check(number_in(0.01, 1.0));
  cmd->add_flag_callback(
      "--enforce-eager", [&engine] { engine.cuda_graphs = false; },
      "cuda: run every step eagerly (no CUDA graphs)");
  // auto leaves the dtype unset: the device's default.
  static const std::map<std::string, std::optional<KvCacheDtype>> kKvTypes = {
      {"auto", std::nullopt}, {"f32", KvCacheDtype::f32}, {"f16", KvCacheDtype::f16}};
  cmd->add_option_function<std::string>(
         "--kv-cache-dtype",
         [&engine](const std::string& name) { engine.kv_cache_dtype = kKvTypes.at(name); },
         "how the KV cache stores keys and values: auto (f16), f16, or f32 (exact; CPU only)")
      ->transform(CLI::CheckedTransformer(kKvTypes, CLI::ignore_case).description(""))
      ->type_name("auto|f16|f32")
      ->default_str("auto");
}

void add_tensor_parallel_options(CLI::App* cmd, EngineConfig& engine) {
  cmd->add_option("--tensor-parallel-size,--tp", engine.tensor_parallel_size,
                  "split each replica's model over this many ranks (CPU: all-reducing over "
                  "Gloo), a worker each: threads here, or workers on the cluster's nodes")
      ->check(CLI::Range(1, 64));
  cmd->add_option(
         "--collective-timeout",
         [&engine](const CLI::results_t& r) {
           engine.collective_timeout =
               std::chrono::milliseconds(static_cast<std::int64_t>(std::stod(r.front()) * 1000.0));
           return true;
         },
         "seconds a tensor-parallel rendezvous or all-reduce may take before its group counts "
         "as lost")
      ->type_name("SECONDS")
      ->default_str("30")
      ->check(number_in(0.0, 1e6, /*above_lo=*/true));
}

void add_pipeline_parallel_options(CLI::App* cmd, EngineConfig& engine) {
  cmd->add_option("--pipeline-parallel-size,--pp", engine.pipeline_parallel_size,
                  "cut each replica's layers into this many pipeline stages, a worker each "
                  "(threads here, or workers on the cluster's nodes; with --tensor-parallel-size "
                  "T, T ranks each), the hidden states passed on over Gloo (CPU)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--pp-steps-in-flight", engine.pipeline_steps_in_flight,
                  "a pipelined replica's steps in flight at once, each over other sequences, so "
                  "that its stages work at once (micro-batches; 1: one at a time)")
      ->check(CLI::Range(1, 64))
      ->default_str("one per stage");
  cmd->add_option_function<std::string>(
         "--pp-layer-partition",
         [&engine](const std::string& text) {
           auto parsed = model::parse_layer_partition(text);
           if (!parsed) throw CLI::ValidationError("--pp-layer-partition", parsed.error().message);
           engine.pipeline_layer_partition = std::move(*parsed);
         },
         "each pipeline stage's layer count, in order (vLLM's VLLM_PP_LAYER_PARTITION: "
         "\"6,6\"); default: balanced by the bytes of weights a decode step reads on each "
         "stage, the last stage's head included")
      ->type_name("N,N,...");
}

void add_token_budget_options(CLI::App* cmd, TokenBudgetFlags& flags) {
  cmd->add_option("--max-num-batched-tokens", flags.max_num_batched_tokens,
                  "token budget per iteration: a number, or auto (default on the CPU: chosen "
                  "from the measured cost of a step to keep it within --target-itl-ms; at "
                  "most 2048)")
      ->type_name("N|auto")
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            if (value == "auto") return {};
            try {
              std::size_t end = 0;
              const long n = std::stol(value, &end);
              if (end == value.size() && n >= 1 && n <= (1 << 24)) return {};
            } catch (const std::exception&) {
            }
            return "expected a positive number of tokens or auto, not '" + value + "'";
          },
          ""));
  cmd->add_option("--target-itl-ms", flags.target_itl_ms,
                  "with --max-num-batched-tokens auto: the inter-token latency a step carrying "
                  "a prefill chunk should stay within (default: twice the running decodes' own "
                  "step, at most 150)")
      ->check(number_in(1.0, 600000.0))
      ->default_str("");
}

void settle_token_budget(const TokenBudgetFlags& flags, EngineConfig& engine) {
  const std::string& given = flags.max_num_batched_tokens;
  engine.auto_token_budget = given.empty() ? engine.device == Device::cpu : given == "auto";
  if (!given.empty() && given != "auto") engine.max_num_batched_tokens = std::stoi(given);
  if (flags.target_itl_ms > 0) {
    if (!engine.auto_token_budget) {
      throw CLI::ValidationError("--target-itl-ms",
                                 "applies only with --max-num-batched-tokens auto");
    }
    engine.target_itl_ms = flags.target_itl_ms;
    engine.itl_decode_step_multiple = 0.0;  // the number given, alone
  }
}

void add_cluster_tls_options(CLI::App* cmd, std::string& certificate, std::string& key,
                             std::string& ca) {
  cmd->add_option("--cluster-tls-cert", certificate,
                  "mutual TLS on the cluster link: this side's certificate (PEM)")
      ->check(not_special_file());
  cmd->add_option("--cluster-tls-key", key, "mutual TLS: its private key")
      ->check(not_special_file());
  cmd->add_option("--cluster-tls-ca", ca,
                  "mutual TLS: the authority the other side's certificate must be signed by")
      ->check(not_special_file());
}

}  // namespace troupe::app
