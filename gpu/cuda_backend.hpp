// The CUDA backend: every Backend op on one GPU, on the worker's own stream.
// Weights are uploaded once in F16 or BF16 (quantized types are decoded on
// upload); linear layers run through cuBLAS with float32 accumulation; the KV
// cache is a pool of half-precision blocks indexed by the engine's block ids;
// decode-only steps are recorded as CUDA graphs, one per batch size, and
// replayed; sampling runs on the device so that only token ids come back.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "gpu/kernel_types.hpp"
#include "gpu/step_layout.hpp"
#include "model/backend.hpp"

namespace troupe::gpu {

class NcclCommunicator;

enum class WeightDtype {
  automatic,  // F16 and BF16 kept as they are; everything else to BF16
  f16,
  bf16,
};

struct CudaBackendOptions {
  int device = 0;
  WeightDtype weight_dtype = WeightDtype::automatic;
  bool cuda_graphs = true;
  // Prefill attention on the tensor cores (half-precision products); off: float FMAs.
  bool prefill_tensor_cores = true;
  std::int32_t max_graph_batch = 256;
  // The longest sequence a recorded decode step serves; 0 turns graphs off.
  std::int32_t max_model_len = 0;
};

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int compute_major = 0, compute_minor = 0;
  int multiprocessors = 0;
  std::int64_t total_bytes = 0;
  std::int64_t free_bytes = 0;
};

// The device, or why there is none usable ("no CUDA device": tests skip on it).
Result<DeviceInfo> probe_device(int ordinal = 0);

class CudaBackend final : public model::Backend {
 public:
  static Result<std::unique_ptr<CudaBackend>> create(const CudaBackendOptions& options = {});
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  const DeviceInfo& device() const { return device_; }
  bool lost() const override { return lost_; }
  std::string describe() const override;
  const CudaBackendOptions& options() const { return options_; }
  // Switches the prefill attention kernel (benchmarks compare the two in one run).
  void set_prefill_tensor_cores(bool on) { options_.prefill_tensor_cores = on; }
  // Bytes of device memory the backend holds: weights, buffers, KV cache.
  std::int64_t bytes_in_use() const { return bytes_in_use_; }
  std::int64_t weight_bytes() const { return weight_bytes_; }
  // Whether the attention kernels take these heads (a model is refused at load, not at its
  // first step).
  static Result<void> check_heads(std::int32_t num_heads, std::int32_t num_kv_heads,
                                  std::int32_t head_dim);
  // Free device memory now.
  Result<std::int64_t> free_bytes() const;
  Result<std::int64_t> free_memory_bytes() const override { return free_bytes(); }
  // Keys and values in half precision.
  Result<void> prepare_attention(std::int32_t num_heads, std::int32_t head_dim) override;
  std::int64_t kv_block_bytes(const model::KvCacheShape& shape) const override;

  // A random matrix made on the device in the backend's 16-bit type (benchmarks): values
  // uniform in [-scale, scale], from a counter-based generator keyed by `seed`.
  Result<model::Weight> random_weight(std::int64_t rows, std::int64_t cols, std::uint64_t seed,
                                      float scale);
  // A random F32 vector, uniform in [offset - scale, offset + scale].
  Result<model::Weight> random_vector(std::int64_t size, std::uint64_t seed, float scale,
                                      float offset);
  // Fills the KV cache with random values (benchmarks never time zeros).
  Result<void> randomize_kv_cache(std::uint64_t seed);

  // Graph statistics: recorded batch sizes, replays so far.
  std::size_t num_graphs() const { return graphs_.size(); }
  std::int64_t num_replays() const { return num_replays_; }
  // Waits for the stream; reports any failure so far.
  Result<void> synchronize();
  // The raw stream, for benchmarks that time with events.
  void* stream() const { return stream_; }

  Result<model::Weight> load_weight(const gguf::GgufTensorInfo& info) override;
  Result<model::Tensor> allocate(std::int64_t rows, std::int64_t cols) override;
  void release(model::Tensor tensor) override;
  Result<void> allocate_kv_cache(const model::KvCacheShape& shape) override;
  const model::KvCacheShape& kv_cache_shape() const override { return kv_shape_; }

  model::StepShape step_shape(const model::StepInput& step) const override;
  // Every feature of every architecture troupe reads.
  Result<void> supports(const model::ArchFeatures& features) const override;
  Result<model::StepShape> begin_step(const model::StepInput& step) override;
  Result<void> end_step() override;
  void embed(const model::Weight& table, model::Tensor out) override;
  void rms_norm(model::Tensor x, const model::Weight& weight, float eps,
                model::Tensor out) override;
  void matmul(model::Tensor x, const model::Weight& weight, model::Tensor out) override;
  void rope(model::Tensor x, std::int32_t head_dim, const model::RopeParams& params) override;
  void store_kv(std::int32_t layer, model::Tensor k, model::Tensor v) override;
  void rope_store_kv(std::int32_t layer, model::Tensor q, model::Tensor k, model::Tensor v,
                     std::int32_t head_dim, const model::RopeParams& params) override;
  void attention(std::int32_t layer, model::Tensor q, const model::AttentionParams& params,
                 model::Tensor out) override;
  void swiglu(model::Tensor gate, model::Tensor up, model::Tensor out) override;
  void add_bias(model::Tensor x, const model::Weight& bias) override;
  void gelu_tanh_gate(model::Tensor gate, model::Tensor up, model::Tensor out) override;
  void scale(model::Tensor x, float factor) override;
  void softcap(model::Tensor x, float cap) override;
  void add(model::Tensor x, model::Tensor y) override;
  void add_rms_norm(model::Tensor x, model::Tensor y, const model::Weight& weight, float eps,
                    model::Tensor out) override;
  void gather_logit_rows(model::Tensor x, model::Tensor out) override;
  // LoRA: an adapter's matrices copied to the device as they are (F16 or F32) when it is
  // attached; a step's updates gathered by each row's adapter slot (gpu/lora.cu). Steps
  // with adapters run eagerly, never from a graph.
  Result<void> supports_lora() const override { return {}; }
  Result<model::LoraWeights> upload_lora(const model::LoraWeights& host) override;
  void release_lora(const model::LoraWeights& uploaded) override;
  void lora_add(model::Tensor x, std::span<const model::LoraGroup> groups,
                model::Tensor y) override;
  Result<void> read(model::Tensor tensor, std::span<float> host) override;
  // A rank of a tensor-parallel group: an NCCL communicator (gpu/nccl_communicator) on this
  // backend's stream. Steps then run eagerly (no CUDA graphs), and every wait for the
  // stream is bounded by the group's timeout.
  Result<void> join_group(std::shared_ptr<model::Communicator> group) override;
  void all_reduce(model::Tensor x) override;
  void gather_columns(model::Tensor part, model::Tensor whole) override;
  // The group's scratch and rank 0's gather buffer at their largest, and NCCL's
  // connections made (a first collective of each kind), before the KV pool is sized.
  Result<void> prepare_collectives(std::int64_t max_all_reduce,
                                   std::int64_t max_gather_part) override;
  bool can_sample() const override { return true; }
  Result<void> sample(model::Tensor logits, std::span<const model::DeviceSamplingRow> rows,
                      std::span<TokenId> ids) override;

  // Test hooks: upload host floats to a tensor, and poison a tensor with NaN.
  Result<void> write(model::Tensor tensor, std::span<const float> host);
  void poison(model::Tensor tensor);

 private:
  struct Impl;
  explicit CudaBackend(const CudaBackendOptions& options);
  Result<void> init();
  // Records the step's first CUDA failure (begin_step forgets it); a sticky one loses the
  // backend for good and marks its device for a reset once its last backend is gone.
  bool check(int status, const char* what);
  // The backend cannot go on (a sticky CUDA error, a broken NCCL group).
  void lose(std::string why);
  Result<void> status() const;
  Result<void*> device_alloc(std::int64_t bytes);
  // A device buffer that grows (doubling), never shrinks.
  struct Buffer {
    void* data = nullptr;
    std::int64_t bytes = 0;
  };
  // Grows `b` to hold `bytes`; reports whether it moved. The stream must be idle.
  Result<bool> grow(Buffer& b, std::int64_t bytes);
  // Makes this backend's GPU the calling thread's current device: every entry point that
  // touches the device outside a step calls it (a step's ops follow begin_step's).
  void select_device() const;
  void release_buffer(Buffer& b);
  Result<void> ensure_step_capacity(const StepLayout& layout);
  // Grows rank 0's gather buffer to `bytes`, after a bounded wait for the stream.
  Result<void> grow_gathered(std::int64_t bytes);
  void invalidate_graphs();
  // The cast buffer holds a 16-bit copy of one tensor: matmuls reading it skip their cast,
  // and norms, SwiGLU and attention write it as they write their output.
  struct CastCopy {
    const float* source = nullptr;
    std::int64_t rows = 0, cols = 0;
    gguf::TensorType type = gguf::TensorType::bf16;
  };
  // The copy an op writing `out` should also make (none if the buffer is too small).
  kernels::Copy16 copy_for(model::Tensor out);
  // Where `layer` begins in the K or V cache.
  void* layer_cache(const Buffer& cache, std::int32_t layer) const;
  void wrote(model::Tensor t) {
    if (cast_.source == t.data) cast_ = CastCopy{};
  }

  CudaBackendOptions options_;
  DeviceInfo device_;
  void* stream_ = nullptr;  // cudaStream_t
  std::unique_ptr<Impl> impl_;
  std::string error_;  // the step's first failure, or what lost the backend
  bool lost_ = false;
  bool counted_ = false;  // in the device's count of live backends
  std::shared_ptr<model::Communicator> group_;
  NcclCommunicator* nccl_ = nullptr;  // group_, as what it is (null: not in a group)
  void* gathered_ = nullptr;          // [size, rows, part cols] on rank 0: gather_columns
  std::int64_t gathered_bytes_ = 0;
  std::int64_t bytes_in_use_ = 0;
  std::int64_t weight_bytes_ = 0;
  model::KvCacheShape kv_shape_;
  Buffer k_cache_, v_cache_;  // [layers][slots][kv_heads * head_dim] half
  GraphPolicy graph_policy_;
  StepLayout layout_;
  bool step_open_ = false;
  bool capturing_ = false;
  bool replaying_ = false;
  std::int64_t graph_key_ = 0;
  std::map<std::int64_t, void*> graphs_;  // StepLayout::graph_key -> cudaGraphExec_t
  std::set<std::int64_t> warmed_;         // graph keys run once eagerly
  std::int64_t num_replays_ = 0;
  std::int32_t num_heads_ = 0;      // from prepare_attention, else the first attention call
  std::int64_t max_lora_rank_ = 0;  // of the adapter matrices uploaded: the scratch's row
  CastCopy cast_;
  gguf::TensorType matmul_type_ = gguf::TensorType::bf16;  // of the weights matmuls read
};

}  // namespace troupe::gpu
