#include "bench/forward.hpp"

#include <algorithm>
#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <thread>

#include "gguf/gguf_file.hpp"
#include "model/step_input.hpp"

namespace troupe::bench {

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

// Writes `context` random tokens into the blocks of `table`, through the model's steps in
// chunks: a sequence's history.
Result<void> fill_context(model::LoadedModel& loaded, std::int32_t context,
                          const std::vector<std::int32_t>& table, std::mt19937& rng,
                          std::vector<float>& logits) {
  std::uniform_int_distribution<TokenId> any_token(0, loaded.model->config().vocab_size - 1);
  constexpr std::int32_t kChunk = 2048;
  for (std::int32_t done = 0; done < context; done += kChunk) {
    std::vector<TokenId> tokens(std::min(kChunk, context - done));
    for (auto& t : tokens) t = any_token(rng);
    model::StepInput step;
    model::append_sequence(step, tokens, done, table, true);
    TROUPE_TRY_VOID(loaded.model->forward(step, logits));
  }
  return {};
}

// Runs the prefill and decode steps on `loaded` after `context` tokens of history. Each of
// the largest batch's sequences has a history of its own (as llama-batched-bench's, not a
// shared prefix that the caches would keep warm), then its own blocks for what it adds.
Result<ForwardResult> measure(model::LoadedModel& loaded, const ForwardOptions& opts,
                              std::int32_t context) {
  const auto& config = loaded.model->config();
  const std::int32_t bs = opts.block_size;
  const std::int32_t max_batch = *std::max_element(opts.batches.begin(), opts.batches.end());
  const std::int32_t history_blocks = context / bs;
  const std::int32_t prompt_blocks = (opts.prompt_len + bs - 1) / bs;
  const std::int32_t draft = opts.num_speculative_tokens;
  const std::int32_t gen_blocks = (opts.gen_len + draft + bs - 1) / bs;
  const std::int32_t seq_blocks = history_blocks + std::max(prompt_blocks, gen_blocks);
  TROUPE_TRY_VOID(loaded.allocate_kv_cache(max_batch * seq_blocks, bs));
  model::Backend& backend = *loaded.backend;
  std::mt19937 rng(42);
  std::uniform_int_distribution<TokenId> any_token(0, config.vocab_size - 1);
  std::vector<float> logits;
  ForwardResult out;
  out.context = context;
  // Sequence s: its history's blocks, then `count` of its own.
  const auto table_of = [&](std::int32_t s, std::int32_t count) {
    return blocks_from(s * seq_blocks, history_blocks + count);
  };
  // Histories are written as the batches need them (the prefill, then each batch size).
  std::int32_t filled = 0;
  const auto fill_up_to = [&](std::int32_t n) -> Result<void> {
    for (; context > 0 && filled < n; ++filled) {
      TROUPE_TRY_VOID(fill_context(loaded, context, table_of(filled, 0), rng, logits));
    }
    return {};
  };
  TROUPE_TRY_VOID(fill_up_to(1));

  // Prefill: one sequence of prompt_len tokens in one step; one warm-up run.
  std::vector<TokenId> prompt(opts.prompt_len);
  for (auto& t : prompt) t = any_token(rng);
  model::StepInput prefill;
  model::append_sequence(prefill, prompt, context, table_of(0, prompt_blocks), true);
  model::StepInput prefill_lora;
  model::append_sequence(prefill_lora, prompt, context, table_of(0, prompt_blocks), true,
                         opts.num_adapters > 0 ? 1 : 0);
  std::vector<double> times, lora_times;
  double all_reduce = 0.0, total = 0.0;
  for (int rep = 0; rep <= opts.repetitions; ++rep) {
    const double before = backend.all_reduce_seconds();
    const auto start = Clock::now();
    TROUPE_TRY_VOID(loaded.model->forward(prefill, logits));
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (opts.num_adapters > 0) {
      const auto lora_start = Clock::now();
      TROUPE_TRY_VOID(loaded.model->forward(prefill_lora, logits));
      if (rep > 0) {
        lora_times.push_back(std::chrono::duration<double>(Clock::now() - lora_start).count());
      }
    }
    if (rep == 0) continue;
    times.push_back(seconds);
    total += seconds;
    all_reduce += backend.all_reduce_seconds() - before;
  }
  std::uint64_t hash = 14695981039346656037ULL;  // FNV-1a over the logits' bytes
  for (const float value : logits) {
    unsigned char bytes[sizeof(float)];
    std::memcpy(bytes, &value, sizeof(float));
    for (const unsigned char b : bytes) hash = (hash ^ b) * 1099511628211ULL;
  }
  if (!logits.empty()) out.prefill_logits_hash = hash;
  out.prefill_tokens_per_second = opts.prompt_len / median(times);
  out.prefill_all_reduce_share = all_reduce / total;
  if (!lora_times.empty())
    out.prefill_lora_tokens_per_second = opts.prompt_len / median(lora_times);

  // Decode: `batch` sequences each generate gen_len tokens after the history, one token
  // per sequence per step (as llama-bench's tg).
  for (const std::int32_t batch : opts.batches) {
    TROUPE_TRY_VOID(fill_up_to(batch));
    // With `lora`, sequence s runs under adapter 1 + s % num_adapters.
    auto run_steps = [&](std::int32_t num_steps, bool lora) -> Result<void> {
      for (std::int32_t i = 0; i < num_steps; ++i) {
        model::StepInput step;
        for (std::int32_t s = 0; s < batch; ++s) {
          const TokenId token = any_token(rng);
          model::append_sequence(step, std::span(&token, 1), context + i, table_of(s, gen_blocks),
                                 true, lora ? 1 + s % opts.num_adapters : 0);
        }
        TROUPE_TRY_VOID(loaded.model->forward(step, logits));
      }
      return {};
    };
    TROUPE_TRY_VOID(run_steps(std::min(opts.gen_len, 4), false));  // warm-up
    double seconds = 0.0, lora_seconds = 0.0, step_all_reduce = 0.0;
    // In rounds of 16 steps, base and adapted in turn (one kind alone without adapters).
    for (std::int32_t done = 0; done < opts.gen_len;) {
      const std::int32_t n = std::min(16, opts.gen_len - done);
      const double round_before = backend.all_reduce_seconds();
      const auto start = Clock::now();
      TROUPE_TRY_VOID(run_steps(n, false));
      seconds += std::chrono::duration<double>(Clock::now() - start).count();
      step_all_reduce += backend.all_reduce_seconds() - round_before;
      if (opts.num_adapters > 0) {
        if (done == 0) TROUPE_TRY_VOID(run_steps(std::min(opts.gen_len, 4), true));  // warm-up
        const auto lora_start = Clock::now();
        TROUPE_TRY_VOID(run_steps(n, true));
        lora_seconds += std::chrono::duration<double>(Clock::now() - lora_start).count();
      }
      done += n;
    }
    out.decode.push_back({batch, static_cast<double>(batch) * opts.gen_len / seconds,
                          1000.0 * seconds / opts.gen_len, step_all_reduce / seconds});
    out.decode.back().lora_ms_per_step = 1000.0 * lora_seconds / opts.gen_len;
    if (draft > 0) {
      // The same steps with a draft of k tokens per sequence: 1 + k rows each, all scored.
      auto run_verify = [&](std::int32_t num_steps) -> Result<void> {
        std::vector<TokenId> tokens(static_cast<std::size_t>(draft) + 1);
        for (std::int32_t i = 0; i < num_steps; ++i) {
          model::StepInput step;
          for (std::int32_t s = 0; s < batch; ++s) {
            for (auto& t : tokens) t = any_token(rng);
            model::append_sequence(step, tokens, context + i, table_of(s, gen_blocks), false);
            for (std::int32_t r = step.num_tokens() - draft - 1; r < step.num_tokens(); ++r) {
              step.logit_rows.push_back(r);
            }
          }
          TROUPE_TRY_VOID(loaded.model->forward(step, logits));
        }
        return {};
      };
      TROUPE_TRY_VOID(run_verify(std::min(opts.gen_len, 4)));  // warm-up
      const auto verify_start = Clock::now();
      TROUPE_TRY_VOID(run_verify(opts.gen_len));
      out.decode.back().verify_ms_per_step =
          1000.0 * std::chrono::duration<double>(Clock::now() - verify_start).count() /
          opts.gen_len;
    }
  }
  return out;
}

boost::json::object result_json(const ForwardResult& m) {
  boost::json::object o;
  o["context"] = m.context;
  o["prefill_tokens_per_second"] = m.prefill_tokens_per_second;
  if (m.prefill_logits_hash != 0) {
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx",
                  static_cast<unsigned long long>(m.prefill_logits_hash));
    o["prefill_logits_hash"] = hex;
  }
  if (m.prefill_lora_tokens_per_second > 0) {
    o["prefill_lora_tokens_per_second"] = m.prefill_lora_tokens_per_second;
  }
  boost::json::object per_batch, ms_per_step, verify, lora;  // keyed by the batch size
  for (const auto& d : m.decode) {
    per_batch[std::to_string(d.batch)] = d.tokens_per_second;
    ms_per_step[std::to_string(d.batch)] = d.ms_per_step;
    if (d.verify_ms_per_step > 0) verify[std::to_string(d.batch)] = d.verify_ms_per_step;
    if (d.lora_ms_per_step > 0) lora[std::to_string(d.batch)] = d.lora_ms_per_step;
  }
  o["decode_tokens_per_second"] = std::move(per_batch);
  o["decode_ms_per_step"] = std::move(ms_per_step);
  if (!verify.empty()) o["verify_ms_per_step"] = std::move(verify);
  if (!lora.empty()) o["lora_ms_per_step"] = std::move(lora);
  return o;
}

}  // namespace

Result<std::vector<ForwardResult>> run_forward(model::LoadedModel& loaded,
                                               const ForwardOptions& options) {
  std::vector<ForwardResult> out;
  for (const std::int32_t context : options.contexts) {
    TROUPE_TRY(auto measured, measure(loaded, options, context));
    out.push_back(std::move(measured));
  }
  return out;
}

void print(const ForwardOptions& opts, const ForwardResult& m, bool split) {
  if (opts.contexts.size() > 1 || m.context > 0) std::printf("context %d tokens\n", m.context);
  std::printf("prefill  %5d tokens          %10.1f tokens/s", opts.prompt_len,
              m.prefill_tokens_per_second);
  if (split) std::printf("  (all-reduce %4.1f%%)", 100.0 * m.prefill_all_reduce_share);
  std::printf("\n");
  if (m.prefill_lora_tokens_per_second > 0) {
    std::printf("prefill  %5d tokens, LoRA    %10.1f tokens/s  (%.2fx the base model)\n",
                opts.prompt_len, m.prefill_lora_tokens_per_second,
                m.prefill_lora_tokens_per_second / m.prefill_tokens_per_second);
  }
  for (const auto& d : m.decode) {
    std::printf("decode   batch %3d x %4d     %10.1f tokens/s  (%.2f ms/step", d.batch,
                opts.gen_len, d.tokens_per_second, d.ms_per_step);
    if (split) std::printf(", all-reduce %4.1f%%", 100.0 * d.all_reduce_share);
    std::printf(")\n");
    if (d.lora_ms_per_step > 0) {
      std::printf(
          "LoRA     batch %3d x %4d     %2d adapter(s)     %.2f ms/step (%.3fx the base "
          "step)\n",
          d.batch, opts.gen_len, std::min(opts.num_adapters, d.batch), d.lora_ms_per_step,
          d.lora_ms_per_step / d.ms_per_step);
    }
    if (d.verify_ms_per_step > 0) {
      std::printf(
          "verify   batch %3d x %4d     %2d tokens/seq     %.2f ms/step (%.2fx the decode step)\n",
          d.batch, opts.gen_len, opts.num_speculative_tokens + 1, d.verify_ms_per_step,
          d.verify_ms_per_step / d.ms_per_step);
    }
  }
  std::fflush(stdout);
}

// Every matrix but an untied embedding table (one row is read), and of the experts
// (stacked, or one tensor each) only the used ones' share.
std::uint64_t weight_bytes_per_step(const std::string& path) {
  const auto file = gguf::GgufFile::open(path);
  if (!file) return 0;
  const bool tied = file->find_tensor("output.weight") == nullptr;
  std::uint64_t num_experts = 0, num_used = 0;
  if (const auto arch = file->get_string("general.architecture")) {
    num_experts = file->get_uint(std::string(*arch) + ".expert_count").value_or(0);
    num_used = file->get_uint(std::string(*arch) + ".expert_used_count").value_or(0);
  }
  std::uint64_t total = 0;
  for (const auto& t : file->tensors()) {
    if (t.name == "token_embd.weight" && !tied) continue;
    const bool experts = model::is_expert_tensor(t.name) && num_experts > 0;
    total += experts ? t.num_bytes / num_experts * std::min(num_used, num_experts) : t.num_bytes;
  }
  return total;
}

// The best of five passes over 1 GiB (beyond any cache), each thread summing its own part.
double read_bandwidth_gb_s(int threads) {
  constexpr std::size_t kWords = std::size_t{1} << 27;  // 1 GiB of 8-byte words
  std::vector<std::uint64_t> buffer(kWords, 1);
  std::vector<std::uint64_t> sums(static_cast<std::size_t>(threads) * 8);  // apart: no sharing
  double best = 0.0;
  for (int pass = 0; pass < 5; ++pass) {
    const auto start = Clock::now();
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        const std::size_t begin = kWords / threads * t;
        const std::size_t end = t + 1 == threads ? kWords : kWords / threads * (t + 1);
        std::uint64_t a = 0, b = 0, c = 0, d = 0;
        for (std::size_t i = begin; i + 4 <= end; i += 4) {
          a += buffer[i];
          b += buffer[i + 1];
          c += buffer[i + 2];
          d += buffer[i + 3];
        }
        sums[static_cast<std::size_t>(t) * 8] = a + b + c + d;
      });
    }
    for (auto& w : workers) w.join();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::max(best, static_cast<double>(kWords * 8) / seconds / 1e9);
  }
  TROUPE_ASSERT(std::accumulate(sums.begin(), sums.end(), std::uint64_t{0}) == kWords,
                "the bandwidth pass skipped words");
  return best;
}

std::string to_json(const ForwardOptions& options, const ForwardReport& report) {
  boost::json::object json;
  json["model"] = report.model_path;
  json["backend"] = report.backend;
  json["prompt_len"] = options.prompt_len;
  json["gen_len"] = options.gen_len;
  json["tensor_parallel_size"] = report.tensor_parallel_size;
  if (report.pipeline_parallel_size > 1) {
    json["pipeline_parallel_size"] = report.pipeline_parallel_size;
    json["pipeline_stages"] = report.layer_partition;
  }
  json["weight_bytes_per_step"] = report.weight_bytes_per_step;
  if (report.memory_read_gb_per_second > 0.0) {
    json["memory_read_gb_per_second"] = report.memory_read_gb_per_second;
  }
  // The first context's results at the top, every context's under "contexts".
  const boost::json::object whole_json = result_json(report.whole.front());
  for (const auto& [key, value] : whole_json) json[key] = value;
  boost::json::array contexts;
  for (const auto& m : report.whole) contexts.push_back(result_json(m));
  json["contexts"] = std::move(contexts);
  if (!report.split.empty()) {
    boost::json::object split_json = result_json(report.split.front());
    boost::json::array split_contexts;
    for (const auto& m : report.split) split_contexts.push_back(result_json(m));
    split_json["contexts"] = std::move(split_contexts);
    json["split"] = std::move(split_json);
  }
  return boost::json::serialize(json) + "\n";
}

}  // namespace troupe::bench
