// `troupe bench forward`: prefill and decode throughput of the forward pass
// alone (no sampling, no scheduling), at several batch sizes and depths of context
// (llama-bench's -d: the steps run after that many tokens are in the KV cache). With
// --tensor-parallel-size T, the model split over T ranks (one process each, on CPUs;
// Gloo on loopback) against the whole model on one process with T times the threads,
// in one run, with the share of each step spent in the all-reduce.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <boost/json/serialize.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <thread>

#include "app/bench_profile.hpp"
#include "app/commands.hpp"
#include "app/loaded_model.hpp"
#include "app/speculative_options.hpp"
#include "gguf/gguf_file.hpp"
#include "model/rendezvous_stores.hpp"
#include "troupe/engine.hpp"
#include "worker/backend_factory.hpp"

extern char** environ;

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

struct Options {
  std::string model, output_json;
  EngineConfig engine;  // device settings
  std::int32_t prompt_len = 512, gen_len = 128, block_size = 16, repetitions = 3;
  std::vector<std::int32_t> batches = {1, 8, 32, 64};
  std::vector<std::int32_t> contexts = {0};  // tokens already in the cache
  std::int32_t tensor_parallel_size = 1;
  bool memory_bandwidth = false;  // also measure the machine's read bandwidth
  bool profile = false;           // also time each op of a prefill and of decode steps
  std::int32_t rank = 0;          // a rank's process, spawned by rank 0
  std::string rendezvous;         // its rendezvous directory
};

[[noreturn]] void fail(const Error& e) {
  std::fprintf(stderr, "troupe bench forward: %s\n", e.message.c_str());
  throw CLI::RuntimeError(1);
}

struct Measured {
  std::int32_t context = 0;
  double prefill_tokens_per_second = 0.0;
  double prefill_all_reduce_share = 0.0;
  struct Decode {
    std::int32_t batch = 0;
    double tokens_per_second = 0.0;
    double ms_per_step = 0.0;
    double all_reduce_share = 0.0;  // of the step's time, on rank 0
    // --speculative-config's k: a verification step, each sequence 1 + k tokens with
    // logits at each (what a step whose every sequence carries a full draft costs).
    double verify_ms_per_step = 0.0;
  };
  std::vector<Decode> decode;
};

// Writes `context` random tokens into the blocks of `table`, through the model's steps in
// chunks: a sequence's history.
void fill_context(model::LoadedModel& loaded, std::int32_t context,
                  const std::vector<std::int32_t>& table, std::mt19937& rng,
                  std::vector<float>& logits) {
  std::uniform_int_distribution<TokenId> any_token(0, loaded.model->config().vocab_size - 1);
  constexpr std::int32_t kChunk = 2048;
  for (std::int32_t done = 0; done < context; done += kChunk) {
    std::vector<TokenId> tokens(std::min(kChunk, context - done));
    for (auto& t : tokens) t = any_token(rng);
    model::StepInput step;
    model::append_sequence(step, tokens, done, table, true);
    if (auto r = loaded.model->forward(step, logits); !r) fail(r.error());
  }
}

// Runs the prefill and decode steps on `loaded` after `context` tokens of history (every
// rank of a group runs the same steps: the tokens come from the same seed). Each of the
// largest batch's sequences has a history of its own (as llama-batched-bench's, not a
// shared prefix that the caches would keep warm), then its own blocks for what it adds.
Measured measure(model::LoadedModel& loaded, const Options& opts, std::int32_t context) {
  const auto& config = loaded.model->config();
  const std::int32_t bs = opts.block_size;
  const std::int32_t max_batch = *std::max_element(opts.batches.begin(), opts.batches.end());
  const std::int32_t history_blocks = context / bs;
  const std::int32_t prompt_blocks = (opts.prompt_len + bs - 1) / bs;
  const std::int32_t draft = opts.engine.speculative.num_speculative_tokens;
  const std::int32_t gen_blocks = (opts.gen_len + draft + bs - 1) / bs;
  const std::int32_t seq_blocks = history_blocks + std::max(prompt_blocks, gen_blocks);
  if (auto kv = loaded.allocate_kv_cache(max_batch * seq_blocks, bs); !kv) fail(kv.error());
  model::Backend& backend = *loaded.backend;
  std::mt19937 rng(42);
  std::uniform_int_distribution<TokenId> any_token(0, config.vocab_size - 1);
  std::vector<float> logits;
  Measured out;
  out.context = context;
  // Sequence s: its history's blocks, then `count` of its own.
  const auto table_of = [&](std::int32_t s, std::int32_t count) {
    return blocks_from(s * seq_blocks, history_blocks + count);
  };
  // Histories are written as the batches need them (the prefill, then each batch size).
  std::int32_t filled = 0;
  const auto fill_up_to = [&](std::int32_t n) {
    for (; context > 0 && filled < n; ++filled) {
      fill_context(loaded, context, table_of(filled, 0), rng, logits);
    }
  };
  fill_up_to(1);

  // Prefill: one sequence of prompt_len tokens in one step; one warm-up run.
  std::vector<TokenId> prompt(opts.prompt_len);
  for (auto& t : prompt) t = any_token(rng);
  model::StepInput prefill;
  model::append_sequence(prefill, prompt, context, table_of(0, prompt_blocks), true);
  std::vector<double> times;
  double all_reduce = 0.0, total = 0.0;
  for (int rep = 0; rep <= opts.repetitions; ++rep) {
    const double before = backend.all_reduce_seconds();
    const auto start = Clock::now();
    if (auto r = loaded.model->forward(prefill, logits); !r) fail(r.error());
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (rep == 0) continue;
    times.push_back(seconds);
    total += seconds;
    all_reduce += backend.all_reduce_seconds() - before;
  }
  out.prefill_tokens_per_second = opts.prompt_len / median(times);
  out.prefill_all_reduce_share = all_reduce / total;

  // Decode: `batch` sequences each generate gen_len tokens after the history, one token
  // per sequence per step (as llama-bench's tg).
  for (const std::int32_t batch : opts.batches) {
    fill_up_to(batch);
    auto run_steps = [&](std::int32_t num_steps) {
      for (std::int32_t i = 0; i < num_steps; ++i) {
        model::StepInput step;
        for (std::int32_t s = 0; s < batch; ++s) {
          const TokenId token = any_token(rng);
          model::append_sequence(step, std::span(&token, 1), context + i, table_of(s, gen_blocks),
                                 true);
        }
        if (auto r = loaded.model->forward(step, logits); !r) fail(r.error());
      }
    };
    run_steps(std::min(opts.gen_len, 4));  // warm-up
    const double before = backend.all_reduce_seconds();
    const auto start = Clock::now();
    run_steps(opts.gen_len);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    out.decode.push_back({batch, static_cast<double>(batch) * opts.gen_len / seconds,
                          1000.0 * seconds / opts.gen_len,
                          (backend.all_reduce_seconds() - before) / seconds});
    if (draft > 0) {
      // The same steps with a draft of k tokens per sequence: 1 + k rows each, all scored.
      auto run_verify = [&](std::int32_t num_steps) {
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
          if (auto r = loaded.model->forward(step, logits); !r) fail(r.error());
        }
      };
      run_verify(std::min(opts.gen_len, 4));  // warm-up
      const auto verify_start = Clock::now();
      run_verify(opts.gen_len);
      out.decode.back().verify_ms_per_step =
          1000.0 * std::chrono::duration<double>(Clock::now() - verify_start).count() /
          opts.gen_len;
    }
  }
  return out;
}

std::vector<Measured> measure_all(model::LoadedModel& loaded, const Options& opts) {
  std::vector<Measured> out;
  for (const std::int32_t context : opts.contexts) out.push_back(measure(loaded, opts, context));
  return out;
}

void print(const Measured& m, const Options& opts, bool split) {
  if (opts.contexts.size() > 1 || m.context > 0) std::printf("context %d tokens\n", m.context);
  std::printf("prefill  %5d tokens          %10.1f tokens/s", opts.prompt_len,
              m.prefill_tokens_per_second);
  if (split) std::printf("  (all-reduce %4.1f%%)", 100.0 * m.prefill_all_reduce_share);
  std::printf("\n");
  for (const auto& d : m.decode) {
    std::printf("decode   batch %3d x %4d     %10.1f tokens/s  (%.2f ms/step", d.batch,
                opts.gen_len, d.tokens_per_second, d.ms_per_step);
    if (split) std::printf(", all-reduce %4.1f%%", 100.0 * d.all_reduce_share);
    std::printf(")\n");
    if (d.verify_ms_per_step > 0) {
      std::printf(
          "verify   batch %3d x %4d     %2d tokens/seq     %.2f ms/step (%.2fx the decode step)\n",
          d.batch, opts.gen_len, opts.engine.speculative.num_speculative_tokens + 1,
          d.verify_ms_per_step, d.verify_ms_per_step / d.ms_per_step);
    }
  }
  std::fflush(stdout);
}

// A batch-1 decode step's weight reads: every matrix but an untied embedding table (one row is
// read), and of the experts (stacked, or one tensor each) only the used ones' share.
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

// The machine's memory read bandwidth with `threads` threads, in GB/s: the best of five
// passes over 1 GiB (beyond any cache), each thread summing its own part.
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

// This process's command line, to start the other ranks with.
std::vector<std::string> own_arguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  std::string arg;
  while (std::getline(in, arg, '\0')) args.push_back(arg);
  return args;
}

// Starts ranks 1.. as processes of this binary, each told its rank and the rendezvous.
std::vector<pid_t> spawn_ranks(const Options& opts, const std::string& dir) {
  std::vector<pid_t> ranks;
  const auto base = own_arguments();
  for (std::int32_t r = 1; r < opts.tensor_parallel_size; ++r) {
    std::vector<std::string> args = base;
    args.insert(args.end(), {"--tp-rank", std::to_string(r), "--tp-rendezvous", dir});
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    if (::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ) != 0) {
      for (const pid_t p : ranks) ::kill(p, SIGKILL);
      fail(Error{ErrorCode::io, "cannot start the process of rank " + std::to_string(r)});
    }
    ranks.push_back(pid);
  }
  return ranks;
}

// This process's rank of the group, loaded and joined.
Result<model::LoadedModel> open_rank(const Options& opts, std::int32_t max_model_len,
                                     model::RendezvousStore& store) {
  std::string path = opts.model;
  if (path.empty()) path = builtin_model_path();
  auto spec = worker::spec_for(opts.engine, path, max_model_len);
  spec.rank = opts.rank;
  spec.world_size = opts.tensor_parallel_size;
  worker::GroupLink link;
  link.store = &store;
  link.prefix = "bench";
  link.timeout = std::chrono::minutes(2);
  return worker::open_model(spec, &link);
}

}  // namespace

void add_bench_forward_command(CLI::App& bench) {
  auto opts = std::make_shared<Options>();
  auto* cmd =
      bench.add_subcommand("forward", "prefill and batched decode tokens/s of the forward pass");
  cmd->add_option("--model,-m", opts->model, "GGUF model (default: the built-in random model)");
  cmd->add_option("--threads,-t", opts->engine.num_threads,
                  "compute threads (0: all cores); per rank when split");
  add_device_options(cmd, opts->engine);
  add_speculative_option(cmd, opts->engine);
  cmd->add_option("--prompt-len", opts->prompt_len, "prefill length")->check(CLI::PositiveNumber);
  cmd->add_option("--gen-len", opts->gen_len, "decode steps per batch size")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--batch", opts->batches, "decode batch sizes")->delimiter(',');
  cmd->add_option("--repetitions", opts->repetitions, "prefill runs (the median is reported)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--block-size", opts->block_size, "KV block size")->check(CLI::Range(1, 1024));
  cmd->add_option("--context,-d", opts->contexts,
                  "tokens already in the KV cache when the steps run, one run per value "
                  "(multiples of the block size); each sequence of the largest "
                  "--batch gets a history of its own, so keep --batch small at long contexts")
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--tensor-parallel-size,--tp", opts->tensor_parallel_size,
                  "split the model over this many CPU ranks (a process each), and compare with "
                  "the whole model on one process with as many threads in all")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--tp-rank", opts->rank, "(internal) this process's rank")->group("");
  cmd->add_option("--tp-rendezvous", opts->rendezvous, "(internal) the ranks' directory")
      ->group("");
  cmd->add_flag("--memory-bandwidth", opts->memory_bandwidth,
                "also measure the machine's memory read bandwidth with as many threads, and the "
                "share of it batch-1 decode reaches");
  cmd->add_flag("--profile", opts->profile,
                "then time each op of one prefill and of 16 decode steps at each --batch (CPU): "
                "its share, and the int8 matmuls' rate against the processor's int8 peak and "
                "the weights' read rate against --memory-bandwidth's measure");
  cmd->add_option("--output-json", opts->output_json, "also write the results here");
  cmd->callback([opts] {
    for (const std::int32_t context : opts->contexts) {
      if (context % opts->block_size != 0) {
        throw CLI::ValidationError("--context", std::to_string(context) +
                                                    " is not a multiple of the block size " +
                                                    std::to_string(opts->block_size));
      }
    }
    const std::int32_t batch = *std::max_element(opts->batches.begin(), opts->batches.end());
    if (batch <= 0) throw CLI::ValidationError("--batch", "batch sizes must be positive");
    // Decode steps replay CUDA graphs up to the longest sequence the run makes.
    const std::int32_t max_model_len =
        *std::max_element(opts->contexts.begin(), opts->contexts.end()) +
        std::max(opts->prompt_len, opts->gen_len) + 1;
    const std::int32_t tp = opts->tensor_parallel_size;
    // Threads per rank: as given, or the cores shared among the ranks. The whole model
    // gets the threads of all the ranks.
    if (tp > 1 && opts->engine.num_threads <= 0) {
      const auto cores = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
      opts->engine.num_threads = std::max(1, cores / tp);
    }
    if (opts->rank > 0) {  // one of the group's other ranks: same steps, no output
      model::FileStore store(opts->rendezvous);
      auto loaded = open_rank(*opts, max_model_len, store);
      if (!loaded) fail(loaded.error());
      measure_all(*loaded, *opts);
      return;
    }
    if (tp > 1 && opts->engine.device != Device::cpu) {
      fail(Error{ErrorCode::unsupported, "--tensor-parallel-size runs on CPU ranks only"});
    }
    Options whole = *opts;
    if (tp > 1) whole.engine.num_threads = opts->engine.num_threads * tp;
    auto loaded = open_model(whole.model, whole.engine, max_model_len);
    if (!loaded) fail(loaded.error());
    std::fprintf(stderr, "model %s: %s, %s\n", loaded->path.c_str(),
                 loaded->model->config().architecture.c_str(), loaded->backend->describe().c_str());
    if (tp > 1) std::printf("whole model, one process, %d threads\n", whole.engine.num_threads);
    const std::string backend_name = loaded->backend->describe();
    const std::string model_path = loaded->path;
    const std::vector<Measured> one = measure_all(*loaded, whole);
    for (const auto& m : one) print(m, *opts, false);
    // Batch-1 decode reads every weight once a step: its bytes per second against the
    // machine's bandwidth say how close to the memory bound it runs.
    const std::uint64_t step_bytes = weight_bytes_per_step(model_path);
    double bandwidth = 0.0, decode_bytes_per_second = 0.0;
    for (const auto& d : one.front().decode) {
      if (d.batch == 1) decode_bytes_per_second = step_bytes / (d.ms_per_step / 1000.0);
    }
    if (decode_bytes_per_second > 0.0) {
      std::printf("weights read per decode step: %.1f MB; at batch 1: %.1f GB/s\n",
                  step_bytes / 1e6, decode_bytes_per_second / 1e9);
    }
    if (opts->memory_bandwidth) {
      const int threads = whole.engine.num_threads > 0
                              ? whole.engine.num_threads
                              : static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
      bandwidth = read_bandwidth_gb_s(threads);
      std::printf("memory read bandwidth, %d threads: %.1f GB/s", threads, bandwidth);
      if (decode_bytes_per_second > 0.0) {
        std::printf("; batch-1 decode reaches %.0f%% of it",
                    100.0 * decode_bytes_per_second / 1e9 / bandwidth);
      }
      std::printf("\n");
    }
    if (opts->profile) {
      const int threads = whole.engine.num_threads > 0
                              ? whole.engine.num_threads
                              : static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
      print_profile(*loaded, opts->prompt_len, opts->batches, opts->block_size, threads, bandwidth);
    }
    loaded = Result<model::LoadedModel>(model::LoadedModel{});  // its memory, before the ranks
    std::vector<Measured> split;
    if (tp > 1) {
      const auto dir = std::filesystem::temp_directory_path() /
                       ("troupe-bench-tp-" + std::to_string(::getpid()));
      std::filesystem::create_directories(dir);
      const auto ranks = spawn_ranks(*opts, dir.string());
      model::FileStore store(dir);
      auto rank0 = open_rank(*opts, max_model_len, store);
      if (!rank0) {
        for (const pid_t p : ranks) ::kill(p, SIGKILL);
        fail(rank0.error());
      }
      std::printf("split over %d ranks, a process each, %d thread(s) per rank\n", tp,
                  opts->engine.num_threads);
      try {
        split = measure_all(*rank0, *opts);
      } catch (...) {
        for (const pid_t p : ranks) ::kill(p, SIGKILL);
        for (const pid_t p : ranks) ::waitpid(p, nullptr, 0);
        std::filesystem::remove_all(dir);
        throw;
      }
      for (const auto& m : split) print(m, *opts, true);
      for (const pid_t p : ranks) ::waitpid(p, nullptr, 0);
      std::filesystem::remove_all(dir);
      for (std::size_t c = 0; c < one.size(); ++c) {
        std::printf("split / whole at context %d: prefill %.2fx", one[c].context,
                    split[c].prefill_tokens_per_second / one[c].prefill_tokens_per_second);
        for (std::size_t i = 0; i < one[c].decode.size(); ++i) {
          std::printf(", decode batch %d %.2fx", one[c].decode[i].batch,
                      split[c].decode[i].tokens_per_second / one[c].decode[i].tokens_per_second);
        }
        std::printf("\n");
      }
    }

    if (!opts->output_json.empty()) {
      boost::json::object json;
      json["model"] = model_path;
      json["backend"] = backend_name;
      json["prompt_len"] = opts->prompt_len;
      json["gen_len"] = opts->gen_len;
      json["tensor_parallel_size"] = tp;
      json["weight_bytes_per_step"] = step_bytes;
      if (bandwidth > 0.0) json["memory_read_gb_per_second"] = bandwidth;
      auto write = [](const Measured& m) {
        boost::json::object o;
        o["context"] = m.context;
        o["prefill_tokens_per_second"] = m.prefill_tokens_per_second;
        boost::json::object per_batch, ms_per_step, verify;  // keyed by the batch size
        for (const auto& d : m.decode) {
          per_batch[std::to_string(d.batch)] = d.tokens_per_second;
          ms_per_step[std::to_string(d.batch)] = d.ms_per_step;
          if (d.verify_ms_per_step > 0) verify[std::to_string(d.batch)] = d.verify_ms_per_step;
        }
        o["decode_tokens_per_second"] = std::move(per_batch);
        o["decode_ms_per_step"] = std::move(ms_per_step);
        if (!verify.empty()) o["verify_ms_per_step"] = std::move(verify);
        return o;
      };
      // The first context's results at the top, every context's under "contexts".
      const boost::json::object whole_json = write(one.front());
      for (const auto& [key, value] : whole_json) json[key] = value;
      boost::json::array contexts;
      for (const auto& m : one) contexts.push_back(write(m));
      json["contexts"] = std::move(contexts);
      if (tp > 1) {
        boost::json::object split_json = write(split.front());
        boost::json::array split_contexts;
        for (const auto& m : split) split_contexts.push_back(write(m));
        split_json["contexts"] = std::move(split_contexts);
        json["split"] = std::move(split_json);
      }
      std::ofstream out(opts->output_json);
      out << boost::json::serialize(json) << '\n';
      if (!out) fail(Error{ErrorCode::io, "cannot write " + opts->output_json});
    }
  });
}

}  // namespace troupe::app
