// `troupe bench forward`'s measurements: prefill and decode throughput of the forward pass
// alone (no sampling, no scheduling), at several batch sizes and depths of context
// (llama-bench's -d: the steps run after that many tokens are in the KV cache), on a model
// already loaded; the weights a decode step reads and the machine's memory read bandwidth,
// to say how close decode runs to the memory bound. Every rank of a tensor-parallel group
// (or stage of a pipeline) runs the same steps (the tokens come from the same seed). The command
// (app/bench_forward_command.cpp) loads the model, starts the ranks and prints.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/loaded_model.hpp"
#include "troupe/result.hpp"

namespace troupe::bench {

struct ForwardOptions {
  std::int32_t prompt_len = 512, gen_len = 128, block_size = 16, repetitions = 3;
  std::vector<std::int32_t> batches = {1, 8, 32, 64};
  std::vector<std::int32_t> contexts = {0};  // tokens already in the cache
  // --speculative-config's k: also time verification steps of 1 + k tokens per sequence,
  // each scored (0: none).
  std::int32_t num_speculative_tokens = 0;
  // LoRA adapters attached to the model (LlamaModel::attach_adapter; 0: none): each prefill
  // and decode step is also timed with its sequences spread over them (sequence s under
  // adapter 1 + s % num_adapters), the two kinds of step taking turns, so that the overhead
  // is a ratio measured in one run.
  std::int32_t num_adapters = 0;
};

// One context's measures.
struct ForwardResult {
  std::int32_t context = 0;
  double prefill_tokens_per_second = 0.0;
  double prefill_all_reduce_share = 0.0;
  double prefill_lora_tokens_per_second = 0.0;  // under adapter 1 (num_adapters > 0)
  // A hash of the prefill's logits (FNV-1a of their bytes), to tell that a split model
  // computes the whole one's bits; 0 where this process computes none (a pipeline's stage
  // but the last, a tensor-parallel rank but 0).
  std::uint64_t prefill_logits_hash = 0;
  struct Decode {
    std::int32_t batch = 0;
    double tokens_per_second = 0.0;
    double ms_per_step = 0.0;
    double all_reduce_share = 0.0;  // of the step's time, on rank 0
    // --speculative-config's k: a verification step, each sequence 1 + k tokens with
    // logits at each (what a step whose every sequence carries a full draft costs).
    double verify_ms_per_step = 0.0;
    double lora_ms_per_step = 0.0;  // the sequences spread over the adapters (num_adapters > 0)
  };
  std::vector<Decode> decode;
};

// The prefill and decode steps on `loaded`, after each of options.contexts' tokens of history.
Result<std::vector<ForwardResult>> run_forward(model::LoadedModel& loaded,
                                               const ForwardOptions& options);

// One context's lines on stdout; `split`: with each step's all-reduce share.
void print(const ForwardOptions& options, const ForwardResult& result, bool split);

// The bytes of weights a batch-1 decode step reads, from the GGUF file at `path` (0 when it
// cannot be read).
std::uint64_t weight_bytes_per_step(const std::string& path);

// The machine's memory read bandwidth with `threads` threads, in GB/s.
double read_bandwidth_gb_s(int threads);

// What the JSON output holds.
struct ForwardReport {
  std::string model_path, backend;
  std::int32_t tensor_parallel_size = 1;
  std::int32_t pipeline_parallel_size = 1;
  std::string layer_partition;  // the pipeline's stages' layers ("[0, 6) [6, 12)")
  std::uint64_t weight_bytes_per_step = 0;
  double memory_read_gb_per_second = 0.0;  // 0: not measured
  std::vector<ForwardResult> whole;        // the whole model on one process
  std::vector<ForwardResult> split;        // over the ranks or stages (either size > 1)
};

// The report as one JSON object, with a final newline.
std::string to_json(const ForwardOptions& options, const ForwardReport& report);

}  // namespace troupe::bench
