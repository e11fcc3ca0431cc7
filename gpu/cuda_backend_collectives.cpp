// CudaBackend as a rank of a tensor-parallel group: NCCL's all-reduce and column gather on
// the backend's stream.
#include "gpu/cuda_backend_impl.hpp"

#ifdef TROUPE_HAVE_NCCL
#include "gpu/nccl_communicator.hpp"
#endif

namespace troupe::gpu {

using model::Tensor;

Result<void> CudaBackend::join_group(std::shared_ptr<model::Communicator> group) {
  select_device();
#ifdef TROUPE_HAVE_NCCL
  auto* nccl = dynamic_cast<NcclCommunicator*>(group.get());
  if (nccl == nullptr) {
    return make_error(ErrorCode::unsupported, "a CUDA rank needs an NCCL communicator");
  }
  nccl->bind_stream(stream_);
  group_ = std::move(group);
  nccl_ = nccl;
  // NCCL calls stay out of recorded graphs: every step runs eagerly.
  graph_policy_.enabled = false;
  invalidate_graphs();
  return {};
#else
  (void)group;
  return make_error(ErrorCode::unsupported,
                    "this troupe was built without NCCL, which CUDA ranks of a group need");
#endif
}

void CudaBackend::all_reduce(Tensor x) {
  TROUPE_ASSERT(group_ != nullptr, "all_reduce on a backend that joined no group");
  wrote(x);
  if (!error_.empty()) return;
  auto summed = group_->all_reduce_sum({x.data, static_cast<std::size_t>(x.rows * x.cols)});
  if (!summed) error_ = summed.error().message;
}

Result<void> CudaBackend::grow_gathered(std::int64_t bytes) {
  if (gathered_bytes_ >= bytes) return {};
  if (gathered_ != nullptr) {
    // The old buffer may still be read by this step's queued work: a bounded wait.
    TROUPE_TRY_VOID(synchronize());
    cudaFree(gathered_);
    bytes_in_use_ -= gathered_bytes_;
    gathered_ = nullptr;
    gathered_bytes_ = 0;
  }
  TROUPE_TRY(gathered_, device_alloc(bytes));
  gathered_bytes_ = bytes;
  return {};
}

Result<void> CudaBackend::prepare_collectives(std::int64_t max_all_reduce,
                                              std::int64_t max_gather_part) {
  if (group_ == nullptr) return {};
  select_device();
  TROUPE_TRY_VOID(status());
  if (group_->rank() == 0 && max_gather_part > 0) {
    TROUPE_TRY_VOID(grow_gathered(max_gather_part * group_->size() * 4));
  }
  // reserve() sizes the group's scratch and runs a first collective of each kind, and waits
  // for them. A failure here fails the model's load: the group is formed again with the next
  // backend.
  return group_->reserve(static_cast<std::size_t>(max_all_reduce),
                         static_cast<std::size_t>(max_gather_part));
}

void CudaBackend::gather_columns(Tensor part, Tensor whole) {
  TROUPE_ASSERT(group_ != nullptr, "gather_columns on a backend that joined no group");
  if (!error_.empty()) return;
  const auto size = static_cast<std::int64_t>(group_->size());
  const std::int64_t n = part.rows * part.cols;
  const bool root = group_->rank() == 0;
  if (root) {
    wrote(whole);
    TROUPE_ASSERT(whole.cols == part.cols * size && whole.rows >= part.rows,
                  "gather_columns: the whole has the wrong shape");
  }
  if (root) {
    if (auto grown = grow_gathered(n * size * 4); !grown) {
      if (error_.empty()) error_ = grown.error().message;
      return;
    }
  }
  auto* gathered = static_cast<float*>(gathered_);
  auto done = group_->gather({part.data, static_cast<std::size_t>(n)},
                             {gathered, root ? static_cast<std::size_t>(n * size) : 0});
  if (!done) {
    error_ = done.error().message;
    return;
  }
  if (!root) return;
  // Rank r's [rows, part.cols] into columns [r * part.cols, ...) of every row.
  for (std::int64_t r = 0; r < size; ++r) {
    check(cudaMemcpy2DAsync(whole.data + r * part.cols, whole.cols * 4, gathered + r * n,
                            part.cols * 4, part.cols * 4, part.rows, cudaMemcpyDeviceToDevice,
                            as_stream(stream_)),
          "gather columns");
  }
}

}  // namespace troupe::gpu
