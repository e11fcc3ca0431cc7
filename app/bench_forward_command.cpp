// `troupe bench forward`: prefill and decode throughput of the forward pass alone
// (bench/forward). With --tensor-parallel-size T, the model split over T ranks (one process
// each, on CPUs; Gloo on loopback) against the whole model on one process with T times the
// threads, in one run, with the share of each step spent in the all-reduce. With
// --pipeline-parallel-size P, the model cut into P stages of layers the same way (this
// process the last stage, which computes the logits: their hash says whether they are the
// whole model's bits); with both, each stage a group of T ranks (T x P processes). This
// file is the
// command line, the model's loading and the ranks' processes; the measures are bench/'s.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "app/commands.hpp"
#include "app/loaded_model.hpp"
#include "app/speculative_options.hpp"
#include "bench/forward.hpp"
#include "bench/forward_profile.hpp"
#include "model/lora_adapter.hpp"
#include "model/pipeline_parallel.hpp"
#include "model/rendezvous_stores.hpp"
#include "troupe/engine.hpp"
#include "worker/backend_factory.hpp"

extern char** environ;

namespace troupe::app {

namespace {

struct Options {
  std::string model, output_json;
  EngineConfig engine;  // device settings
  bench::ForwardOptions run;
  std::int32_t tensor_parallel_size = 1;
  std::int32_t pipeline_parallel_size = 1;
  std::string layer_partition;    // --pp-layer-partition, as given
  std::int32_t stage = -1;        // a pipeline stage's process (not the last), spawned by it
  bool memory_bandwidth = false;  // also measure the machine's read bandwidth
  bool profile = false;           // also time each op of a prefill and of decode steps
  std::int32_t rank = 0;          // a rank's process, spawned by rank 0
  std::string rendezvous;         // its rendezvous directory
  std::vector<std::string> lora;  // LoRA adapters to time beside the base model
};

[[noreturn]] void fail(const Error& e) {
  std::fprintf(stderr, "troupe bench forward: %s\n", e.message.c_str());
  throw CLI::RuntimeError(1);
}

// This process's command line, to start the other ranks with.
std::vector<std::string> own_arguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  std::string arg;
  while (std::getline(in, arg, '\0')) args.push_back(arg);
  return args;
}

// Starts every rank of every stage but this process's (the last stage's rank 0) as
// processes of this binary, each told its rank, its stage and the rendezvous.
std::vector<pid_t> spawn_ranks(const Options& opts, const std::string& dir) {
  std::vector<pid_t> ranks;
  const auto base = own_arguments();
  const std::int32_t stages = std::max(1, opts.pipeline_parallel_size);
  const std::int32_t per_stage = std::max(1, opts.tensor_parallel_size);
  for (std::int32_t w = 0; w < stages * per_stage; ++w) {
    const std::int32_t stage = w / per_stage, r = w % per_stage;
    if (stage == stages - 1 && r == 0) continue;  // this process
    std::vector<std::string> args = base;
    args.insert(args.end(), {"--tp-rank", std::to_string(r), "--tp-rendezvous", dir});
    if (stages > 1) {
      // Every stage the partition this process chose (the default is computed here); the
      // last of a repeated flag wins (app/main.cpp's policy).
      args.insert(args.end(), {"--pp-stage", std::to_string(stage), "--pp-layer-partition",
                               opts.layer_partition});
    }
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
  if (opts.pipeline_parallel_size > 1) {
    spec.pipeline_size = opts.pipeline_parallel_size;
    spec.pipeline_stage = opts.stage >= 0 ? opts.stage : opts.pipeline_parallel_size - 1;
    if (!opts.layer_partition.empty()) {
      TROUPE_TRY(spec.layer_partition, model::parse_layer_partition(opts.layer_partition));
    }
  }
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
  cmd->add_option("--prompt-len", opts->run.prompt_len, "prefill length")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--gen-len", opts->run.gen_len, "decode steps per batch size")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--batch", opts->run.batches, "decode batch sizes")->delimiter(',');
  cmd->add_option("--repetitions", opts->run.repetitions, "prefill runs (the median is reported)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--block-size", opts->run.block_size, "KV block size")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--context,-d", opts->run.contexts,
                  "tokens already in the KV cache when the steps run, one run per value "
                  "(multiples of the block size); each sequence of the largest "
                  "--batch gets a history of its own, so keep --batch small at long contexts")
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--tensor-parallel-size,--tp", opts->tensor_parallel_size,
                  "split the model over this many CPU ranks (a process each), and compare with "
                  "the whole model on one process with as many threads in all")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--pipeline-parallel-size,--pp", opts->pipeline_parallel_size,
                  "cut the model into this many pipeline stages of layers (a CPU process each, "
                  "the hidden states passed on over Gloo), and compare with the whole model on "
                  "one process with as many threads in all")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--pp-layer-partition", opts->layer_partition,
                  "each stage's layer count, in order (\"6,6\"; default: balanced)");
  cmd->add_option("--tp-rank", opts->rank, "(internal) this process's rank")->group("");
  cmd->add_option("--pp-stage", opts->stage, "(internal) this process's stage")->group("");
  cmd->add_option("--tp-rendezvous", opts->rendezvous, "(internal) the ranks' directory")
      ->group("");
  cmd->add_flag("--memory-bandwidth", opts->memory_bandwidth,
                "also measure the machine's memory read bandwidth with as many threads, and the "
                "share of it batch-1 decode reaches");
  cmd->add_flag("--profile", opts->profile,
                "then time each op of one prefill and of 16 decode steps at each --batch (CPU): "
                "its share, and the int8 matmuls' rate against the processor's int8 peak and "
                "the weights' read rate against --memory-bandwidth's measure");
  cmd->add_option("--lora", opts->lora,
                  "LoRA adapter files (GGUF): also time each step with its sequences spread "
                  "over them, in turn with the base model's steps (the overhead as a ratio)");
  cmd->add_option("--output-json", opts->output_json, "also write the results here");
  cmd->callback([opts] {
    auto& run = opts->run;
    run.num_speculative_tokens = opts->engine.speculative.num_speculative_tokens;
    for (const std::int32_t context : run.contexts) {
      if (context % run.block_size != 0) {
        throw CLI::ValidationError("--context", std::to_string(context) +
                                                    " is not a multiple of the block size " +
                                                    std::to_string(run.block_size));
      }
    }
    const std::int32_t batch = *std::max_element(run.batches.begin(), run.batches.end());
    if (batch <= 0) throw CLI::ValidationError("--batch", "batch sizes must be positive");
    // Decode steps replay CUDA graphs up to the longest sequence the run makes.
    const std::int32_t max_model_len = *std::max_element(run.contexts.begin(), run.contexts.end()) +
                                       std::max(run.prompt_len, run.gen_len) + 1;
    const std::int32_t pp = opts->pipeline_parallel_size;
    if (pp == 1 && !opts->layer_partition.empty()) {
      fail(Error{ErrorCode::invalid_argument,
                 "--pp-layer-partition needs --pipeline-parallel-size > 1"});
    }
    // Ranks of stages: each a process.
    const std::int32_t tp = opts->tensor_parallel_size * pp;
    // Threads per rank: as given, or the cores shared among the ranks. The whole model
    // gets the threads of all the ranks.
    if (tp > 1 && opts->engine.num_threads <= 0) {
      const auto cores = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
      opts->engine.num_threads = std::max(1, cores / tp);
    }
    if (opts->rank > 0 || opts->stage >= 0) {  // another rank or stage: same steps, no output
      model::FileStore store(opts->rendezvous);
      auto loaded = open_rank(*opts, max_model_len, store);
      if (!loaded) fail(loaded.error());
      if (auto measured = bench::run_forward(*loaded, run); !measured) fail(measured.error());
      return;
    }
    if (tp > 1 && opts->engine.device != Device::cpu) {
      fail(Error{ErrorCode::unsupported,
                 "--tensor-parallel-size and --pipeline-parallel-size run on CPU processes only"});
    }
    if (tp > 1 && !opts->lora.empty()) {
      fail(Error{ErrorCode::unsupported,
                 "--lora runs on the whole model (no --tensor-parallel-size or "
                 "--pipeline-parallel-size)"});
    }
    Options whole = *opts;
    if (tp > 1) whole.engine.num_threads = opts->engine.num_threads * tp;
    auto loaded = open_model(whole.model, whole.engine, max_model_len);
    if (!loaded) fail(loaded.error());
    std::string stages;  // the pipeline's layers, checked before any process starts
    if (pp > 1) {
      std::vector<std::int32_t> partition;
      if (!opts->layer_partition.empty()) {
        auto parsed = model::parse_layer_partition(opts->layer_partition);
        if (!parsed) fail(parsed.error());
        partition = std::move(*parsed);
      } else {
        // The engine's default: balanced by the weights a decode step reads.
        partition = model::weight_balanced_partition(*loaded->file, loaded->config, pp);
        std::string text;
        for (const std::int32_t n : partition)
          text += (text.empty() ? "" : ",") + std::to_string(n);
        opts->layer_partition = text;
      }
      auto ranges = model::stage_layers(loaded->config.num_layers, pp, partition);
      if (!ranges) fail(ranges.error());
      stages = model::describe_stages(*ranges);
    }
    for (const auto& path : opts->lora) {
      auto adapter = model::LoraAdapter::open(path, *loaded->file, loaded->model->config());
      if (!adapter) fail(adapter.error());
      auto attached = loaded->model->attach_adapter(
          std::make_shared<const model::LoraAdapter>(std::move(*adapter)));
      if (!attached) fail(attached.error());
    }
    run.num_adapters = static_cast<std::int32_t>(opts->lora.size());
    whole.run.num_adapters = run.num_adapters;
    std::fprintf(stderr, "model %s: %s, %s\n", loaded->path.c_str(),
                 loaded->model->config().architecture.c_str(), loaded->backend->describe().c_str());
    if (tp > 1) std::printf("whole model, one process, %d threads\n", whole.engine.num_threads);
    const std::string backend_name = loaded->backend->describe();
    const std::string model_path = loaded->path;
    auto measured = bench::run_forward(*loaded, whole.run);
    if (!measured) fail(measured.error());
    const std::vector<bench::ForwardResult> one = std::move(*measured);
    for (const auto& m : one) bench::print(run, m, false);
    // Batch-1 decode reads every weight once a step: its bytes per second against the
    // machine's bandwidth say how close to the memory bound it runs.
    const std::uint64_t step_bytes = bench::weight_bytes_per_step(model_path);
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
      bandwidth = bench::read_bandwidth_gb_s(threads);
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
      bench::print_profile(*loaded, run.prompt_len, run.batches, run.block_size, threads, bandwidth,
                           run.num_adapters);
    }
    loaded = Result<model::LoadedModel>(model::LoadedModel{});  // its memory, before the ranks
    std::vector<bench::ForwardResult> split;
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
      if (pp > 1 && opts->tensor_parallel_size > 1) {
        std::printf(
            "%d pipeline stages (layers %s) of %d ranks, a process each, %d thread(s) "
            "per rank\n",
            pp, stages.c_str(), opts->tensor_parallel_size, opts->engine.num_threads);
      } else if (pp > 1) {
        std::printf("%d pipeline stages (layers %s), a process each, %d thread(s) per stage\n", pp,
                    stages.c_str(), opts->engine.num_threads);
      } else {
        std::printf("split over %d ranks, a process each, %d thread(s) per rank\n", tp,
                    opts->engine.num_threads);
      }
      // A failed measure ends the other ranks: none waits on a collective that never comes.
      const auto end_ranks = [&] {
        for (const pid_t p : ranks) ::kill(p, SIGKILL);
        for (const pid_t p : ranks) ::waitpid(p, nullptr, 0);
        std::filesystem::remove_all(dir);
      };
      Result<std::vector<bench::ForwardResult>> measured_split;
      try {
        measured_split = bench::run_forward(*rank0, run);
      } catch (...) {
        end_ranks();
        throw;
      }
      if (!measured_split) {
        end_ranks();
        fail(measured_split.error());
      }
      split = std::move(*measured_split);
      for (const auto& m : split) bench::print(run, m, opts->tensor_parallel_size > 1);
      for (const pid_t p : ranks) ::waitpid(p, nullptr, 0);
      std::filesystem::remove_all(dir);
      for (std::size_t c = 0; c < one.size(); ++c) {
        if (pp > 1 && opts->tensor_parallel_size == 1) {  // the whole model's bits
          std::printf("prefill logits at context %d: %s the whole model's\n", one[c].context,
                      split[c].prefill_logits_hash == one[c].prefill_logits_hash
                          ? "bit for bit"
                          : "DIFFERENT from");
        }
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
      bench::ForwardReport report;
      report.model_path = model_path;
      report.backend = backend_name;
      report.tensor_parallel_size = opts->tensor_parallel_size;
      report.pipeline_parallel_size = pp;
      report.layer_partition = stages;
      report.weight_bytes_per_step = step_bytes;
      report.memory_read_gb_per_second = bandwidth;
      report.whole = one;
      report.split = split;
      std::ofstream out(opts->output_json);
      out << bench::to_json(run, report);
      if (!out) fail(Error{ErrorCode::io, "cannot write " + opts->output_json});
    }
  });
}

}  // namespace troupe::app