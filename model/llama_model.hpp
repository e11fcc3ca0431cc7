// The Llama-family forward pass, written once over the Backend ops: one call
// runs one step (a flat batch of many sequences' tokens) and returns logits for
// the rows the step asked for. llama_model.cpp loads the weights; llama_forward.cpp runs
// the steps.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "model/backend.hpp"
#include "model/llama_config.hpp"
#include "model/lora_adapter.hpp"
#include "model/tensor_parallel.hpp"

namespace troupe::model {

// One layer's weights. A fused tensor (phi3's attn_qkv, its gate+up ffn_up) is loaded as
// its row ranges, so that the recipe sees separate Q, K, V, gate and up either way.
struct LayerWeights {
  Weight attn_norm, wq, wk, wv, wo;
  Weight bq, bk, bv;      // ArchFeatures::qkv_bias
  Weight q_norm, k_norm;  // ArchFeatures::qk_norm: [head_dim]
  Weight bo;              // ArchFeatures::attn_output_bias: [dim]
  Weight sinks;           // ArchFeatures::attention_sinks: [this rank's heads]
  Weight post_attn_norm;  // ArchFeatures::post_norms
  Weight ffn_norm, w_gate, w_up, w_down;
  Weight post_ffn_norm;  // ArchFeatures::post_norms
  MoeLayer moe;          // ArchFeatures::num_experts > 0 (then no w_gate, w_up, w_down)
};

// Where a model's weights come from: a GGUF file, or a backend's own generator
// (the GPU benchmark makes an 8B-shaped model on the device, with no file).
struct WeightSource {
  // A matrix [rows, cols] (cols contiguous), as in ggml.
  std::function<Result<Weight>(const std::string& name, std::int64_t rows, std::int64_t cols)>
      matrix;
  // An F32 vector of `size` values.
  std::function<Result<Weight>(const std::string& name, std::int64_t size)> vector;
  // Whether an optional tensor (output.weight, rope_freqs.weight) is there.
  std::function<bool(const std::string& name)> has;
  // A rank's part of a matrix [rows, cols], for tensor parallelism and fused tensors; may
  // be empty where the source cannot be split.
  std::function<Result<Weight>(const std::string& name, std::int64_t rows, std::int64_t cols,
                               const WeightSlice& slice)>
      matrix_slice;
  // Values [begin, begin + count) of an F32 vector of `size` (a rank's part of a bias);
  // may be empty where the source cannot be split.
  std::function<Result<Weight>(const std::string& name, std::int64_t size, std::int64_t begin,
                               std::int64_t count)>
      vector_slice;
  // Expert `expert` of a stacked expert tensor, [cols, rows, num_experts] in ggml's order
  // (the expert last), as its matrix [rows, cols]: whole (`slice` null) or a rank's part.
  // May be empty where the source has no experts.
  std::function<Result<Weight>(const std::string& name, std::int32_t expert,
                               std::int32_t num_experts, std::int64_t rows, std::int64_t cols,
                               const WeightSlice* slice)>
      expert;
};

// Told after each layer's weights are loaded (layers done, layers in all): a large file
// takes a while, and whoever waits may say how far it is.
using LoadProgress = std::function<void(std::int32_t layers_done, std::int32_t num_layers)>;

class LlamaModel {
 public:
  // Loads every weight (of `shard`'s part) into `backend`, checking each one's shape and
  // type. A split model's backend must have joined its group (Backend::join_group). A
  // pipeline stage (shard.stage) loads only its layers, the first the token embedding, the
  // last the output norm and head.
  static Result<LlamaModel> load(const gguf::GgufFile& file, Backend& backend,
                                 const Shard& shard = {}, const LoadProgress& progress = {});
  // Builds the model from `config` with weights from `source`.
  static Result<LlamaModel> assemble(const LlamaConfig& config, Backend& backend,
                                     const WeightSource& source, const Shard& shard = {},
                                     const LoadProgress& progress = {});

  // The whole model's shape (what callers see: vocabulary, context, layers).
  const LlamaConfig& config() const { return config_; }
  // The shape this rank computes with: its heads, KV heads and FFN slice.
  const LlamaConfig& local_config() const { return local_; }
  const Shard& shard() const { return shard_; }
  // The layers this worker holds and runs: all of them, or its pipeline stage's.
  std::int32_t num_stage_layers() const { return static_cast<std::int32_t>(layers_.size()); }
  // A pipeline stage's link to the others (rank i of it is stage i): hidden states come
  // from the stage before and go to the one after. A staged model runs no step without it.
  Result<void> join_pipeline(std::shared_ptr<Communicator> pipe);
  // A later pipeline stage's hops since the last call, in seconds, each the time from the
  // stage before starting to send a step's hidden states (or, when it sent first, from
  // this stage posting its receive) to this stage holding them whole, read on the wall
  // clock of both (one host: exact; across hosts: as close as their clocks agree; a
  // negative difference counts as 0). Empty on the first stage and an unstaged model; the
  // latest 64 where no one takes them.
  std::vector<double> take_hop_seconds() { return std::exchange(hop_seconds_, {}); }
  Backend& backend() const { return *backend_; }
  // Bytes of the weights this rank holds, as stored (a tied output counted once).
  std::int64_t weight_bytes() const;

  // Sizes the activation buffers for steps of up to `max_tokens` tokens and `max_logits`
  // logit rows now, and a split model's collectives, so that a GPU can size its KV pool
  // from what is left. Every rank of a group calls it.
  Result<void> prepare(std::int64_t max_tokens, std::int64_t max_logits);

  // Runs one step; `logits` receives [step.logit_rows.size(), vocab_size] floats (on a rank
  // other than 0 of a split model, which computes none, nothing).
  Result<void> forward(const StepInput& step, std::vector<float>& logits);
  // Runs one step and samples on the device (Backend::can_sample): one id per logit row,
  // `rows[i]` for row i; the logits stay on the device. `before_sample` runs once the
  // forward pass is queued and before the draw (the rows' grammar masks are finished then).
  Result<void> forward_sample(const StepInput& step, std::span<const DeviceSamplingRow> rows,
                              std::vector<TokenId>& ids,
                              const std::function<void()>& before_sample = {});

  // Puts a LoRA adapter read for this model (LoraAdapter::open) in the next slot, 1 for the
  // first: a step's sequence runs with it where StepInput::adapters names that slot. On a
  // model split over ranks, the rank keeps its part of each matrix (LoraAdapter::cut).
  // Its matrices go where the backend's lora_add reads them (Backend::upload_lora). Refused
  // on a backend without lora_add and for an adapter of another shape.
  Result<std::int32_t> attach_adapter(std::shared_ptr<const LoraAdapter> adapter);
  // Puts `adapter` in slot `slot` (1 or more), checked as attach_adapter checks it,
  // replacing the slot's adapter (run-time loading, `serve --enable-runtime-lora-updating`);
  // null empties the slot, whose weights go once no step holds them. A step naming an
  // empty slot is refused. On an error the slot is as it was.
  Result<void> set_adapter(std::int32_t slot, std::shared_ptr<const LoraAdapter> adapter);
  // Slots there are room for (the highest one filled or emptied so far).
  std::int32_t num_adapters() const { return static_cast<std::int32_t>(adapters_.size()); }

  LlamaModel(LlamaModel&&) noexcept;
  LlamaModel& operator=(LlamaModel&&) noexcept;
  ~LlamaModel();

 private:
  LlamaModel(const LlamaConfig& config, Backend& backend)
      : config_(config), local_(config), backend_(&backend) {}
  Result<void> reserve(std::int64_t num_tokens, std::int64_t num_logits);
  // The step's ops; the logits in the backend's memory ([num_logits, vocab], rows the
  // step asked for first), or an empty tensor when it asked for none.
  Result<Tensor> run(const StepInput& step);
  // The layer's attention block: x's normalized input in h -> its output in h (before the
  // residual add). `layer` counts this stage's layers (its KV cache's); the model's own
  // number is shard_.stage.layer_begin + layer.
  void attention_block(std::int32_t layer, Tensor h, Tensor q, Tensor k, Tensor v, Tensor attn);
  // The layer's feed-forward block: h -> its output (h, or ws_.moe_out for a mixture of
  // experts), before the residual add.
  Tensor ffn_block(std::int32_t layer, Tensor h, Tensor gate, Tensor up);
  // A pipeline stage's hidden states [rows, dim]: from the stage before into pipe_buffer_
  // (before the step begins), and x's on to the stage after (once it ended).
  Result<void> receive_hidden(std::int64_t rows);
  Result<void> send_hidden(Tensor x);
  // A layer's routed experts, from `source`: stacked tensors (blk.N.ffn_gate_exps ...),
  // or older files' one tensor per expert (blk.N.ffn_gate.E ...).
  static Result<MoeLayer> load_experts(const LlamaConfig& config, const WeightSource& source,
                                       std::int32_t layer, std::int64_t ffn_begin,
                                       std::int64_t ffn_count, const Shard& shard);
  void release_workspace();
  // llama_lora.cpp: the step's rows grouped by adapter slot (lora_rows_), checked against
  // the slots attached; then y += each group's update of `layer`'s `target` matrix.
  Result<void> group_adapter_rows(const StepInput& step);
  void lora(std::int32_t layer, LoraTarget target, Tensor x, Tensor y);

  struct Workspace {
    std::int64_t capacity = 0;        // tokens
    std::int64_t logit_capacity = 0;  // rows
    Tensor x, h, q, k, v, attn, gate, up, moe_out, logit_x, logits_part, logits;
  };

  LlamaConfig config_;
  LlamaConfig local_;
  Shard shard_;
  Backend* backend_;
  Weight token_embedding_, output_norm_, output_;
  Weight rope_freqs_;
  bool has_rope_freqs_ = false;
  bool vocab_split_ = false;  // each rank holds a slice of the LM head's vocabulary
  std::vector<LayerWeights> layers_;
  // Column slices of a split model's weights, copied out of the mapping (their rows are
  // not contiguous there); the backend's weights may point into them.
  std::vector<std::unique_ptr<std::byte[]>> owned_weights_;
  Workspace ws_;
  std::shared_ptr<Communicator> pipe_;  // a pipeline stage's link to the others
  // The hidden states passed on, in host memory, and after them the sender's clock at its
  // send (kStampFloats floats holding an int64 of nanoseconds since the epoch).
  std::vector<float> pipe_buffer_;
  std::vector<double> hop_seconds_;  // take_hop_seconds()
  // An adapter made fit for this model: its rank's part of each matrix, checked against
  // the loaded weights.
  Result<std::shared_ptr<const LoraAdapter>> fit_adapter(
      std::shared_ptr<const LoraAdapter> adapter) const;
  // Its matrices where the backend's lora_add reads them (Backend::upload_lora), by
  // [layer * kNumLoraTargets + target]; and their release.
  Result<std::vector<LoraWeights>> upload_adapter(const LoraAdapter& adapter);
  void release_adapter_weights(std::vector<LoraWeights>& weights);

  // LoRA: slot s's adapter at s - 1 (null: an empty slot); the running step's rows of each slot
  // (empty lists where none; no lists when the step runs the base model alone); a layer's groups,
  // reused.
  std::vector<std::shared_ptr<const LoraAdapter>> adapters_;
  // Slot s's matrices as the backend keeps them, at s - 1, then [layer * kNumLoraTargets +
  // target] (null weights where the adapter leaves a matrix alone).
  std::vector<std::vector<LoraWeights>> lora_weights_;
  std::vector<std::vector<std::int32_t>> lora_rows_;
  bool lora_step_ = false;
  std::vector<LoraGroup> lora_groups_;
};

}  // namespace troupe::model
