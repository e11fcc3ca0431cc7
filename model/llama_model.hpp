// The Llama-family forward pass, written once over the Backend ops: one call
// runs one step (a flat batch of many sequences' tokens) and returns logits for
// the rows the step asked for.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "model/backend.hpp"
#include "model/llama_config.hpp"

namespace troupe::model {

struct LayerWeights {
  Weight attn_norm, wq, wk, wv, wo;
  Weight ffn_norm, w_gate, w_up, w_down;
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
};

class LlamaModel {
 public:
  // Loads every weight into `backend`, checking each one's shape and type.
  static Result<LlamaModel> load(const gguf::GgufFile& file, Backend& backend);
  // Builds the model from `config` with weights from `source`.
  static Result<LlamaModel> assemble(const LlamaConfig& config, Backend& backend,
                                     const WeightSource& source);

  const LlamaConfig& config() const { return config_; }
  Backend& backend() const { return *backend_; }

  // Sizes the activation buffers for steps of up to `max_tokens` tokens and `max_logits`
  // logit rows now, so that a GPU can size its KV pool from what is left.
  Result<void> prepare(std::int64_t max_tokens, std::int64_t max_logits) {
    return reserve(max_tokens, max_logits);
  }

  // Runs one step; `logits` receives [step.logit_rows.size(), vocab_size] floats.
  Result<void> forward(const StepInput& step, std::vector<float>& logits);
  // Runs one step and samples on the device (Backend::can_sample): one id per logit row,
  // `rows[i]` for row i; the logits stay on the device.
  Result<void> forward_sample(const StepInput& step, std::span<const DeviceSamplingRow> rows,
                              std::vector<TokenId>& ids);

  LlamaModel(LlamaModel&&) noexcept;
  LlamaModel& operator=(LlamaModel&&) noexcept;
  ~LlamaModel();

 private:
  LlamaModel(const LlamaConfig& config, Backend& backend) : config_(config), backend_(&backend) {}
  Result<void> reserve(std::int64_t num_tokens, std::int64_t num_logits);
  // The step's ops; the logits in the backend's memory ([num_logits, vocab], rows the
  // step asked for first), or an empty tensor when it asked for none.
  Result<Tensor> run(const StepInput& step);
  void release_workspace();

  struct Workspace {
    std::int64_t capacity = 0;        // tokens
    std::int64_t logit_capacity = 0;  // rows
    Tensor x, h, q, k, v, attn, gate, up, logit_x, logits;
  };

  LlamaConfig config_;
  Backend* backend_;
  Weight token_embedding_, output_norm_, output_;
  Weight rope_freqs_;
  bool has_rope_freqs_ = false;
  std::vector<LayerWeights> layers_;
  Workspace ws_;
};

}  // namespace troupe::model
