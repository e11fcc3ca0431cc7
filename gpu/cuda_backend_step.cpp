// CudaBackend's steps: the step's arrays packed into pinned memory and uploaded, and
// decode-only steps recorded as CUDA graphs (one per batch size) and replayed.
#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "gpu/cuda_backend_impl.hpp"

namespace troupe::gpu {

void CudaBackend::invalidate_graphs() {
  for (auto& [batch, exec] : graphs_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec));
  graphs_.clear();
  warmed_.clear();
}

model::StepShape CudaBackend::step_shape(const model::StepInput& step) const {
  const std::int32_t rows = planned_rows(step, graph_policy_);
  const bool padded = rows != step.num_tokens();
  return model::StepShape{rows, padded ? rows : static_cast<std::int64_t>(step.logit_rows.size()),
                          false};
}

Result<void> CudaBackend::ensure_step_capacity(const StepLayout& l) {
  bool moved = false;
  const auto ints = [](std::size_t n) {
    return static_cast<std::int64_t>(std::max<std::size_t>(n, 1) * 4);
  };
  auto& m = *impl_;
  for (auto [buffer, bytes] : std::initializer_list<std::pair<Buffer*, std::int64_t>>{
           {&m.tokens, ints(l.tokens.size())},
           {&m.positions, ints(l.positions.size())},
           {&m.token_seq, ints(l.token_seq.size())},
           {&m.slots, ints(l.slots.size())},
           {&m.logit_rows, ints(l.logit_row_index.size())},
           {&m.decode_rows, ints(l.decode_rows.size())},
           {&m.tiles, ints(l.tiles.size() * 2)},
           // A graph's tables have room for its whole batch, whatever the step fills.
           {&m.tables,
            ints(std::max(l.block_tables.size(), static_cast<std::size_t>(l.rows) *
                                                     static_cast<std::size_t>(l.block_stride)))}}) {
    TROUPE_TRY(const bool grew, grow(*buffer, bytes));
    moved = moved || grew;
  }
  // The decode partials (reserved by prepare_attention): room for one decode row at least,
  // since attention launches the rows in chunks that fit. Heads are bounded until known.
  const std::int32_t heads =
      num_heads_ > 0 ? num_heads_ : kv_shape_.num_kv_heads * kernels::kMaxGroup;
  const std::int64_t partial_floats =
      std::max<std::int64_t>(1, decode_partial_floats(l.decode_rows.empty() ? 0 : 1, heads,
                                                      l.num_splits, kv_shape_.head_dim));
  TROUPE_TRY(const bool grew_partials, grow(m.partials, partial_floats * 4));
  // LoRA's arrays: no graph reads them (steps with adapters run eagerly), so they may move.
  if (!l.lora_slots.empty()) {
    TROUPE_TRY_VOID(grow(m.lora_slots, ints(l.lora_slots.size())));
    TROUPE_TRY_VOID(grow(m.lora_ax, 4 * static_cast<std::int64_t>(l.rows) *
                                        std::max<std::int64_t>(1, max_lora_rank_)));
  }
  const std::int64_t staging =
      4 * static_cast<std::int64_t>(l.tokens.size() * 4 + l.logit_row_index.size() +
                                    l.decode_rows.size() + l.tiles.size() * 2 +
                                    l.block_tables.size() + l.lora_slots.size()) +
      64 * 9;
  if (m.pinned_bytes < staging) {
    if (m.pinned != nullptr) cudaFreeHost(m.pinned);
    m.pinned = nullptr;
    const std::int64_t size = std::max<std::int64_t>(staging, m.pinned_bytes * 2);
    if (!check(cudaMallocHost(&m.pinned, static_cast<std::size_t>(size)), "pinned staging")) {
      m.pinned_bytes = 0;
      return status();
    }
    m.pinned_bytes = size;
  }
  if (moved || grew_partials) invalidate_graphs();
  return {};
}

Result<model::StepShape> CudaBackend::begin_step(const model::StepInput& step) {
  if (step_open_) return make_error(ErrorCode::internal, "a step began before the last one ended");
  if (!lost_) error_.clear();  // the last step's failure (not sticky) was its own
  TROUPE_TRY_VOID(status());
  if (k_cache_.data == nullptr) {
    return make_error(ErrorCode::invalid_argument, "no KV cache allocated");
  }
  // The worker's thread may not be the one that made the backend: the device is per thread.
  if (!check(cudaSetDevice(options_.device), "cudaSetDevice")) {
    return tl::make_unexpected(status().error());
  }
  // The staging buffer is reused: the previous step's uploads must have landed.
  TROUPE_TRY_VOID(synchronize());
  layout_ = plan_step(step, kv_shape_.block_size, graph_policy_);
  cast_ = CastCopy{};  // a replayed step leaves the buffer holding what its graph wrote last
  TROUPE_TRY_VOID(ensure_step_capacity(layout_));

  // Pack every array into pinned memory, then one copy each.
  auto& m = *impl_;
  auto* staging = static_cast<std::uint8_t*>(m.pinned);
  std::size_t offset = 0;
  const auto upload = [&](Buffer& buffer, const void* data, std::size_t bytes) {
    if (bytes == 0) return;
    std::memcpy(staging + offset, data, bytes);
    check(cudaMemcpyAsync(buffer.data, staging + offset, bytes, cudaMemcpyHostToDevice,
                          as_stream(stream_)),
          "step upload");
    offset += (bytes + 15) / 16 * 16;
  };
  const auto& l = layout_;
  upload(m.tokens, l.tokens.data(), l.tokens.size() * 4);
  upload(m.positions, l.positions.data(), l.positions.size() * 4);
  upload(m.token_seq, l.token_seq.data(), l.token_seq.size() * 4);
  upload(m.slots, l.slots.data(), l.slots.size() * 4);
  upload(m.logit_rows, l.logit_row_index.data(), l.logit_row_index.size() * 4);
  upload(m.decode_rows, l.decode_rows.data(), l.decode_rows.size() * 4);
  upload(m.tiles, l.tiles.data(), l.tiles.size() * sizeof(kernels::PrefillTile));
  upload(m.tables, l.block_tables.data(), l.block_tables.size() * 4);
  upload(m.lora_slots, l.lora_slots.data(), l.lora_slots.size() * 4);
  TROUPE_TRY_VOID(status());

  model::StepShape plan{
      l.rows, l.graph ? l.rows : static_cast<std::int64_t>(step.logit_rows.size()), false};
  step_open_ = true;
  capturing_ = replaying_ = false;
  if (l.graph) {
    graph_key_ = l.graph_key;
    if (graphs_.contains(graph_key_)) {
      replaying_ = true;
      plan.replay = true;
    } else if (!warmed_.contains(graph_key_)) {
      // A batch size's first step runs eagerly: cuBLAS picks its kernels and lazily loaded
      // modules load outside any capture. The next one is recorded.
      warmed_.insert(graph_key_);
    } else if (check(cudaStreamBeginCapture(as_stream(stream_), cudaStreamCaptureModeThreadLocal),
                     "graph capture")) {
      capturing_ = true;
    } else {
      step_open_ = false;
      return tl::make_unexpected(status().error());
    }
  }
  return plan;
}

Result<void> CudaBackend::end_step() {
  if (!step_open_) return status();
  step_open_ = false;
  cast_ = CastCopy{};
  if (capturing_) {
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    const bool captured = check(cudaStreamEndCapture(as_stream(stream_), &graph), "graph capture");
    if (captured && error_.empty()) {
      cudaGraphExec_t exec = nullptr;
      if (check(cudaGraphInstantiate(&exec, graph, 0), "graph instantiate")) {
        graphs_[graph_key_] = exec;
        replaying_ = true;
      }
    }
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
  if (replaying_) {
    replaying_ = false;
    const auto it = graphs_.find(graph_key_);
    if (it != graphs_.end() &&
        check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(it->second), as_stream(stream_)),
              "graph launch")) {
      ++num_replays_;
    }
  }
  check(cudaGetLastError(), "kernel launch");
  // A rank of a group that reads nothing back still finds out now whether its collectives
  // finished.
  if (nccl_ != nullptr) return synchronize();
  return status();
}

}  // namespace troupe::gpu
