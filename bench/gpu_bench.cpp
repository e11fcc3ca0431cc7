// troupe-gpu-bench: the CUDA backend on a Llama-3-8B-shaped model with random BF16
// weights made on the device (no download). It measures the device-to-device copy
// bandwidth (the ceiling), decode step times at several batch sizes with the bytes
// each step must read, prefill tokens/s, the paged-attention decode kernel's
// bandwidth, and offline throughput on the Anyscale-style workload through the
// engine's scheduler. It builds on the GPU machine with nothing but CUDA and the
// model core (TROUPE_GPU_ONLY), so it drives the engine's step loop (EngineCore)
// and a local worker step itself instead of the actors. The workload it ran is written out for
// bench/hf_static_baseline.py.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/workload.hpp"
#include "engine/engine_core.hpp"
#include "gpu/cuda_backend.hpp"
#include "model/llama_model.hpp"
#include "model/model_runner.hpp"
#include "worker/kv_sizing.hpp"
#include "worker/worker.hpp"

using namespace troupe;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::string shape = "llama3-8b";
  std::string dtype = "bf16";
  std::vector<std::int32_t> batches = {1, 8, 64, 256};
  std::int32_t context = 512;     // tokens each decoding sequence already holds
  std::int32_t prefill_seqs = 4;  // prefill: this many prompts of input_len in one step
  std::int32_t attention_batch = 64;
  std::int32_t attention_context = 4096;
  std::int32_t num_prompts = 256;  // offline throughput
  std::int32_t input_len = 512;
  std::int32_t output_len = 128;  // the mean of the capped exponential
  std::int32_t max_num_seqs = 256;
  std::int32_t max_num_batched_tokens = 8192;
  std::int32_t max_model_len = 2048;
  double gpu_memory_utilization = 0.9;
  std::uint64_t seed = 0;
  std::string json;      // results
  std::string workload;  // the offline workload, for the Hugging Face baseline
  bool skip_throughput = false;
};

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "troupe-gpu-bench: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T value_or_die(Result<T> r, const char* what) {
  if (!r) fail(std::string(what) + ": " + r.error().message);
  return std::move(*r);
}
void ok_or_die(Result<void> r, const char* what) {
  if (!r) fail(std::string(what) + ": " + r.error().message);
}

Options parse(int argc, char** argv) {
  Options o;
  auto ints = [](const std::string& s) {
    std::vector<std::int32_t> v;
    std::stringstream ss(s);
    for (std::string part; std::getline(ss, part, ',');) v.push_back(std::stoi(part));
    return v;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string key = argv[i];
    if (key == "--help" || key == "-h") {
      std::printf(
          "usage: troupe-gpu-bench [--shape llama3-8b|llama-110m] [--dtype bf16|f16]\n"
          "  [--batches 1,8,64,256] [--context N] [--num-prompts N] [--input-len N]\n"
          "  [--output-len N] [--max-num-seqs N] [--max-num-batched-tokens N]\n"
          "  [--gpu-memory-utilization F] [--seed N] [--json PATH] [--workload PATH]\n"
          "  [--skip-throughput]\n");
      std::exit(0);
    }
    if (key == "--skip-throughput") {
      o.skip_throughput = true;
      continue;
    }
    if (i + 1 >= argc) fail("option " + key + " needs a value");
    const std::string v = argv[++i];
    try {
      if (key == "--shape")
        o.shape = v;
      else if (key == "--dtype")
        o.dtype = v;
      else if (key == "--batches")
        o.batches = ints(v);
      else if (key == "--context")
        o.context = std::stoi(v);
      else if (key == "--num-prompts")
        o.num_prompts = std::stoi(v);
      else if (key == "--input-len")
        o.input_len = std::stoi(v);
      else if (key == "--output-len")
        o.output_len = std::stoi(v);
      else if (key == "--max-num-seqs")
        o.max_num_seqs = std::stoi(v);
      else if (key == "--max-num-batched-tokens")
        o.max_num_batched_tokens = std::stoi(v);
      else if (key == "--gpu-memory-utilization")
        o.gpu_memory_utilization = std::stod(v);
      else if (key == "--seed")
        o.seed = std::stoull(v);
      else if (key == "--json")
        o.json = v;
      else if (key == "--workload")
        o.workload = v;
      else
        fail("unknown option " + key);
    } catch (const std::logic_error&) {
      fail("option " + key + " needs a number, not '" + v + "'");
    }
  }
  if (o.dtype != "bf16" && o.dtype != "f16") fail("--dtype must be bf16 or f16");
  return o;
}

model::LlamaConfig model_shape(const std::string& name) {
  model::LlamaConfig c;
  c.architecture = "llama";
  if (name == "llama3-8b") {
    c.vocab_size = 128256;
    c.dim = 4096;
    c.num_layers = 32;
    c.num_heads = 32;
    c.num_kv_heads = 8;
    c.ffn_dim = 14336;
    c.context_length = 8192;
    c.rope_freq_base = 500000.0f;
  } else if (name == "llama-110m") {
    c.vocab_size = 32000;
    c.dim = 768;
    c.num_layers = 12;
    c.num_heads = 12;
    c.num_kv_heads = 4;
    c.ffn_dim = 2048;
    c.context_length = 2048;
  } else {
    fail("unknown shape '" + name + "' (llama3-8b, llama-110m)");
  }
  c.head_dim = c.dim / c.num_heads;
  c.rope_dims = c.head_dim;
  return c;
}

// Weights with the variance of a trained model's (1/cols): activations stay in range.
model::WeightSource random_weights(gpu::CudaBackend& gpu, std::uint64_t seed) {
  auto next = std::make_shared<std::uint64_t>(seed * 1000 + 1);
  model::WeightSource s;
  s.matrix = [&gpu, next](const std::string&, std::int64_t rows, std::int64_t cols) {
    return gpu.random_weight(rows, cols, (*next)++, std::sqrt(3.0f / static_cast<float>(cols)));
  };
  s.vector = [&gpu, next](const std::string&, std::int64_t size) {
    return gpu.random_vector(size, (*next)++, 0.1f, 1.0f);
  };
  s.has = [](const std::string& name) { return name == "output.weight"; };
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Bytes read plus bytes written per second by a large device-to-device copy.
double copy_bandwidth() {
  const std::size_t bytes = std::size_t{2} << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
    fail("no memory for the copy-bandwidth buffers");
  }
  cudaMemset(a, 1, bytes);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<double> seconds;
  for (int i = 0; i < 13; ++i) {
    cudaEventRecord(start);
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (i >= 3) seconds.push_back(ms / 1000.0);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * static_cast<double>(bytes) / median(seconds);
}

// `batch` sequences of `context` tokens each, sequence s in blocks s * blocks_each on, with
// their last `new_tokens` tokens (random ids) in the step; each sequence's last row wants
// logits unless `logits` is false. Decode steps have new_tokens 1, prefill steps `context`.
model::StepInput make_step(std::int32_t batch, std::int32_t context, std::int32_t new_tokens,
                           std::int32_t block_size, std::int32_t vocab, bool logits = true) {
  model::StepInput step;
  const std::int32_t blocks = (context + block_size - 1) / block_size;
  step.max_blocks_per_seq = blocks;
  std::mt19937 rng(static_cast<std::uint32_t>(batch * 7919 + new_tokens));
  std::vector<std::int32_t> table(blocks);
  std::vector<TokenId> tokens(new_tokens);
  for (std::int32_t s = 0; s < batch; ++s) {
    for (std::int32_t b = 0; b < blocks; ++b) table[b] = s * blocks + b;
    for (auto& t : tokens) t = static_cast<TokenId>(rng() % static_cast<std::uint32_t>(vocab));
    model::append_sequence(step, tokens, context - new_tokens, table, logits);
  }
  return step;
}

struct DecodeResult {
  std::int32_t batch = 0;
  double step_ms = 0.0;
  double bytes = 0.0;
  double fraction = 0.0;  // of the copy bandwidth
  double tokens_per_s = 0.0;
};

struct ThroughputResult {
  std::int32_t requests = 0;
  std::int64_t input_tokens = 0, output_tokens = 0;
  double seconds = 0.0;
  std::int64_t steps = 0;
  double output_per_s = 0.0, total_per_s = 0.0;
};

// The Anyscale-style workload (bench/workload): fixed-length random prompts,
// capped-exponential outputs; `troupe bench throughput --dataset-name anyscale` with the same
// seed, lengths and vocabulary size runs the same requests.
std::vector<bench::BenchRequest> anyscale_workload(const Options& o, std::int32_t vocab) {
  bench::WorkloadOptions w;
  w.dataset = bench::Dataset::anyscale;
  w.num_prompts = o.num_prompts;
  w.input_len = o.input_len;
  w.output_len = o.output_len;
  w.vocab_size = vocab;
  w.seed = o.seed;
  return value_or_die(bench::make_workload(w), "the workload");
}

ThroughputResult offline_throughput(const Options& o, model::LlamaModel& llama,
                                    std::int32_t num_blocks, std::int32_t block_size) {
  const auto requests = anyscale_workload(o, llama.config().vocab_size);
  engine::SchedulerConfig sc;
  sc.max_num_batched_tokens = o.max_num_batched_tokens;
  sc.max_num_seqs = o.max_num_seqs;
  sc.max_model_len = o.max_model_len;
  sc.num_blocks = num_blocks;
  sc.block_size = block_size;
  sc.enable_prefix_caching = false;  // random prompts share nothing
  engine::EngineCore core(sc, {});
  model::ModelRunner runner(llama, {});
  ThroughputResult r;
  r.requests = static_cast<std::int32_t>(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.seed = o.seed * 1000003 + i;
    p.max_tokens = requests[i].output_len;
    p.ignore_eos = true;
    ok_or_die(core.add({i, requests[i].prompt, p, 0, {}}), "adding a request");
    r.input_tokens += static_cast<std::int64_t>(requests[i].prompt.size());
  }
  const auto start = Clock::now();
  while (core.has_work()) {
    auto work = core.next_step();
    if (!work) fail("a throughput step: no step could be planned");
    const auto output = worker::run_step(runner, *work);
    if (output.failed) fail("a throughput step: " + output.error.message);
    r.output_tokens += static_cast<std::int64_t>(core.apply(output).updates.size());
    ++r.steps;
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  r.output_per_s = static_cast<double>(r.output_tokens) / r.seconds;
  r.total_per_s = static_cast<double>(r.input_tokens + r.output_tokens) / r.seconds;
  if (!o.workload.empty()) {
    std::ofstream out(o.workload);
    out << "{\"input_len\": " << o.input_len << ", \"seed\": " << o.seed << ", \"output_lens\": [";
    for (std::size_t i = 0; i < requests.size(); ++i) {
      out << (i ? ", " : "") << requests[i].output_len;
    }
    out << "]}\n";
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const auto device = value_or_die(gpu::probe_device(0), "GPU");
  std::printf("device: %s (compute %d.%d, %d SMs, %.1f GiB, %.1f GiB free)\n", device.name.c_str(),
              device.compute_major, device.compute_minor, device.multiprocessors,
              device.total_bytes / double(1 << 30), device.free_bytes / double(1 << 30));
  const double copy_bw = copy_bandwidth();
  std::printf("device-to-device copy: %.0f GB/s (bytes read + written)\n", copy_bw / 1e9);

  const model::LlamaConfig shape = model_shape(o.shape);
  gpu::CudaBackendOptions options;
  options.weight_dtype = o.dtype == "f16" ? gpu::WeightDtype::f16 : gpu::WeightDtype::bf16;
  options.max_model_len = std::max(o.max_model_len, o.context);
  options.max_graph_batch = std::max(256, o.max_num_seqs);
  auto backend = value_or_die(gpu::CudaBackend::create(options), "CUDA backend");
  auto built = Clock::now();
  auto llama =
      value_or_die(model::LlamaModel::assemble(shape, *backend, random_weights(*backend, o.seed)),
                   "random model");
  const double weight_gb = backend->weight_bytes() / 1e9;
  std::printf("model: %s, random %s weights made on the device: %.2f GB in %.1f s\n",
              o.shape.c_str(), o.dtype.c_str(), weight_gb,
              std::chrono::duration<double>(Clock::now() - built).count());

  const std::int32_t block_size = 16;
  const std::int32_t largest_batch = *std::max_element(o.batches.begin(), o.batches.end());
  const std::int64_t max_rows = std::max({o.max_num_batched_tokens, o.prefill_seqs * o.input_len,
                                          largest_batch, o.attention_batch, 256});
  ok_or_die(llama.prepare(max_rows, std::max({o.max_num_seqs, largest_batch, 256})),
            "activation buffers");
  model::KvCacheShape kv{shape.num_layers, 0, block_size, shape.num_kv_heads, shape.head_dim};
  const std::int64_t free_bytes = value_or_die(backend->free_memory_bytes(), "free GPU memory");
  kv.num_blocks = static_cast<std::int32_t>(worker::kv_blocks_for_memory(
      free_bytes, o.gpu_memory_utilization, backend->kv_block_bytes(kv), 1 << 30));
  if (kv.num_blocks <= 0) fail("KV: no GPU memory is left for the KV cache after the weights");
  ok_or_die(backend->allocate_kv_cache(kv), "KV cache");
  ok_or_die(backend->randomize_kv_cache(o.seed + 7), "KV contents");
  std::printf("KV cache: %d blocks of %d tokens (%.1f GB)\n", kv.num_blocks, block_size,
              2.0 * kv.num_blocks * block_size * shape.num_layers * shape.num_kv_heads *
                  shape.head_dim * 2 / 1e9);

  // --- decode steps (graph replays after one eager step and one recording) ---
  const std::int64_t kv_dim = std::int64_t{shape.num_kv_heads} * shape.head_dim;
  const double embedding_bytes = 2.0 * shape.vocab_size * shape.dim;  // only B rows are read
  std::vector<DecodeResult> decodes;
  for (const std::int32_t batch : o.batches) {
    const std::int32_t blocks_each = (o.context + block_size - 1) / block_size;
    if (std::int64_t{batch} * blocks_each > kv.num_blocks) {
      std::printf("decode batch %d skipped: the KV cache holds too few blocks\n", batch);
      continue;
    }
    const auto step = make_step(batch, o.context, 1, block_size, shape.vocab_size);
    std::vector<model::DeviceSamplingRow> rows(static_cast<std::size_t>(batch));
    for (auto& r : rows) r.temperature = 0.0f;
    std::vector<TokenId> ids;
    std::vector<double> seconds;
    for (int i = 0; i < 23; ++i) {
      const auto t0 = Clock::now();
      ok_or_die(llama.forward_sample(step, rows, ids), "decode step");
      if (i >= 3) seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    DecodeResult d;
    d.batch = batch;
    d.step_ms = median(seconds) * 1e3;
    d.bytes = static_cast<double>(backend->weight_bytes()) - embedding_bytes +
              2.0 * 2.0 * batch * o.context * shape.num_layers * kv_dim;
    d.fraction = d.bytes / (d.step_ms / 1e3) / copy_bw;
    d.tokens_per_s = batch / (d.step_ms / 1e3);
    decodes.push_back(d);
    std::printf(
        "decode batch %3d: %8.3f ms/step  %6.2f GB read  %5.1f%% of copy bandwidth  "
        "%9.0f tok/s\n",
        batch, d.step_ms, d.bytes / 1e9, 100.0 * d.fraction, d.tokens_per_s);
  }
  std::printf("graphs recorded: %zu, replays: %lld\n", backend->num_graphs(),
              static_cast<long long>(backend->num_replays()));

  // --- prefill: prefill_seqs prompts of input_len in one step, with each attention kernel ---
  double prefill_tokens_per_s = 0.0, prefill_fma_tokens_per_s = 0.0;
  {
    const auto step =
        make_step(o.prefill_seqs, o.input_len, o.input_len, block_size, shape.vocab_size);
    std::vector<float> logits;
    auto rate = [&](bool tensor_cores) {
      backend->set_prefill_tensor_cores(tensor_cores);
      std::vector<double> seconds;
      for (int i = 0; i < 8; ++i) {
        const auto t0 = Clock::now();
        ok_or_die(llama.forward(step, logits), "prefill step");
        if (i >= 2) seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
      return step.num_tokens() / median(seconds);
    };
    prefill_fma_tokens_per_s = rate(false);
    prefill_tokens_per_s = rate(true);
    std::printf(
        "prefill %d x %d tokens: %.0f tok/s (attention on tensor cores), %.0f tok/s "
        "(float FMAs): %.2fx\n",
        o.prefill_seqs, o.input_len, prefill_tokens_per_s, prefill_fma_tokens_per_s,
        prefill_tokens_per_s / prefill_fma_tokens_per_s);
  }

  // --- the paged-attention decode kernel alone ---
  double attention_bandwidth = 0.0;
  {
    const std::int32_t batch = o.attention_batch, context = o.attention_context;
    const std::int32_t blocks_each = (context + block_size - 1) / block_size;
    if (std::int64_t{batch} * blocks_each <= kv.num_blocks) {
      // No logits wanted: not a graph step, so the op runs when called.
      const auto step = make_step(batch, context, 1, block_size, shape.vocab_size, false);
      auto q = value_or_die(
          backend->allocate(batch, std::int64_t{shape.num_heads} * shape.head_dim), "q");
      auto out = value_or_die(
          backend->allocate(batch, std::int64_t{shape.num_heads} * shape.head_dim), "out");
      ok_or_die(
          backend->write(q, std::vector<float>(static_cast<std::size_t>(q.rows * q.cols), 0.1f)),
          "q values");
      if (auto begun = backend->begin_step(step); !begun) {
        fail("attention step: " + begun.error().message);
      }
      const model::AttentionParams params{shape.num_heads, shape.num_kv_heads, shape.head_dim,
                                          1.0f / std::sqrt(static_cast<float>(shape.head_dim))};
      auto stream = static_cast<cudaStream_t>(backend->stream());
      cudaEvent_t start, stop;
      cudaEventCreate(&start);
      cudaEventCreate(&stop);
      std::vector<double> seconds;
      for (int i = 0; i < 23; ++i) {
        cudaEventRecord(start, stream);
        backend->attention(i % shape.num_layers, q, params, out);
        cudaEventRecord(stop, stream);
        cudaEventSynchronize(stop);
        float ms = 0;
        cudaEventElapsedTime(&ms, start, stop);
        if (i >= 3) seconds.push_back(ms / 1e3);
      }
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
      ok_or_die(backend->end_step(), "attention step");
      const double bytes = 2.0 * 2.0 * batch * context * kv_dim;
      attention_bandwidth = bytes / median(seconds);
      std::printf("paged attention decode, %d x %d keys: %.3f ms, %.0f GB/s (%.1f%% of copy)\n",
                  batch, context, median(seconds) * 1e3, attention_bandwidth / 1e9,
                  100.0 * attention_bandwidth / copy_bw);
      backend->release(q);
      backend->release(out);
    }
  }

  // --- offline throughput through the scheduler ---
  ThroughputResult tp;
  if (!o.skip_throughput) {
    tp = offline_throughput(o, llama, kv.num_blocks, block_size);
    std::printf(
        "offline throughput, %d requests (%d-token prompts, outputs mean %d): "
        "%.1f s, %.0f output tok/s, %.0f total tok/s, %lld steps\n",
        tp.requests, o.input_len, o.output_len, tp.seconds, tp.output_per_s, tp.total_per_s,
        static_cast<long long>(tp.steps));
  }

  if (!o.json.empty()) {
    std::ofstream j(o.json);
    j << "{\n  \"device\": \"" << device.name << "\",\n  \"shape\": \"" << o.shape
      << "\",\n  \"dtype\": \"" << o.dtype << "\",\n  \"copy_bandwidth_gbs\": " << copy_bw / 1e9
      << ",\n  \"weight_gb\": " << weight_gb << ",\n  \"decode\": [";
    for (std::size_t i = 0; i < decodes.size(); ++i) {
      const auto& d = decodes[i];
      j << (i ? ", " : "") << "{\"batch\": " << d.batch << ", \"step_ms\": " << d.step_ms
        << ", \"gb_read\": " << d.bytes / 1e9 << ", \"copy_fraction\": " << d.fraction
        << ", \"tokens_per_s\": " << d.tokens_per_s << "}";
    }
    j << "],\n  \"prefill_tokens_per_s\": " << prefill_tokens_per_s
      << ",\n  \"prefill_fma_tokens_per_s\": " << prefill_fma_tokens_per_s
      << ",\n  \"attention_decode_gbs\": " << attention_bandwidth / 1e9
      << ",\n  \"throughput\": {\"requests\": " << tp.requests
      << ", \"input_tokens\": " << tp.input_tokens << ", \"output_tokens\": " << tp.output_tokens
      << ", \"seconds\": " << tp.seconds << ", \"output_tokens_per_s\": " << tp.output_per_s
      << ", \"total_tokens_per_s\": " << tp.total_per_s << "}\n}\n";
  }
  return 0;
}
