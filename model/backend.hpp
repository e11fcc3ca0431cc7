// The small set of ops the Llama forward recipe is written over. The CPU
// backend (cpu/) and the CUDA backend (gpu/) each implement all of it; the
// recipe never knows which one runs.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gguf/gguf_file.hpp"
#include "gguf/tensor_type.hpp"
#include "model/collective.hpp"
#include "model/sampler.hpp"
#include "model/step_input.hpp"
#include "troupe/result.hpp"

namespace troupe::model {

// A float32 activation matrix in the backend's memory: [rows, cols], row-major, contiguous.
struct Tensor {
  float* data = nullptr;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
};

// A weight matrix in the backend's memory, in its stored type: [rows, cols]
// with cols the input (contiguous) dimension, as in ggml.
struct Weight {
  const void* data = nullptr;
  gguf::TensorType type = gguf::TensorType::f32;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
};

enum class RopeLayout {
  normal,  // rotates pairs (x[2i], x[2i+1]): llama
  neox,    // rotates pairs (x[i], x[i + rot_dims/2]): qwen2, neox-style models
};

struct RopeParams {
  RopeLayout layout = RopeLayout::normal;
  std::int32_t rot_dims = 0;  // leading dims of each head that rotate
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;               // linear position scaling: 1 / factor
  const Weight* freq_factors = nullptr;  // [rot_dims / 2] per-frequency divisors (llama 3), or null
  // YaRN, as ggml's rope_yarn: pair i's angle blends the interpolated one (freq_scale) into
  // the unscaled one by r = ext_factor * (1 - clamp((i - yarn_lo) / (yarn_hi - yarn_lo), 0,
  // 1)); 0: plain scaling. cos and sin are multiplied by mscale either way.
  float ext_factor = 0.0f;
  float yarn_lo = 0.0f, yarn_hi = 0.0f;
  float mscale = 1.0f;
};

struct AttentionParams {
  std::int32_t num_heads = 0;
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;
  float scale = 1.0f;    // applied to q.k
  float softcap = 0.0f;  // then score = softcap * tanh(score / softcap); 0: none
  // A query at position p sees the keys at positions j with 0 <= p - j < window; 0: all
  // keys up to p.
  std::int32_t window = 0;
  // [num_heads] each (local) head's sink logit: one more term exp(sink) in its softmax's
  // denominator, unscaled, with no value (gpt-oss); null: none. In host memory.
  const float* sinks = nullptr;
};

struct ArchFeatures;

// How a mixture-of-experts FFN chooses each token's experts and their weights from the
// router's logits l (one per expert).
enum class ExpertRouting {
  softmax_top_k,  // p = softmax(l); the k largest p, renormalised to sum 1 (mixtral, qwen3moe)
  top_k_softmax,  // the k largest l; their weights softmax(those l) (gpt-oss)
  softmax_top_k_unnormalised,  // p = softmax(l); the k largest p as they are (olmoe)
};

// What each expert computes between its gate/up and down projections.
enum class ExpertActivation {
  silu,        // silu(g) * u
  swiglu_oai,  // gpt-oss: min(g,7) * sigmoid(1.702 min(g,7)) * (clamp(u,-7,7) + 1)
};

// One expert's FFN (its slice of the layer's 3-D expert tensors, or tensors of its own):
// gate and up [ffn, dim], down [dim, ffn]; biases (gpt-oss) F32, or empty.
struct ExpertWeights {
  Weight gate, up, down;
  Weight gate_bias, up_bias, down_bias;
};

// A layer's routed FFN.
struct MoeLayer {
  Weight router;       // [num_experts, dim]
  Weight router_bias;  // [num_experts] F32, or empty
  std::vector<ExpertWeights> experts;
  std::int32_t num_used = 0;  // experts per token (k)
  ExpertRouting routing = ExpertRouting::softmax_top_k;
  ExpertActivation activation = ExpertActivation::silu;
};

// One LoRA adapter's update of one matrix W [n_out, n_in] for the rows of a step that use
// that adapter (model/lora_adapter.hpp): y[r] += scale * B (A x[r]), from A and B transposed.
struct LoraGroup {
  Weight a;                            // A [rank, n_in] F32 or F16, where upload_lora put it
  Weight b_t;                          // B^T [rank, n_out], of a's type, likewise
  float scale = 0.0f;                  // s = scale * alpha / rank
  std::span<const std::int32_t> rows;  // the rows of x and y it applies to, ascending
};

// A LoRA matrix's A and B^T, in host memory or where a backend's upload_lora put them.
struct LoraWeights {
  Weight a, b_t;
};

// How the recipe runs a step its backend has begun.
struct StepShape {
  std::int64_t rows = 0;        // rows every op runs on: num_tokens, or more where a GPU pads a
                                // decode step to the batch size of a recorded CUDA graph
  std::int64_t logit_rows = 0;  // rows of logits computed (>= the step's logit_rows)
  bool replay = false;          // the backend replays a recorded step: the recipe skips the ops
};

class Backend {
 public:
  virtual ~Backend() = default;

  // What it runs on, for people: "CPU, 16 threads, AVX3" or "CUDA NVIDIA H200 (9.0, 132 SMs)".
  virtual std::string describe() const { return "backend"; }
  // The backend can run no further step (a GPU's context hit a sticky error): whoever owns
  // it must replace it. A failed step of a backend that is not lost fails only that step.
  virtual bool lost() const { return false; }

  // --- memory ---
  // Makes a weight usable by the ops (the CPU maps it in place; a GPU uploads).
  virtual Result<Weight> load_weight(const gguf::GgufTensorInfo& info) = 0;
  virtual Result<Tensor> allocate(std::int64_t rows, std::int64_t cols) = 0;
  virtual void release(Tensor tensor) = 0;
  virtual Result<void> allocate_kv_cache(const KvCacheShape& shape) = 0;
  virtual const KvCacheShape& kv_cache_shape() const = 0;
  // Bytes one KV block of `shape` takes, keys and values of every layer (in shape.dtype;
  // a backend that stores them otherwise says so).
  virtual std::int64_t kv_block_bytes(const KvCacheShape& shape) const {
    return std::int64_t{2} * shape.num_layers * shape.num_kv_heads * shape.head_dim *
           shape.block_size * kv_element_bytes(shape.dtype);
  }
  // The attention shape the model will run (this rank's heads), before the KV cache is
  // sized: a GPU reserves its decode scratch here rather than from what the pool leaves.
  virtual Result<void> prepare_attention(std::int32_t num_heads, std::int32_t head_dim) {
    (void)num_heads;
    (void)head_dim;
    return {};
  }
  // The largest collectives a split model's steps run (elements of an all-reduce, of this
  // rank's part of a gather; neither negative), before the KV cache is sized: a GPU takes their
  // buffers and connects its group here rather than from what the pool leaves. Every rank calls it.
  virtual Result<void> prepare_collectives(std::int64_t max_all_reduce,
                                           std::int64_t max_gather_part) {
    (void)max_all_reduce;
    (void)max_gather_part;
    return {};
  }
  // Device memory free now, for a KV cache sized from it; unsupported where the cache
  // lives in host memory (its size is then a configured budget).
  virtual Result<std::int64_t> free_memory_bytes() const {
    return make_error(ErrorCode::unsupported, "only a GPU sizes its KV cache from free memory");
  }

  // Whether the ops implement what a model of these features needs beyond llama's (biases,
  // GELU, softcaps, windows, ...); the error names what is missing. The ops below marked
  // "(features)" are called only when this succeeded.
  virtual Result<void> supports(const ArchFeatures& features) const;

  // --- one step ---
  // The rows a step will run on, before it begins (the recipe sizes its buffers by it).
  virtual StepShape step_shape(const StepInput& step) const {
    return StepShape{step.num_tokens(), static_cast<std::int64_t>(step.logit_rows.size()), false};
  }
  // Takes the step's tokens, positions and block tables (a GPU uploads them once).
  virtual Result<StepShape> begin_step(const StepInput& step) = 0;
  // Ends the step's ops (a GPU launches the step's graph here); reports a failed op.
  virtual Result<void> end_step() { return {}; }
  // out[t] = table row of the step's token t.          out: [num_tokens, table.cols]
  virtual void embed(const Weight& table, Tensor out) = 0;
  // out = x / rms(x) * weight, row by row.               x, out: [n, cols]
  virtual void rms_norm(Tensor x, const Weight& weight, float eps, Tensor out) = 0;
  // out = x · weightᵀ.                                   x: [n, w.cols] -> out: [n, w.rows]
  virtual void matmul(Tensor x, const Weight& weight, Tensor out) = 0;
  // Rotates each head of each row by its token's position.   x: [num_tokens, heads * head_dim]
  virtual void rope(Tensor x, std::int32_t head_dim, const RopeParams& params) = 0;
  // rope(q), rope(k), then store_kv(layer, k, v): one pass where the backend fuses them.
  virtual void rope_store_kv(std::int32_t layer, Tensor q, Tensor k, Tensor v,
                             std::int32_t head_dim, const RopeParams& params) {
    rope(q, head_dim, params);
    rope(k, head_dim, params);
    store_kv(layer, k, v);
  }
  // Writes the step's new keys and values into their KV slots of `layer`.
  //                                                     k, v: [num_tokens, kv_heads * head_dim]
  virtual void store_kv(std::int32_t layer, Tensor k, Tensor v) = 0;
  // Causal attention of each sequence's queries over its KV blocks.
  //                                                     q, out: [num_tokens, heads * head_dim]
  virtual void attention(std::int32_t layer, Tensor q, const AttentionParams& params,
                         Tensor out) = 0;
  // out = silu(gate) * up.                               all: [n, cols]
  virtual void swiglu(Tensor gate, Tensor up, Tensor out) = 0;
  // x += y.
  virtual void add(Tensor x, Tensor y) = 0;
  // (features) x[r] += bias for every row r.               x: [n, cols], bias: [cols] F32
  virtual void add_bias(Tensor x, const Weight& bias) {
    (void)x, (void)bias;
    TROUPE_ASSERT(false, "add_bias on a backend that does not support it");
  }
  // (features) out = gelu_tanh(gate) * up, gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x +
  // 0.044715 x^3))).                                       all: [n, cols]
  virtual void gelu_tanh_gate(Tensor gate, Tensor up, Tensor out) {
    (void)gate, (void)up, (void)out;
    TROUPE_ASSERT(false, "gelu_tanh_gate on a backend that does not support it");
  }
  // (features) x *= factor.
  virtual void scale(Tensor x, float factor) {
    (void)x, (void)factor;
    TROUPE_ASSERT(false, "scale on a backend that does not support it");
  }
  // (features) x = cap * tanh(x / cap).
  virtual void softcap(Tensor x, float cap) {
    (void)x, (void)cap;
    TROUPE_ASSERT(false, "softcap on a backend that does not support it");
  }
  // (features) The routed FFN: each row's experts chosen from the router's logits
  // (layer.routing), then out = Σ w_e · down_e(act(gate_e·x + bg_e, up_e·x + bu_e)) + bd_e
  // over them, added in the order chosen (the largest weight first).   x, out: [n, dim]
  virtual void moe_ffn(Tensor x, const MoeLayer& layer, Tensor out) {
    (void)x, (void)layer, (void)out;
    TROUPE_ASSERT(false, "moe_ffn on a backend that does not support it");
  }
  // x += y, then out = rms_norm(x): one pass where the backend fuses them.
  virtual void add_rms_norm(Tensor x, Tensor y, const Weight& weight, float eps, Tensor out) {
    add(x, y);
    rms_norm(x, weight, eps, out);
  }
  // Whether lora_add works (LoRA adapters can be attached to a model on this backend).
  virtual Result<void> supports_lora() const {
    return make_error(ErrorCode::unsupported, describe() + " cannot apply LoRA adapters yet");
  }
  // (lora) Puts one adapter matrix's A and B^T (host memory) where lora_add reads them,
  // once, as its adapter is attached: the host's own memory here (the CPU's), a copy in
  // device memory on a GPU. release_lora gives such a copy back when its adapter goes.
  virtual Result<LoraWeights> upload_lora(const LoraWeights& host) { return host; }
  virtual void release_lora(const LoraWeights& uploaded) { (void)uploaded; }
  // (lora) The low-rank updates of one matrix, one group per adapter of the step:
  // y[r] += g.scale * g.b · (g.a · x[r]) for each row r of each group g; a row is in one
  // group at most. The rows of a group are one gathered product (Punica's and S-LoRA's
  // grouping), never one pass per adapter.            x: [n, a.cols], y: [n, b.rows]
  virtual void lora_add(Tensor x, std::span<const LoraGroup> groups, Tensor y) {
    (void)x, (void)groups, (void)y;
    TROUPE_ASSERT(false, "lora_add on a backend that does not support it");
  }
  // out[i] = x[step.logit_rows[i]].                      out: [num_logits, x.cols]
  virtual void gather_logit_rows(Tensor x, Tensor out) = 0;
  // Copies a tensor to host memory.                      host: [rows * cols]
  virtual Result<void> read(Tensor tensor, std::span<float> host) = 0;

  // --- pipeline parallelism (optional) ---
  // Whether a pipeline stage can run here: its hidden states come from host memory
  // (write) and go back to it (read) between the stages' ops.
  virtual Result<void> supports_pipeline_stage() const {
    return make_error(ErrorCode::unsupported, describe() + " cannot run a pipeline stage yet");
  }
  // Copies host memory into a tensor, within a step.       host: [rows * cols]
  virtual Result<void> write(std::span<const float> host, Tensor tensor) {
    (void)host, (void)tensor;
    return supports_pipeline_stage();
  }

  // --- tensor parallelism (optional) ---
  // Makes the backend one rank of a tensor-parallel group: all_reduce sums over `group`.
  virtual Result<void> join_group(std::shared_ptr<Communicator> group) {
    (void)group;
    return make_error(ErrorCode::unsupported, describe() + " cannot be split over ranks yet");
  }
  // x = the sum of x over the group's ranks (Communicator::all_reduce_sum: in rank order,
  // the same bits on every rank). A failed collective is reported by end_step().
  virtual void all_reduce(Tensor x) {
    (void)x;
    TROUPE_ASSERT(false, "all_reduce on a backend that joined no group");
  }
  // Rank 0's whole = every rank's part side by side: [rows, size * part.cols], rank r's
  // columns at r * part.cols (the LM head's vocabulary slices); the other ranks pass an
  // empty `whole`. A failure is reported by end_step().
  virtual void gather_columns(Tensor part, Tensor whole) {
    (void)part, (void)whole;
    TROUPE_ASSERT(false, "gather_columns on a backend that joined no group");
  }
  // Seconds spent in all_reduce so far (the benchmark's share of a step).
  virtual double all_reduce_seconds() const { return 0.0; }

  // --- sampling on the device (optional) ---
  // Whether sample() works; if not, the runner reads logits back and samples on the host.
  virtual bool can_sample() const { return false; }
  // One token per row of `logits`; only the ids cross to the host.   ids: [logits.rows]
  virtual Result<void> sample(Tensor logits, std::span<const DeviceSamplingRow> rows,
                              std::span<TokenId> ids) {
    (void)logits, (void)rows, (void)ids;
    return make_error(ErrorCode::unsupported, "this backend does not sample on its device");
  }
};

}  // namespace troupe::model
