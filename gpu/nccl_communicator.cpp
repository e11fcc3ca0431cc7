#include "gpu/nccl_communicator.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "gpu/kernels.hpp"

namespace troupe::gpu {

namespace {

using Clock = std::chrono::steady_clock;

// Polls a non-blocking communicator until what it is doing is done (ncclSuccess), has
// failed, or the deadline passes (ncclInProgress).
ncclResult_t wait_ready(ncclComm_t comm, Clock::time_point deadline) {
  while (true) {
    ncclResult_t state = ncclInProgress;
    if (const ncclResult_t asked = ncclCommGetAsyncError(comm, &state); asked != ncclSuccess) {
      return asked;
    }
    if (state != ncclInProgress || Clock::now() > deadline) return state;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

std::string describe(ncclResult_t result) {
  return ncclGetErrorString(result);
}

}  // namespace

struct NcclCommunicator::Impl {
  ncclComm_t comm = nullptr;
  int device = 0;
  bool aborted = false;
  float* gathered = nullptr;  // [size, n] scratch for the all-reduce
  std::size_t gathered_floats = 0;

  // Ends the communicator at once, unblocking what waits on its collectives.
  void abort() {
    if (comm != nullptr && !aborted) ncclCommAbort(comm);
    aborted = true;
  }
};

NcclCommunicator::NcclCommunicator(std::int32_t rank, std::int32_t size,
                                   std::chrono::milliseconds timeout, std::unique_ptr<Impl> impl)
    : rank_(rank), size_(size), timeout_(timeout), impl_(std::move(impl)) {}

NcclCommunicator::~NcclCommunicator() {
  if (impl_->comm != nullptr && !impl_->aborted) {
    // A clean end when the peers are there; an abort when they are not.
    const ncclResult_t finalized = ncclCommFinalize(impl_->comm);
    if ((finalized == ncclSuccess || finalized == ncclInProgress) &&
        wait_ready(impl_->comm, Clock::now() + std::chrono::seconds(5)) == ncclSuccess) {
      ncclCommDestroy(impl_->comm);
    } else {
      impl_->abort();
    }
  }
  if (impl_->gathered != nullptr) cudaFree(impl_->gathered);
}

Result<std::unique_ptr<NcclCommunicator>> NcclCommunicator::connect(
    model::RendezvousStore& store, std::int32_t rank, std::int32_t size, int device,
    const std::string& prefix, std::chrono::milliseconds timeout) {
  if (size < 1 || rank < 0 || rank >= size) {
    return make_error(ErrorCode::invalid_argument,
                      "rank " + std::to_string(rank) + " of a group of " + std::to_string(size));
  }
  auto fail = [&](const std::string& why) {
    return make_error(ErrorCode::unavailable, "rank " + std::to_string(rank) + " of " +
                                                  std::to_string(size) +
                                                  " could not join its NCCL group: " + why);
  };
  if (cudaSetDevice(device) != cudaSuccess) return fail("no CUDA device " + std::to_string(device));
  // Rank 0's unique id reaches the others through the store.
  ncclUniqueId id;
  const std::string key = prefix + "/nccl-id";
  if (rank == 0) {
    if (const ncclResult_t made = ncclGetUniqueId(&id); made != ncclSuccess) {
      return fail(describe(made));
    }
    std::vector<char> bytes(sizeof(id));
    std::memcpy(bytes.data(), &id, sizeof(id));
    TROUPE_TRY_VOID(store.set(key, bytes));
  } else {
    TROUPE_TRY(const auto bytes, store.get(key, timeout));
    if (bytes.size() != sizeof(id)) return fail("rank 0's unique id has the wrong size");
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  // Non-blocking, so that a rank that never comes is a timeout, not a hang.
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t started = ncclCommInitRankConfig(&impl->comm, size, id, rank, &config);
  if (started != ncclSuccess && started != ncclInProgress) {
    impl->abort();  // whatever it made goes
    return fail(describe(started));
  }
  const ncclResult_t ready = wait_ready(impl->comm, Clock::now() + timeout);
  if (ready != ncclSuccess) {
    impl->abort();
    return fail(ready == ncclInProgress ? "the other ranks did not join within " +
                                              std::to_string(timeout.count()) + " ms"
                                        : describe(ready));
  }
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(rank, size, timeout, std::move(impl)));
}

Result<void> NcclCommunicator::broken() const {
  if (failure_.empty()) return {};
  return make_error(ErrorCode::unavailable, "the tensor-parallel group is broken: " + failure_);
}

Result<void> NcclCommunicator::enqueued(int code, const char* what) {
  auto result = static_cast<ncclResult_t>(code);
  if (result == ncclInProgress) result = wait_ready(impl_->comm, Clock::now() + timeout_);
  if (result == ncclSuccess) return {};
  failure_ = std::string(what) + ": " +
             (result == ncclInProgress ? "not enqueued within the timeout" : describe(result));
  impl_->abort();
  return broken();
}

Result<void> NcclCommunicator::all_reduce_sum(std::span<float> data) {
  TROUPE_TRY_VOID(broken());
  const std::size_t n = data.size();
  if (n == 0) return {};
  auto stream = static_cast<cudaStream_t>(stream_);
  TROUPE_TRY_VOID(reserve_gathered(n));
  TROUPE_TRY_VOID(
      enqueued(ncclAllGather(data.data(), impl_->gathered, n, ncclFloat, impl_->comm, stream),
               "all-gather"));
  // Rank 0's part, plus rank 1's, ...: the same order on every rank.
  cudaMemcpyAsync(data.data(), impl_->gathered, n * sizeof(float), cudaMemcpyDeviceToDevice,
                  stream);
  for (std::int32_t r = 1; r < size_; ++r) {
    kernels::add(data.data(), impl_->gathered + r * n, static_cast<std::int64_t>(n), stream);
  }
  return {};
}

Result<void> NcclCommunicator::reserve_gathered(std::size_t n) {
  const std::size_t floats = n * static_cast<std::size_t>(size_);
  if (impl_->gathered_floats >= floats) return {};
  // cudaFree waits for the device: no queued all-gather still writes the old buffer.
  if (impl_->gathered != nullptr) cudaFree(impl_->gathered);
  impl_->gathered = nullptr;
  impl_->gathered_floats = 0;
  if (cudaMalloc(&impl_->gathered, floats * sizeof(float)) != cudaSuccess) {
    cudaGetLastError();  // not sticky
    return make_error(ErrorCode::out_of_range,
                      "out of GPU memory for an all-reduce of " + std::to_string(n) + " floats");
  }
  impl_->gathered_floats = floats;
  return {};
}

Result<void> NcclCommunicator::reserve(std::size_t max_all_reduce, std::size_t max_gather_part) {
  TROUPE_TRY_VOID(broken());
  (void)max_gather_part;  // a gather's buffers are its caller's
  // At least two floats per rank: the warm-up collectives below run in the scratch.
  TROUPE_TRY_VOID(reserve_gathered(std::max<std::size_t>(max_all_reduce, 2)));
  float* scratch = impl_->gathered;
  const auto size = static_cast<std::size_t>(size_);
  auto stream = static_cast<cudaStream_t>(stream_);
  cudaMemsetAsync(scratch, 0, 2 * size * sizeof(float), stream);
  // In place: this rank's float is at scratch[rank], as an all-gather's input may be.
  TROUPE_TRY_VOID(enqueued(
      ncclAllGather(scratch + rank_, scratch, 1, ncclFloat, impl_->comm, stream), "all-gather"));
  // A gather of one float each from the second half into the first.
  const std::span<float> into = rank_ == 0 ? std::span<float>(scratch, size) : std::span<float>();
  TROUPE_TRY_VOID(gather({scratch + size + rank_, 1}, into));
  return synchronize();
}

Result<void> NcclCommunicator::gather(std::span<const float> part, std::span<float> gathered) {
  TROUPE_TRY_VOID(broken());
  const std::size_t n = part.size();
  if (rank_ == 0 && gathered.size() != n * static_cast<std::size_t>(size_)) {
    return make_error(ErrorCode::invalid_argument, "a gather needs room for every rank's part");
  }
  auto stream = static_cast<cudaStream_t>(stream_);
  if (rank_ == 0) {
    cudaMemcpyAsync(gathered.data(), part.data(), n * sizeof(float), cudaMemcpyDeviceToDevice,
                    stream);
  }
  if (const ncclResult_t began = ncclGroupStart(); began != ncclSuccess) {
    return enqueued(began, "gather");
  }
  ncclResult_t queued = ncclSuccess;
  if (rank_ == 0) {
    for (std::int32_t r = 1; r < size_ && queued == ncclSuccess; ++r) {
      queued = ncclRecv(gathered.data() + r * n, n, ncclFloat, r, impl_->comm, stream);
    }
  } else {
    queued = ncclSend(part.data(), n, ncclFloat, 0, impl_->comm, stream);
  }
  // The group ends whatever happened inside it; its first failure is the answer.
  const ncclResult_t ended = ncclGroupEnd();
  return enqueued(queued != ncclSuccess && queued != ncclInProgress ? queued : ended, "gather");
}

Result<void> NcclCommunicator::synchronize() {
  TROUPE_TRY_VOID(broken());
  auto stream = static_cast<cudaStream_t>(stream_);
  const auto deadline = Clock::now() + timeout_;
  while (true) {
    const cudaError_t done = cudaStreamQuery(stream);
    if (done == cudaSuccess) return {};
    if (done != cudaErrorNotReady) {
      return make_error(ErrorCode::internal, std::string("CUDA: ") + cudaGetErrorString(done));
    }
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(impl_->comm, &state);
    if (state != ncclSuccess && state != ncclInProgress) {
      failure_ = "NCCL: " + describe(state);
      impl_->abort();
      return broken();
    }
    if (Clock::now() > deadline) {
      failure_ = "a collective did not finish within " + std::to_string(timeout_.count()) +
                 " ms (a rank is gone or stuck)";
      impl_->abort();
      return broken();
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace troupe::gpu
