#include "gpu/nccl_communicator.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstdlib>
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
  // `waited`: the other ranks did not come in time (their group blames them, not this one).
  auto fail = [&](const std::string& why, bool waited = false) {
    return make_error(waited ? ErrorCode::timed_out : ErrorCode::unavailable,
                      "rank " + std::to_string(rank) + " of " + std::to_string(size) +
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
    auto bytes = store.get(key, timeout);
    if (!bytes) return fail(bytes.error().message, bytes.error().code == ErrorCode::timed_out);
    if (bytes->size() != sizeof(id)) return fail("rank 0's unique id has the wrong size");
    std::memcpy(&id, bytes->data(), sizeof(id));
  }
  // Non-blocking, so that a rank that never comes is a timeout, not a hang.
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  // Every connection made at init, not lazily per algorithm at a first large collective
  // (NCCL 2.22+), when the KV pool may already hold the memory (unless the user says).
  ::setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
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
    if (ready == ncclInProgress) {
      return fail("the other ranks did not join within " + std::to_string(timeout.count()) + " ms",
                  true);
    }
    return fail(describe(ready));
  }
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(rank, size, timeout, std::move(impl)));
}

Result<void> NcclCommunicator::broken() const {
  if (failure_.empty()) return {};
  return make_error(waited_out_ ? ErrorCode::timed_out : ErrorCode::unavailable,
                    "the tensor-parallel group is broken: " + failure_);
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
  const std::size_t n = std::max<std::size_t>(max_all_reduce, 2);
  TROUPE_TRY_VOID(reserve_gathered(n));
  float* scratch = impl_->gathered;
  const auto size = static_cast<std::size_t>(size_);
  auto stream = static_cast<cudaStream_t>(stream_);
  if (cudaMemsetAsync(scratch, 0, n * size * sizeof(float), stream) != cudaSuccess) {
    return make_error(ErrorCode::internal,
                      std::string("CUDA: ") + cudaGetErrorString(cudaGetLastError()));
  }
  // An all-gather at its largest, in place (this rank's part at scratch + rank * n, as an
  // in-place all-gather's input must be), so that NCCL picks the algorithm large steps use.
  TROUPE_TRY_VOID(
      enqueued(ncclAllGather(scratch + rank_ * n, scratch, n, ncclFloat, impl_->comm, stream),
               "all-gather"));
  // A gather of one float each (its point-to-point links) from the second part into the first.
  const std::span<float> into = rank_ == 0 ? std::span<float>(scratch, size) : std::span<float>();
  TROUPE_TRY_VOID(gather({scratch + size + rank_, 1}, into));
  // The ranks load their shards at their own pace (a cold disk, a larger shard): this first
  // collective waits as long as a load may take, not a step's collective timeout.
  return synchronize(kFirstCollectiveTimeout);
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
  return synchronize(timeout_);
}

Result<void> NcclCommunicator::synchronize(std::chrono::milliseconds within) {
  TROUPE_TRY_VOID(broken());
  auto stream = static_cast<cudaStream_t>(stream_);
  const auto deadline = Clock::now() + within;
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
      failure_ = "a collective did not finish within " + std::to_string(within.count()) +
                 " ms (a rank is gone or stuck)";
      waited_out_ = true;
      impl_->abort();
      return broken();
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace troupe::gpu
