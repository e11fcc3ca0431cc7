// `troupe generate`: streams a continuation of one prompt to stdout, through
// the engine (the same actors and scheduler that serve).
#include <CLI/CLI.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>

#include "app/commands.hpp"
#include "app/speculative_options.hpp"
#include "text/tokenizer.hpp"
#include "troupe/engine.hpp"

namespace troupe::app {

void add_generate_command(CLI::App& app) {
  struct Options {
    EngineConfig engine;
    std::string prompt;
    std::int32_t num_tokens = 64;
    std::uint64_t seed = 0;
    std::vector<std::string> stop;
    SamplingParams params;
    double kv_cache_gb = 0.25;
    TokenBudgetFlags budget;
    std::string lora;
  };
  auto opts = std::make_shared<Options>();
  opts->params.temperature = 0.0f;
  auto* cmd = app.add_subcommand("generate", "generate text from a prompt (streams to stdout)");
  cmd->add_option("--model,-m", opts->engine.model_path,
                  "GGUF model file (default: the built-in random model)");
  cmd->add_option("--prompt,-p", opts->prompt, "prompt text");
  cmd->add_option("-n,--max-tokens", opts->num_tokens, "tokens to generate")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--temperature", opts->params.temperature, "0: greedy");
  cmd->add_option("--top-k", opts->params.top_k, "keep the k most likely (0: off)");
  cmd->add_option("--top-p", opts->params.top_p, "nucleus sampling mass (1: off)");
  cmd->add_option("--min-p", opts->params.min_p, "drop tokens below min_p * p_max (0: off)");
  cmd->add_option("--seed", opts->seed, "sampling seed");
  cmd->add_option("--repetition-penalty", opts->params.repetition_penalty, "1: off");
  cmd->add_option("--presence-penalty", opts->params.presence_penalty, "0: off");
  cmd->add_option("--frequency-penalty", opts->params.frequency_penalty, "0: off");
  cmd->add_option("--stop", opts->stop, "stop strings (repeatable)");
  cmd->add_flag("--ignore-eos", opts->params.ignore_eos, "do not stop at end-of-generation tokens");
  cmd->add_option("--lora", opts->lora,
                  "a LoRA adapter (llama.cpp's GGUF) for the model, applied at scale 1");
  cmd->add_option("--threads,-t", opts->engine.num_threads, "compute threads (0: all cores)")
      ->check(CLI::Range(0, kMostThreads));
  add_device_options(cmd, opts->engine);
  add_speculative_option(cmd, opts->engine);
  add_tensor_parallel_options(cmd, opts->engine);
  add_pipeline_parallel_options(cmd, opts->engine);
  cmd->add_option("--block-size", opts->engine.block_size, "KV cache block size in tokens")
      ->check(CLI::Range(1, 1024));
  add_kv_cache_gb_option(cmd, opts->kv_cache_gb, "KV cache memory in GiB");
  add_token_budget_options(cmd, opts->budget);
  cmd->callback([opts, cmd] {
    auto fail = [](const std::string& message) {
      std::fprintf(stderr, "troupe generate: %s\n", message.c_str());
      throw CLI::RuntimeError(1);
    };
    EngineConfig config = opts->engine;
    settle_token_budget(opts->budget, config);
    config.kv_cache_bytes = static_cast<std::int64_t>(opts->kv_cache_gb * (1 << 30));
    if (config.model_path.empty()) config.model_path = builtin_model_path();
    if (config.model_path.empty()) fail("the built-in model could not be written");
    if (!opts->lora.empty()) config.lora_adapters = {opts->lora};
    auto engine = Engine::create(config);
    if (!engine) fail(engine.error().message);
    GenerateRequest request;
    request.prompt = (*engine)->tokenizer().encode(opts->prompt, /*add_special=*/true);
    request.params = opts->params;
    request.params.max_tokens = opts->num_tokens;
    request.stop = opts->stop;
    if (!opts->lora.empty()) request.lora_adapter = 1;
    if (cmd->count("--seed")) request.params.seed = opts->seed;

    std::mutex mutex;
    std::condition_variable done;
    std::optional<TokenEvent> end;
    std::int64_t num_tokens = 0;
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    Clock::time_point first_token;
    auto submitted = (*engine)->submit(request, [&](const TokenEvent& e) {
      std::fwrite(e.text.data(), 1, e.text.size(), stdout);
      std::fflush(stdout);
      std::lock_guard lock(mutex);
      if (e.token != kNoToken && num_tokens++ == 0) first_token = Clock::now();
      if (e.finished) {
        end = e;
        done.notify_all();
      }
    });
    if (!submitted) fail(submitted.error().message);
    std::unique_lock lock(mutex);
    done.wait(lock, [&] { return end.has_value(); });
    const auto finish = Clock::now();
    std::fputc('\n', stdout);
    if (end->finish_reason == FinishReason::error) fail(end->error);
    // The first token's latency is the prompt's; the rest are generation steps.
    const double prefill_s = std::chrono::duration<double>(first_token - start).count();
    const double decode_s = std::chrono::duration<double>(finish - first_token).count();
    std::fprintf(stderr,
                 "prompt: %d tokens in %.3f s (%.1f tokens/s); generation: %lld tokens, "
                 "%.1f tokens/s after the first; finish: %s\n",
                 end->num_prompt_tokens, prefill_s,
                 end->num_prompt_tokens / std::max(prefill_s, 1e-9),
                 static_cast<long long>(num_tokens),
                 static_cast<double>(num_tokens - 1) / std::max(decode_s, 1e-9),
                 std::string(finish_reason_name(end->finish_reason)).c_str());
  });
}

}  // namespace troupe::app
