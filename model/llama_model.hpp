// The Llama-family forward pass, written once over the Backend ops: one call
// runs one step (a flat batch of many sequences' tokens) and returns logits for
// the rows the step asked for.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/backend.hpp"
#include "model/llama_config.hpp"

namespace troupe::model {

struct LayerWeights {
  Weight attn_norm, wq, wk, wv, wo;
  Weight ffn_norm, w_gate, w_up, w_down;
};

class LlamaModel {
 public:
  // Loads every weight into `backend`, checking each one's shape and type.
  static Result<LlamaModel> load(const GgufFile& file, Backend& backend);

  const LlamaConfig& config() const { return config_; }
  Backend& backend() const { return *backend_; }

  // Runs one step; `logits` receives [step.logit_rows.size(), vocab_size] floats.
  Result<void> forward(const StepInput& step, std::vector<float>& logits);

  LlamaModel(LlamaModel&&) noexcept;
  LlamaModel& operator=(LlamaModel&&) noexcept;
  ~LlamaModel();

 private:
  LlamaModel(const LlamaConfig& config, Backend& backend) : config_(config), backend_(&backend) {}
  Result<void> reserve(std::int64_t num_tokens, std::int64_t num_logits);
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
