// LlamaModel's forward pass: the activation workspace, one step's ops over the Backend
// (embedding, each layer's attention and feed-forward blocks, the LM head), and the two ways
// out (logits read back, or tokens sampled on the device). Loading the weights is
// llama_model.cpp's.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <span>
#include <vector>

#include "model/llama_model.hpp"

namespace troupe::model {

namespace {

Tensor view(Tensor t, std::int64_t rows) {
  return Tensor{t.data, rows, t.cols};
}
}  // namespace

void LlamaModel::release_workspace() {
  if (backend_ == nullptr || ws_.capacity == 0) return;
  for (Tensor t : {ws_.x, ws_.h, ws_.q, ws_.k, ws_.v, ws_.attn, ws_.gate, ws_.up, ws_.moe_out,
                   ws_.logit_x, ws_.logits_part, ws_.logits}) {
    if (t.data != nullptr) backend_->release(t);
  }
  ws_ = Workspace{};
}

Result<void> LlamaModel::prepare(std::int64_t max_tokens, std::int64_t max_logits) {
  TROUPE_TRY_VOID(reserve(max_tokens, max_logits));
  TROUPE_TRY_VOID(backend_->prepare_attention(local_.num_heads, local_.head_dim));
  if (!shard_.is_split()) return {};
  // The all-reduces sum [tokens, dim] (after the attention output and the down
  // projection); a vocabulary-split head gathers [logit rows, vocab / ranks] parts.
  const std::int64_t gather_part =
      vocab_split_ ? ws_.logit_capacity * (config_.vocab_size / shard_.world_size) : 0;
  return backend_->prepare_collectives(ws_.capacity * local_.dim, gather_part);
}

Result<void> LlamaModel::reserve(std::int64_t num_tokens, std::int64_t num_logits) {
  if (num_tokens <= ws_.capacity && num_logits <= ws_.logit_capacity) return {};
  const std::int64_t tokens = std::max(num_tokens, ws_.capacity);
  const std::int64_t logits = std::max<std::int64_t>({num_logits, ws_.logit_capacity, 1});
  release_workspace();
  const auto& c = local_;
  const std::int64_t q_dim = static_cast<std::int64_t>(c.num_heads) * c.head_dim;
  const std::int64_t kv_dim = static_cast<std::int64_t>(c.num_kv_heads) * c.head_dim;
  Workspace ws;
  TROUPE_TRY(ws.x, backend_->allocate(tokens, c.dim));
  ws_ = ws;  // from here on, release_workspace frees whatever got allocated
  ws_.capacity = tokens;
  TROUPE_TRY(ws_.h, backend_->allocate(tokens, c.dim));
  TROUPE_TRY(ws_.q, backend_->allocate(tokens, q_dim));
  TROUPE_TRY(ws_.k, backend_->allocate(tokens, kv_dim));
  TROUPE_TRY(ws_.v, backend_->allocate(tokens, kv_dim));
  TROUPE_TRY(ws_.attn, backend_->allocate(tokens, q_dim));
  TROUPE_TRY(ws_.gate, backend_->allocate(tokens, c.ffn_dim));
  TROUPE_TRY(ws_.up, backend_->allocate(tokens, c.ffn_dim));
  if (c.features.num_experts > 0) {
    TROUPE_TRY(ws_.moe_out, backend_->allocate(tokens, c.dim));
  }
  ws_.logit_capacity = logits;
  if (vocab_split_ || shard_.computes_logits()) {
    TROUPE_TRY(ws_.logit_x, backend_->allocate(logits, c.dim));
  }
  if (vocab_split_) {
    TROUPE_TRY(ws_.logits_part, backend_->allocate(logits, c.vocab_size / shard_.world_size));
  }
  if (shard_.computes_logits()) {
    TROUPE_TRY(ws_.logits, backend_->allocate(logits, c.vocab_size));
  }
  return {};
}

Result<Tensor> LlamaModel::run(const StepInput& step) {
  const auto& c = local_;
  TROUPE_TRY_VOID(validate_step(step, backend_->kv_cache_shape(), c.vocab_size));
  if (step.num_tokens() == 0) return Tensor{};
  Backend& b = *backend_;
  // Buffers first: a backend that records steps must see them settled before it begins.
  const StepShape shape = b.step_shape(step);
  const std::int64_t n = shape.rows;
  // Every rank of a vocabulary-split LM head computes its slice of the logits.
  const bool logits_here = shard_.computes_logits() || vocab_split_;
  const std::int64_t num_logits =
      step.logit_rows.empty() || !logits_here ? 0 : std::max<std::int64_t>(shape.logit_rows, 1);
  TROUPE_TRY_VOID(reserve(n, num_logits));
  TROUPE_TRY_VOID(group_adapter_rows(step));
  const PipelineStage& stage = shard_.stage;
  if (stage.is_staged() && pipe_ == nullptr) {
    return make_error(ErrorCode::invalid_argument,
                      "pipeline stage " + std::to_string(stage.index) + " has joined no pipeline");
  }
  // A later stage waits for the hidden states before its step begins.
  if (!stage.is_first()) TROUPE_TRY_VOID(receive_hidden(n));
  TROUPE_TRY(const StepShape plan, b.begin_step(step));
  TROUPE_ASSERT(plan.rows == shape.rows && plan.logit_rows == shape.logit_rows,
                "a backend began a step of another shape than it announced");
  const Tensor x = view(ws_.x, n), h = view(ws_.h, n), q = view(ws_.q, n), k = view(ws_.k, n),
               v = view(ws_.v, n), attn = view(ws_.attn, n), gate = view(ws_.gate, n),
               up = view(ws_.up, n);
  const Tensor logit_x = view(ws_.logit_x, num_logits);
  const Tensor out = view(ws_.logits, num_logits);
  if (!stage.is_first()) {
    const auto hidden =
        std::span<const float>(pipe_buffer_).first(static_cast<std::size_t>(n * c.dim));
    if (auto written = b.write(hidden, x); !written) {
      (void)b.end_step();
      return tl::make_unexpected(written.error());
    }
  }
  // This stage's layers (all of them when the model is not staged); the stage before ended
  // with x's residual add, as the unsplit model's add_rms_norm adds before it normalizes.
  const auto num_layers = static_cast<std::int32_t>(layers_.size());
  if (!plan.replay) {
    const ArchFeatures& f = c.features;
    if (stage.is_first()) {
      b.embed(token_embedding_, x);
      if (f.embedding_scale != 1.0f) b.scale(x, f.embedding_scale);
    }
    b.rms_norm(x, layers_[0].attn_norm, c.norm_eps, h);
    for (std::int32_t layer = 0; layer < num_layers; ++layer) {
      attention_block(layer, h, q, k, v, attn);
      b.add_rms_norm(x, h, layers_[layer].ffn_norm, c.norm_eps, h);
      const Tensor y = ffn_block(layer, h, gate, up);
      if (layer + 1 < num_layers) {
        b.add_rms_norm(x, y, layers_[layer + 1].attn_norm, c.norm_eps, h);
      } else {
        b.add(x, y);
      }
    }
    if (num_logits > 0) {
      b.gather_logit_rows(x, logit_x);
      b.rms_norm(logit_x, output_norm_, c.norm_eps, logit_x);
      if (vocab_split_) {
        const Tensor part = view(ws_.logits_part, num_logits);
        b.matmul(logit_x, output_, part);
        b.gather_columns(part, shard_.computes_logits() ? out : Tensor{});
      } else {
        b.matmul(logit_x, output_, out);
      }
      if (f.final_softcap > 0.0f && shard_.computes_logits()) b.softcap(out, f.final_softcap);
    }
  }
  TROUPE_TRY_VOID(b.end_step());
  if (!stage.is_last()) TROUPE_TRY_VOID(send_hidden(x));
  return out;
}

Result<void> LlamaModel::join_pipeline(std::shared_ptr<Communicator> pipe) {
  const PipelineStage& stage = shard_.stage;
  if (pipe == nullptr || pipe->size() != stage.count || pipe->rank() != stage.index) {
    return make_error(ErrorCode::invalid_argument,
                      "pipeline stage " + std::to_string(stage.index) + " of " +
                          std::to_string(stage.count) + " needs the pipeline's rank " +
                          std::to_string(stage.index) + " of " + std::to_string(stage.count));
  }
  pipe_ = std::move(pipe);
  return {};
}

namespace {

// The sender's clock travels after the hidden states: an int64 in two floats' bytes.
constexpr std::size_t kStampFloats = sizeof(std::int64_t) / sizeof(float);
constexpr std::size_t kMaxHopsKept = 64;

std::int64_t wall_clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Result<void> LlamaModel::receive_hidden(std::int64_t rows) {
  const auto size = static_cast<std::size_t>(rows * local_.dim);
  pipe_buffer_.resize(size + kStampFloats);
  const std::int64_t posted = wall_clock_ns();
  TROUPE_TRY_VOID(pipe_->recv(pipe_buffer_, shard_.stage.index - 1));
  const std::int64_t whole = wall_clock_ns();
  std::int64_t sent = 0;
  std::memcpy(&sent, pipe_buffer_.data() + size, sizeof sent);
  const std::int64_t from = std::max(sent, posted);
  // Kept for take_hop_seconds, the latest few where no one takes them (a benchmark's loop).
  if (hop_seconds_.size() >= kMaxHopsKept) hop_seconds_.erase(hop_seconds_.begin());
  hop_seconds_.push_back(static_cast<double>(std::max<std::int64_t>(0, whole - from)) * 1e-9);
  return {};
}

Result<void> LlamaModel::send_hidden(Tensor x) {
  const auto size = static_cast<std::size_t>(x.rows * x.cols);
  pipe_buffer_.resize(size + kStampFloats);
  TROUPE_TRY_VOID(backend_->read(x, std::span<float>(pipe_buffer_).first(size)));
  const std::int64_t sent = wall_clock_ns();
  std::memcpy(pipe_buffer_.data() + size, &sent, sizeof sent);
  return pipe_->send(pipe_buffer_, shard_.stage.index + 1);
}

void LlamaModel::attention_block(std::int32_t layer, Tensor h, Tensor q, Tensor k, Tensor v,
                                 Tensor attn) {
  const auto& c = local_;
  const ArchFeatures& f = c.features;
  const LayerWeights& w = layers_[layer];
  const std::int32_t model_layer = shard_.stage.layer_begin + layer;  // the file's blk.N
  Backend& b = *backend_;
  AttentionParams params{c.num_heads, c.num_kv_heads, c.head_dim, c.query_scale()};
  params.softcap = f.attention_softcap;
  params.window = f.window_of(model_layer);
  if (f.attention_sinks) params.sinks = static_cast<const float*>(w.sinks.data);
  RopeParams rope{c.rope_layout, c.rope_dims, c.rope_freq_base, c.rope_freq_scale,
                  has_rope_freqs_ ? &rope_freqs_ : nullptr};
  rope.ext_factor = c.rope_ext_factor;
  rope.yarn_lo = c.rope_yarn_lo;
  rope.yarn_hi = c.rope_yarn_hi;
  rope.mscale = c.rope_mscale;
  if (f.local_rope_base > 0.0f && params.window > 0) {  // a local layer's own RoPE
    rope = RopeParams{c.rope_layout, c.rope_dims, f.local_rope_base, 1.0f, nullptr};
  }
  // Every linear op runs on all n tokens at once.
  b.matmul(h, w.wq, q);
  b.matmul(h, w.wk, k);
  b.matmul(h, w.wv, v);
  lora(model_layer, LoraTarget::attn_q, h, q);
  lora(model_layer, LoraTarget::attn_k, h, k);
  lora(model_layer, LoraTarget::attn_v, h, v);
  if (f.qkv_bias) {
    b.add_bias(q, w.bq);
    b.add_bias(k, w.bk);
    b.add_bias(v, w.bv);
  }
  if (f.qk_norm) {  // each head a row of its own: [tokens * heads, head_dim]
    const auto heads = [&](Tensor t) {
      return Tensor{t.data, t.rows * (t.cols / c.head_dim), c.head_dim};
    };
    b.rms_norm(heads(q), w.q_norm, c.norm_eps, heads(q));
    b.rms_norm(heads(k), w.k_norm, c.norm_eps, heads(k));
  } else if (f.qk_norm_whole) {  // a token's whole projection is one row
    b.rms_norm(q, w.q_norm, c.norm_eps, q);
    b.rms_norm(k, w.k_norm, c.norm_eps, k);
  }
  b.rope_store_kv(layer, q, k, v, c.head_dim, rope);
  b.attention(layer, q, params, attn);  // per sequence, over its own blocks
  b.matmul(attn, w.wo, h);
  lora(model_layer, LoraTarget::attn_output, attn, h);
  if (shard_.is_split()) b.all_reduce(h);  // each rank's heads' share of the projection
  if (f.attn_output_bias) b.add_bias(h, w.bo);
  if (f.post_norms) b.rms_norm(h, w.post_attn_norm, c.norm_eps, h);
}

Tensor LlamaModel::ffn_block(std::int32_t layer, Tensor h, Tensor gate, Tensor up) {
  const auto& c = local_;
  const ArchFeatures& f = c.features;
  const LayerWeights& w = layers_[layer];
  const std::int32_t model_layer = shard_.stage.layer_begin + layer;  // the file's blk.N
  Backend& b = *backend_;
  if (f.num_experts > 0) {
    const Tensor out = view(ws_.moe_out, h.rows);
    b.moe_ffn(h, w.moe, out);
    if (shard_.is_split()) b.all_reduce(out);  // each rank's slice of every expert
    if (f.post_norms) b.rms_norm(out, w.post_ffn_norm, c.norm_eps, out);
    return out;
  }
  b.matmul(h, w.w_gate, gate);
  b.matmul(h, w.w_up, up);
  lora(model_layer, LoraTarget::ffn_gate, h, gate);
  lora(model_layer, LoraTarget::ffn_up, h, up);
  switch (f.activation) {
    case FfnActivation::silu:
      b.swiglu(gate, up, gate);
      break;
    case FfnActivation::gelu_tanh:
      b.gelu_tanh_gate(gate, up, gate);
      break;
  }
  b.matmul(gate, w.w_down, h);
  lora(model_layer, LoraTarget::ffn_down, gate, h);
  if (shard_.is_split()) b.all_reduce(h);  // each rank's FFN slice's share
  if (f.post_norms) b.rms_norm(h, w.post_ffn_norm, c.norm_eps, h);
  return h;
}

Result<void> LlamaModel::forward(const StepInput& step, std::vector<float>& logits) {
  const auto vocab = static_cast<std::size_t>(config_.vocab_size);
  TROUPE_TRY(const Tensor out, run(step));
  if (!shard_.computes_logits()) {
    logits.clear();
    return {};
  }
  logits.assign(step.logit_rows.size() * vocab, 0.0f);
  if (out.rows == 0) return {};
  // A padded step has more rows: the ones the step asked for come first.
  return backend_->read(view(out, static_cast<std::int64_t>(step.logit_rows.size())), logits);
}

Result<void> LlamaModel::forward_sample(const StepInput& step,
                                        std::span<const DeviceSamplingRow> rows,
                                        std::vector<TokenId>& ids,
                                        const std::function<void()>& before_sample) {
  if (rows.size() != step.logit_rows.size()) {
    return make_error(ErrorCode::invalid_argument, "one sampling row per logit row is needed");
  }
  TROUPE_TRY(const Tensor out, run(step));
  ids.assign(rows.size(), kNoToken);
  if (before_sample) before_sample();
  if (rows.empty()) return {};
  return backend_->sample(view(out, static_cast<std::int64_t>(rows.size())), rows, ids);
}

}  // namespace troupe::model