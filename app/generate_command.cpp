// `troupe generate`: streams a continuation of one prompt to stdout.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "app/commands.hpp"
#include "app/loaded_model.hpp"
#include "model/batch_generator.hpp"
#include "model/incremental_detokenizer.hpp"

namespace troupe::app {

void add_generate_command(CLI::App& app) {
  struct Options {
    std::string model, prompt;
    std::int32_t num_tokens = 64;
    int threads = 0;
    std::int32_t block_size = 16;
    std::uint64_t seed = 0;
    SamplingParams params;
  };
  auto opts = std::make_shared<Options>();
  opts->params.temperature = 0.0f;
  auto* cmd = app.add_subcommand("generate", "generate text from a prompt (streams to stdout)");
  cmd->add_option("--model,-m", opts->model,
                  "GGUF model file (default: the built-in random model)");
  cmd->add_option("--prompt,-p", opts->prompt, "prompt text");
  cmd->add_option("-n,--max-tokens", opts->num_tokens, "tokens to generate")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--temperature", opts->params.temperature, "0: greedy")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-k", opts->params.top_k, "keep the k most likely (0: off)");
  cmd->add_option("--top-p", opts->params.top_p, "nucleus sampling mass (1: off)");
  cmd->add_option("--min-p", opts->params.min_p, "drop tokens below min_p * p_max (0: off)");
  cmd->add_option("--seed", opts->seed, "sampling seed");
  cmd->add_option("--repetition-penalty", opts->params.repetition_penalty, "1: off");
  cmd->add_option("--presence-penalty", opts->params.presence_penalty, "0: off");
  cmd->add_option("--frequency-penalty", opts->params.frequency_penalty, "0: off");
  cmd->add_flag("--ignore-eos", opts->params.ignore_eos, "do not stop at end-of-generation tokens");
  cmd->add_option("--threads,-t", opts->threads, "compute threads (0: all cores)");
  cmd->add_option("--block-size", opts->block_size, "KV cache block size in tokens")
      ->check(CLI::Range(1, 1024));
  cmd->callback([opts, cmd] {
    auto loaded = LoadedModel::open(opts->model, opts->threads);
    if (!loaded) {
      std::fprintf(stderr, "troupe generate: %s\n", loaded.error().message.c_str());
      throw CLI::RuntimeError(1);
    }
    model::GenerationRequest request;
    request.prompt = loaded->tokenizer->encode(opts->prompt, /*add_special=*/true);
    if (request.prompt.empty()) request.prompt.push_back(loaded->tokenizer->vocabulary().bos);
    request.params = opts->params;
    request.params.max_tokens = opts->num_tokens;
    if (cmd->count("--seed")) request.params.seed = opts->seed;
    const std::vector<model::GenerationRequest> requests = {request};
    auto kv = loaded->allocate_kv_cache(
        model::BatchGenerator::blocks_needed(requests, opts->block_size), opts->block_size);
    if (!kv) {
      std::fprintf(stderr, "troupe generate: %s\n", kv.error().message.c_str());
      throw CLI::RuntimeError(1);
    }
    model::IncrementalDetokenizer detokenizer(*loaded->tokenizer);
    model::BatchGenerator generator(*loaded->model,
                                    loaded->tokenizer->vocabulary().end_of_generation);
    model::GenerationStats stats;
    auto result = generator.run(
        requests, 0,
        [&](std::size_t, const model::SampledToken& token) {
          const std::string text = detokenizer.push(token.id);
          std::fwrite(text.data(), 1, text.size(), stdout);
          std::fflush(stdout);
        },
        &stats);
    const std::string rest = detokenizer.flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
    std::fputc('\n', stdout);
    if (!result) {
      std::fprintf(stderr, "troupe generate: %s\n", result.error().message.c_str());
      throw CLI::RuntimeError(1);
    }
    const double decode_tokens = static_cast<double>(stats.num_generated_tokens - 1);
    std::fprintf(stderr,
                 "prompt: %lld tokens in %.3f s (%.1f tokens/s); generation: %lld tokens, "
                 "%.1f tokens/s after the first; finish: %s\n",
                 static_cast<long long>(stats.num_prompt_tokens), stats.prefill_seconds,
                 stats.num_prompt_tokens / std::max(stats.prefill_seconds, 1e-9),
                 static_cast<long long>(stats.num_generated_tokens),
                 decode_tokens / std::max(stats.decode_seconds, 1e-9),
                 std::string(finish_reason_name((*result)[0].finish_reason)).c_str());
  });
}

}  // namespace troupe::app
