// `troupe bench forward`: prefill and decode throughput of the forward pass
// alone (no sampling, no scheduling), at several batch sizes.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <boost/json/serialize.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <random>

#include "app/commands.hpp"
#include "app/loaded_model.hpp"
#include "troupe/engine.hpp"

namespace troupe::app {

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<std::int32_t> blocks_from(std::int32_t first, std::int32_t count) {
  std::vector<std::int32_t> table(count);
  std::iota(table.begin(), table.end(), first);
  return table;
}

}  // namespace

void add_bench_forward_command(CLI::App& bench) {
  struct Options {
    std::string model, output_json;
    EngineConfig engine;  // device settings
    std::int32_t prompt_len = 512, gen_len = 128, block_size = 16, repetitions = 3;
    std::vector<std::int32_t> batches = {1, 8, 32, 64};
  };
  auto opts = std::make_shared<Options>();
  auto* cmd =
      bench.add_subcommand("forward", "prefill and batched decode tokens/s of the forward pass");
  cmd->add_option("--model,-m", opts->model, "GGUF model (default: the built-in random model)");
  cmd->add_option("--threads,-t", opts->engine.num_threads, "compute threads (0: all cores)");
  add_device_options(cmd, opts->engine);
  cmd->add_option("--prompt-len", opts->prompt_len, "prefill length")->check(CLI::PositiveNumber);
  cmd->add_option("--gen-len", opts->gen_len, "decode steps per batch size")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--batch", opts->batches, "decode batch sizes")->delimiter(',');
  cmd->add_option("--repetitions", opts->repetitions, "prefill runs (the median is reported)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--block-size", opts->block_size, "KV block size")->check(CLI::Range(1, 1024));
  cmd->add_option("--output-json", opts->output_json, "also write the results here");
  cmd->callback([opts] {
    auto fail = [](const Error& e) {
      std::fprintf(stderr, "troupe bench forward: %s\n", e.message.c_str());
      throw CLI::RuntimeError(1);
    };
    // Decode steps replay CUDA graphs up to the longest sequence the run makes.
    auto loaded =
        open_model(opts->model, opts->engine, std::max(opts->prompt_len, opts->gen_len) + 1);
    if (!loaded) fail(loaded.error());
    const auto& config = loaded->model->config();
    const std::int32_t bs = opts->block_size;
    const std::int32_t max_batch = *std::max_element(opts->batches.begin(), opts->batches.end());
    if (max_batch <= 0) fail(Error{ErrorCode::invalid_argument, "batch sizes must be positive"});
    const std::int32_t prompt_blocks = (opts->prompt_len + bs - 1) / bs;
    const std::int32_t gen_blocks = (opts->gen_len + bs - 1) / bs;
    if (auto kv = loaded->allocate_kv_cache(std::max(prompt_blocks, max_batch * gen_blocks), bs);
        !kv) {
      fail(kv.error());
    }
    std::mt19937 rng(42);
    std::uniform_int_distribution<TokenId> any_token(0, config.vocab_size - 1);
    std::vector<float> logits;

    // Prefill: one sequence of prompt_len tokens in one step; one warm-up run.
    std::vector<TokenId> prompt(opts->prompt_len);
    for (auto& t : prompt) t = any_token(rng);
    model::StepInput prefill;
    model::append_sequence(prefill, prompt, 0, blocks_from(0, prompt_blocks), true);
    std::vector<double> times;
    for (int rep = 0; rep <= opts->repetitions; ++rep) {
      const auto start = Clock::now();
      if (auto r = loaded->model->forward(prefill, logits); !r) fail(r.error());
      if (rep > 0) times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    const double prefill_tps = opts->prompt_len / median(times);
    std::fprintf(stderr, "model %s: %s, %s\n", loaded->path.c_str(), config.architecture.c_str(),
                 loaded->backend->describe().c_str());
    std::printf("prefill  %5d tokens          %10.1f tokens/s\n", opts->prompt_len, prefill_tps);

    // Decode: `batch` sequences each generate gen_len tokens from an empty context,
    // one token per sequence per step (as llama-bench's tg).
    std::vector<std::pair<std::int32_t, double>> decode;
    for (const std::int32_t batch : opts->batches) {
      auto run_steps = [&](std::int32_t num_steps) {
        for (std::int32_t pos = 0; pos < num_steps; ++pos) {
          model::StepInput step;
          for (std::int32_t s = 0; s < batch; ++s) {
            const TokenId token = any_token(rng);
            model::append_sequence(step, std::span(&token, 1), pos,
                                   blocks_from(s * gen_blocks, gen_blocks), true);
          }
          if (auto r = loaded->model->forward(step, logits); !r) fail(r.error());
        }
      };
      run_steps(std::min(opts->gen_len, 4));  // warm-up
      const auto start = Clock::now();
      run_steps(opts->gen_len);
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      const double tps = static_cast<double>(batch) * opts->gen_len / seconds;
      decode.emplace_back(batch, tps);
      std::printf("decode   batch %3d x %4d     %10.1f tokens/s  (%.2f ms/step)\n", batch,
                  opts->gen_len, tps, 1000.0 * seconds / opts->gen_len);
    }

    if (!opts->output_json.empty()) {
      boost::json::object json;
      json["model"] = loaded->path;
      json["backend"] = loaded->backend->describe();
      json["prompt_len"] = opts->prompt_len;
      json["gen_len"] = opts->gen_len;
      json["prefill_tokens_per_second"] = prefill_tps;
      boost::json::object per_batch;  // keyed by the batch size
      for (const auto& [batch, tps] : decode) per_batch[std::to_string(batch)] = tps;
      json["decode_tokens_per_second"] = std::move(per_batch);
      std::ofstream out(opts->output_json);
      out << boost::json::serialize(json) << '\n';
      if (!out) fail(Error{ErrorCode::io, "cannot write " + opts->output_json});
    }
  });
}

}  // namespace troupe::app
