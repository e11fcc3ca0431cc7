// The CPU backend: every Backend op on float32 activations, multithreaded over
// a ThreadPool, with weights used in place from the memory-mapped file.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "cpu/int8_matmul.hpp"
#include "cpu/int8_repack.hpp"
#include "cpu/op_profile.hpp"
#include "cpu/thread_pool.hpp"
#include "model/backend.hpp"

namespace troupe::cpu {

class CpuBackend final : public model::Backend {
 public:
  // num_threads <= 0: one per hardware thread.
  explicit CpuBackend(int num_threads = 0);
  // Runs its ops on `pool`, which another backend may share where the two never run at
  // once (a draft model's beside its model's): one set of threads, no second set spinning
  // or waking up between the two models' passes.
  explicit CpuBackend(std::shared_ptr<ThreadPool> pool);
  ~CpuBackend() override;

  const std::shared_ptr<ThreadPool>& thread_pool() const { return pool_holder_; }

  int num_threads() const { return pool_.num_threads(); }
  std::string describe() const override;

  Result<model::Weight> load_weight(const gguf::GgufTensorInfo& info) override;
  Result<model::Tensor> allocate(std::int64_t rows, std::int64_t cols) override;
  void release(model::Tensor tensor) override;
  Result<void> allocate_kv_cache(const model::KvCacheShape& shape) override;
  const model::KvCacheShape& kv_cache_shape() const override { return kv_shape_; }

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
  void attention(std::int32_t layer, model::Tensor q, const model::AttentionParams& params,
                 model::Tensor out) override;
  void swiglu(model::Tensor gate, model::Tensor up, model::Tensor out) override;
  void add(model::Tensor x, model::Tensor y) override;
  void add_bias(model::Tensor x, const model::Weight& bias) override;
  void gelu_tanh_gate(model::Tensor gate, model::Tensor up, model::Tensor out) override;
  void scale(model::Tensor x, float factor) override;
  void softcap(model::Tensor x, float cap) override;
  // cpu_backend_moe.cpp
  void moe_ffn(model::Tensor x, const model::MoeLayer& layer, model::Tensor out) override;
  // cpu_backend_lora.cpp
  Result<void> supports_lora() const override { return {}; }
  void lora_add(model::Tensor x, std::span<const model::LoraGroup> groups,
                model::Tensor y) override;
  void gather_logit_rows(model::Tensor x, model::Tensor out) override;
  Result<void> read(model::Tensor tensor, std::span<float> host) override;
  Result<void> supports_pipeline_stage() const override { return {}; }
  Result<void> write(std::span<const float> host, model::Tensor tensor) override;
  Result<void> join_group(std::shared_ptr<model::Communicator> group) override;
  void all_reduce(model::Tensor x) override;
  void gather_columns(model::Tensor part, model::Tensor whole) override;
  // The group told its largest collectives (Gloo's buffers are host memory: the KV budget
  // is configured, not what is left).
  Result<void> prepare_collectives(std::int64_t max_all_reduce,
                                   std::int64_t max_gather_part) override;
  double all_reduce_seconds() const override { return all_reduce_seconds_; }

  // Times every op into `profile` from now on (null: stops); the caller keeps it alive.
  void set_profile(OpProfile* profile) { profile_ = profile; }

 private:
  // Runs one of the step's collectives (skipped once one failed), timing it; false when
  // it failed (the step then fails at end_step).
  bool run_collective(const std::function<Result<void>()>& collective);
  // One KV head's part of a block: keys [head_dim][block_size] (transposed),
  // values [block_size][head_dim], in kv_shape_.dtype.
  std::byte* kv_block(std::vector<std::byte>& cache, std::int32_t layer, std::int32_t block,
                      std::int32_t kv_head);

  // A weight this backend loaded, its rows repacked for the repacked int8 kernel
  // (int8_repack.hpp): made on its first product and kept while the backend lives, as the
  // model's bytes are. Null where its type or width has no repacked layout, this processor no
  // repacked kernel, or the weight was not loaded here (a caller's own). Every product of a
  // weight runs the same kernel, so a row's result never depends on the batch.
  const RepackedWeight* repacked(const model::Weight& weight);

  // An op's timer: nothing unless profiling (the name is made only then).
  template <typename Name>
  OpTimer time_op(Name&& name, double macs = 0.0, double weight_bytes = 0.0) const {
    if (profile_ == nullptr) return OpTimer();
    return OpTimer(profile_, std::string(name()), macs, weight_bytes);
  }

  OpProfile* profile_ = nullptr;
  std::shared_ptr<ThreadPool> pool_holder_;
  ThreadPool& pool_;
  struct Packing {
    bool tried = false;      // repacked (or failed to) on a first product
    bool looked_up = false;  // also an embedding table (tied output): keep its pages
    std::unique_ptr<RepackedWeight> packed;  // null: the file's layout
  };
  // The loaded matrices that have a repacked layout, by their data.
  std::unordered_map<const void*, Packing> repacked_;
  model::KvCacheShape kv_shape_;
  // [num_layers, num_blocks, num_kv_heads, head_dim, block_size] (keys) and
  // [num_layers, num_blocks, num_kv_heads, block_size, head_dim] (values), F32 or F16
  std::vector<std::byte> k_cache_, v_cache_;
  const model::StepInput* step_ = nullptr;
  std::vector<std::int32_t> token_seq_;  // [num_tokens] the sequence each flat row belongs to
  Int8RowBuffer int8_rows_;              // activations quantized for the int8 kernels, reused
  std::shared_ptr<model::Communicator> group_;
  std::optional<Error> step_error_;  // the step's first failed collective
  double all_reduce_seconds_ = 0.0;
  std::vector<float> gathered_;  // [size, rows, part cols] on rank 0
  // moe_ffn's buffers, reused: n rows, k experts each, num experts.
  struct MoeScratch {
    std::vector<float> logits;                  // [n, num] the router's
    std::vector<std::int32_t> experts;          // [n, k] each row's, in the order chosen
    std::vector<float> weights;                 // [n, k] theirs
    std::vector<std::int64_t> begin;            // [num + 1] expert e's first slot
    std::vector<std::int64_t> slot;             // [n * k] (row, choice) -> slot
    std::vector<std::int64_t> slot_row;         // [n * k] slot -> row
    std::vector<float> xs, gate, up, ys;        // [n * k, dim | ffn] by expert (xs: float experts)
    Int8RowBuffer xs_int8, gate_int8;           // xs and the activated gate, for the int8 kernels
    std::vector<std::int32_t> loaded;           // the experts with rows, the most rows first
    std::vector<const RepackedWeight*> packed;  // [num, 3] gate, up, down repacked, or null
  };
  // moe_ffn's experts over the `total` gathered (row, choice) slots of x.
  void moe_experts_int8(model::Tensor x, const model::MoeLayer& layer, std::int64_t total,
                        std::int64_t ffn);
  void moe_experts_each(model::Tensor x, const model::MoeLayer& layer, std::int64_t total,
                        std::int64_t ffn);
  MoeScratch moe_;
};

}  // namespace troupe::cpu
