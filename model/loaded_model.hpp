// The one model loader: a GGUF file opened and checked as a whole (its tokenizer,
// its Llama-family shape, their vocabularies agree, its chat template), and, given
// a backend, its weights on that backend. The engine opens a model without weights
// (it needs the tokenizer and the shape); a worker opens it with them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf_file.hpp"
#include "model/backend.hpp"
#include "model/llama_config.hpp"
#include "model/llama_model.hpp"
#include "text/tokenizer.hpp"

namespace troupe::model {

struct LoadedModel {
  std::string path;
  std::unique_ptr<gguf::GgufFile> file;  // the mapping the tokenizer and CPU weights view
  std::unique_ptr<text::Tokenizer> tokenizer;
  LlamaConfig config;
  std::string chat_template;         // tokenizer.chat_template, empty when none
  std::unique_ptr<Backend> backend;  // with the weights: the backend they live on
  std::unique_ptr<LlamaModel> model;
  KvCacheDtype kv_dtype = KvCacheDtype::f16;  // how its KV cache stores keys and values
  // A rank of a tensor-parallel group: the group its backend joined (null otherwise). The
  // worker shares rank 0's draft proposals over it.
  std::shared_ptr<Communicator> group;
  // A pipeline stage: the pipeline its model joined (null otherwise). The worker passes
  // stage 0's draft proposals to the last stage over it.
  std::shared_ptr<Communicator> pipe;

  LoadedModel() = default;
  LoadedModel(LoadedModel&&) noexcept = default;
  // The old model goes before the old backend it lives on (a member-wise move would
  // replace the backend first).
  LoadedModel& operator=(LoadedModel&& other) noexcept;

  // Opens and checks a model file; no weights are loaded.
  static Result<LoadedModel> open(const std::string& path);
  // Opens a model file and loads its weights on `backend`.
  static Result<LoadedModel> open(const std::string& path, std::unique_ptr<Backend> backend);
  // Loads the weights of a model opened without them on `backend`: `shard`'s part of them
  // for a rank of a tensor-parallel group (whose backend has joined the group).
  Result<void> load_weights(std::unique_ptr<Backend> backend, const Shard& shard = {},
                            const LoadProgress& progress = {});

  Result<void> allocate_kv_cache(std::int32_t num_blocks, std::int32_t block_size);
  // The KV cache of this rank's KV heads (all of them unless the model is split).
  KvCacheShape kv_cache_shape(std::int32_t num_blocks, std::int32_t block_size) const;
};

// Names a model file's contents cheaply (its size, shape, metadata and a sample of each
// tensor's bytes), so that a worker can check that its copy is the engine's.
std::string file_fingerprint(const gguf::GgufFile& file);

// Whether `config`'s weights in `file`, `world_size` ranks' share of them, fit in a host of
// `memory_bytes` (CPU weights are mapped, so a model larger than memory would be read from
// disk again at every step): an error that says how much, and of it how much is experts,
// before any weight is touched. `beside_bytes`: what another model's weights already take
// of that memory (a draft model is checked with its target's).
Result<void> check_weights_fit(const gguf::GgufFile& file, const LlamaConfig& config,
                               std::int32_t world_size, std::int64_t memory_bytes,
                               std::int64_t beside_bytes = 0);
// The bytes of a file's tensors: what its weights take once mapped.
std::int64_t tensor_bytes(const gguf::GgufFile& file);

// What a decode step reads of each layer's weights, and of the output norm and head: their
// bytes (a decode reads each weight once, so on a CPU its time goes by them), routed
// experts' by num_experts_used of num_experts. The token embedding is a lookup (nothing),
// unless it is also the head (tied embeddings).
struct StepWeightBytes {
  std::vector<double> layers;  // [num_layers]
  double head = 0.0;
};
StepWeightBytes step_weight_bytes(const gguf::GgufFile& file, const LlamaConfig& config);

// The default split of a model's layers into `num_stages` pipeline stages: balanced by
// step_weight_bytes, the head counting for the last stage (balance_layers). Empty where
// the model has fewer layers than stages.
std::vector<std::int32_t> weight_balanced_partition(const gguf::GgufFile& file,
                                                    const LlamaConfig& config,
                                                    std::int32_t num_stages);

// Whether a tensor holds routed experts: stacked (blk.N.ffn_gate_exps.weight) or one per
// expert, as older Mixtral files have them (blk.N.ffn_gate.E.weight).
bool is_expert_tensor(std::string_view name);

// "58.4 MiB", "47.3 GiB".
std::string format_bytes(std::int64_t bytes);

}  // namespace troupe::model
