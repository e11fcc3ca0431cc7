// LlamaModel's LoRA adapters: attaching one to a slot, and a step's low-rank updates. Each
// adapted matrix's product runs on all rows at once (llama_forward.cpp); then one lora_add
// adds every adapter's update to the rows of that adapter, a gathered product per adapter
// of the step (Punica's and S-LoRA's grouping), so a step mixes adapters and the base model.
#include <string>

#include "model/llama_model.hpp"
#include "model/tensor_parallel.hpp"

namespace troupe::model {

Result<std::shared_ptr<const LoraAdapter>> LlamaModel::fit_adapter(
    std::shared_ptr<const LoraAdapter> adapter) const {
  if (adapter == nullptr) return make_error(ErrorCode::invalid_argument, "no adapter given");
  TROUPE_TRY_VOID(backend_->supports_lora());
  if (adapter->architecture() != config_.architecture ||
      adapter->num_layers() != config_.num_layers) {
    return make_error(ErrorCode::invalid_argument,
                      "the adapter was read for another model (" + adapter->architecture() + ", " +
                          std::to_string(adapter->num_layers()) + " layers)");
  }
  if (shard_.is_split()) {
    // A rank holds the part of each adapted matrix that goes with its part of W: the rows
    // of B for W's rows (Q, K and V heads, gate and up columns of the FFN), the columns of
    // A for W's columns (the output projection's heads, the down projection's FFN slice),
    // whose partial updates the all-reduce after W adds up (llama_forward.cpp).
    TROUPE_TRY(const ShardLayout part, shard_layout(config_, shard_));
    const std::int64_t hd = config_.head_dim;
    const LoraCut q{LoraCut::Part::outputs, part.head_begin * hd, part.num_heads * hd};
    const LoraCut kv{LoraCut::Part::outputs, part.kv_head_begin * hd, part.num_kv_heads * hd};
    const LoraCut heads_in{LoraCut::Part::inputs, part.head_begin * hd, part.num_heads * hd};
    const LoraCut ffn{LoraCut::Part::outputs, part.ffn_begin, part.ffn_dim};
    const LoraCut ffn_in{LoraCut::Part::inputs, part.ffn_begin, part.ffn_dim};
    // attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down (LoraTarget's order).
    TROUPE_TRY(auto rank_part, adapter->cut({q, kv, kv, heads_in, ffn, ffn, ffn_in}));
    adapter = std::make_shared<const LoraAdapter>(std::move(rank_part));
  }
  // The shapes were checked against the base file; check them against what was loaded too
  // (a pipeline stage's layers).
  for (std::int32_t layer = shard_.stage.layer_begin; layer < shard_.stage.layer_end; ++layer) {
    const LayerWeights& w = layers_[static_cast<std::size_t>(layer - shard_.stage.layer_begin)];
    for (std::size_t t = 0; t < kNumLoraTargets; ++t) {
      const auto target = static_cast<LoraTarget>(t);
      const LoraMatrix* m = adapter->find(layer, target);
      if (m == nullptr) continue;
      const Weight* weights[] = {&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down};
      const Weight& base = *weights[t];
      if (base.data == nullptr || base.rows != m->n_out || base.cols != m->n_in) {
        return make_error(ErrorCode::invalid_argument,
                          "the adapter's blk." + std::to_string(layer) + "." +
                              std::string(lora_target_name(target)) +
                              " does not fit the loaded model's matrix");
      }
    }
  }
  return adapter;
}

Result<std::vector<LoraWeights>> LlamaModel::upload_adapter(const LoraAdapter& adapter) {
  // Every matrix where lora_add reads it; none kept if one fails.
  // By the file's layer number; a pipeline stage's layers alone.
  std::vector<LoraWeights> uploaded(static_cast<std::size_t>(config_.num_layers) * kNumLoraTargets);
  for (std::int32_t layer = shard_.stage.layer_begin; layer < shard_.stage.layer_end; ++layer) {
    for (std::size_t t = 0; t < kNumLoraTargets; ++t) {
      const LoraMatrix* m = adapter.find(layer, static_cast<LoraTarget>(t));
      if (m == nullptr) continue;
      const LoraWeights host{Weight{m->a.data(), m->type, m->rank, m->n_in},
                             Weight{m->b_t.data(), m->type, m->rank, m->n_out}};
      auto placed = backend_->upload_lora(host);
      if (!placed) {
        release_adapter_weights(uploaded);
        return tl::make_unexpected(placed.error());
      }
      uploaded[static_cast<std::size_t>(layer) * kNumLoraTargets + t] = *placed;
    }
  }
  return uploaded;
}

void LlamaModel::release_adapter_weights(std::vector<LoraWeights>& weights) {
  for (const auto& w : weights) {
    if (w.a.data != nullptr) backend_->release_lora(w);
  }
  weights.clear();
}

Result<std::int32_t> LlamaModel::attach_adapter(std::shared_ptr<const LoraAdapter> adapter) {
  TROUPE_TRY(auto fitted, fit_adapter(std::move(adapter)));
  TROUPE_TRY(auto uploaded, upload_adapter(*fitted));
  // A slot emptied by set_adapter may sit at the end: attaching takes the next one after.
  lora_weights_.resize(adapters_.size());
  adapters_.push_back(std::move(fitted));
  lora_weights_.push_back(std::move(uploaded));
  return num_adapters();
}

Result<void> LlamaModel::set_adapter(std::int32_t slot,
                                     std::shared_ptr<const LoraAdapter> adapter) {
  if (slot < 1) {
    return make_error(ErrorCode::invalid_argument,
                      "LoRA adapter slot " + std::to_string(slot) + " (slots start at 1)");
  }
  std::vector<LoraWeights> uploaded;
  if (adapter != nullptr) {
    TROUPE_TRY(adapter, fit_adapter(std::move(adapter)));
    TROUPE_TRY(uploaded, upload_adapter(*adapter));
  }
  const auto index = static_cast<std::size_t>(slot - 1);
  if (adapters_.size() <= index) adapters_.resize(index + 1);
  lora_weights_.resize(adapters_.size());
  release_adapter_weights(lora_weights_[index]);  // what the slot held before
  adapters_[index] = std::move(adapter);
  lora_weights_[index] = std::move(uploaded);
  return {};
}

Result<void> LlamaModel::group_adapter_rows(const StepInput& step) {
  lora_step_ = false;
  if (step.adapters.empty()) return {};
  lora_rows_.resize(adapters_.size() + 1);
  for (auto& rows : lora_rows_) rows.clear();
  for (std::int32_t s = 0; s < step.num_seqs(); ++s) {
    const std::int32_t slot = step.adapters[static_cast<std::size_t>(s)];
    if (slot > num_adapters()) {
      return make_error(ErrorCode::invalid_argument,
                        "a sequence names LoRA adapter slot " + std::to_string(slot) + " of " +
                            std::to_string(num_adapters()) + " attached");
    }
    if (slot == 0) continue;
    if (adapters_[static_cast<std::size_t>(slot - 1)] == nullptr) {
      return make_error(ErrorCode::invalid_argument, "a sequence names LoRA adapter slot " +
                                                         std::to_string(slot) +
                                                         ", which holds no adapter");
    }
    lora_step_ = true;
    auto& rows = lora_rows_[static_cast<std::size_t>(slot)];
    for (std::int32_t r = step.query_start[s]; r < step.query_start[s + 1]; ++r) rows.push_back(r);
  }
  return {};
}

void LlamaModel::lora(std::int32_t layer, LoraTarget target, Tensor x, Tensor y) {
  if (!lora_step_) return;
  lora_groups_.clear();
  for (std::size_t slot = 1; slot < lora_rows_.size(); ++slot) {
    if (lora_rows_[slot].empty()) continue;
    const LoraMatrix* m = adapters_[slot - 1]->find(layer, target);
    if (m == nullptr) continue;
    const LoraWeights& w =
        lora_weights_[slot - 1][static_cast<std::size_t>(layer) * kNumLoraTargets +
                                static_cast<std::size_t>(target)];
    lora_groups_.push_back(LoraGroup{w.a, w.b_t, m->scale, lora_rows_[slot]});
  }
  if (!lora_groups_.empty()) backend_->lora_add(x, lora_groups_, y);
}

}  // namespace troupe::model
