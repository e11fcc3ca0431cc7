// The GPU ranks' communicator: NCCL. Rank 0 makes the group's unique id and sets it in
// the rendezvous store (the head's actors in a cluster); the others read it. Like the CPU
// ranks' Gloo, its all-reduce adds every element in rank order (an all-gather into
// [ranks, n], then rank 0's part plus rank 1's, ...): the same bits on every rank and for
// every batch.
//
// Its collectives are enqueued on the stream the backend binds, and return at once. NCCL
// has no timeout of its own: the backend waits for its stream through synchronize(),
// which aborts the communicator when a collective has not finished within the group's
// timeout (a rank that died or hangs), so that no rank waits forever.
//
// Built where the CUDA toolkit has NCCL (TROUPE_HAVE_NCCL). It has not yet run on a GPU.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "model/collective.hpp"

namespace troupe::gpu {

class NcclCommunicator final : public model::Communicator {
 public:
  // Connects rank `rank` of `size` on CUDA device `device` (every rank calls it; it
  // returns when all have joined, or fails after `timeout`).
  static Result<std::unique_ptr<NcclCommunicator>> connect(model::RendezvousStore& store,
                                                           std::int32_t rank, std::int32_t size,
                                                           int device, const std::string& prefix,
                                                           std::chrono::milliseconds timeout);
  ~NcclCommunicator() override;

  std::int32_t rank() const override { return rank_; }
  std::int32_t size() const override { return size_; }
  // `data` in device memory; enqueued on the bound stream.
  Result<void> all_reduce_sum(std::span<float> data) override;
  // `part` and `gathered` in device memory; enqueued on the bound stream.
  Result<void> gather(std::span<const float> part, std::span<float> gathered) override;
  // Allocates the all-reduce's [size, n] scratch at its largest, and runs an all-gather at
  // that size and a one-float gather so that NCCL makes its connections and their buffers
  // now; then waits for them, as long as a load may take (the other ranks may still be
  // loading their shards).
  Result<void> reserve(std::size_t max_all_reduce, std::size_t max_gather_part) override;

  // The stream the collectives run on (a cudaStream_t): the backend's.
  void bind_stream(void* stream) { stream_ = stream; }
  // Waits for the bound stream; fails (and aborts the communicator for good) on an NCCL
  // error or when it has not finished within the timeout.
  Result<void> synchronize();
  // How long reserve()'s first collective may wait for the other ranks: a load's length.
  static constexpr std::chrono::minutes kFirstCollectiveTimeout{10};

 private:
  struct Impl;
  NcclCommunicator(std::int32_t rank, std::int32_t size, std::chrono::milliseconds timeout,
                   std::unique_ptr<Impl> impl);
  Result<void> enqueued(int result, const char* what);
  Result<void> synchronize(std::chrono::milliseconds within);
  // The all-reduce's scratch holds [size, n] floats (grown, never shrunk).
  Result<void> reserve_gathered(std::size_t n);
  Result<void> broken() const;

  std::int32_t rank_;
  std::int32_t size_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<Impl> impl_;
  void* stream_ = nullptr;
  std::string failure_;      // why the group broke, once it has
  bool waited_out_ = false;  // it broke on a wait for the others (ErrorCode::timed_out)
};

}  // namespace troupe::gpu
