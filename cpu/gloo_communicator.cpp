#include "cpu/gloo_communicator.hpp"

#include <dlfcn.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce_ring.h>
#include <gloo/alltoall.h>
#include <gloo/gather.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

namespace {

// On unless TROUPE_GLOO_KEEP_SNDBUF is set (to compare without rebuilding).
std::atomic<bool> send_buffer_fix{std::getenv("TROUPE_GLOO_KEEP_SNDBUF") == nullptr};

// TROUPE_GLOO_LINK_DELAY_US: an emulated link's one-way delay (benchmarks; 0: none).
std::chrono::microseconds link_delay() {
  static const std::chrono::microseconds delay = [] {
    const char* text = std::getenv("TROUPE_GLOO_LINK_DELAY_US");
    if (text == nullptr) return std::chrono::microseconds{0};
    char* end = nullptr;
    const long long us = std::strtoll(text, &end, 10);
    return std::chrono::microseconds{end != text && *end == '\0' && us > 0 ? us : 0};
  }();
  return delay;
}

// TROUPE_GLOO_LINK_DELAY_SCOPE=between-nodes: the delay spares groups within a node (a
// pipeline stage's tensor-parallel ranks), as a network between machines would.
bool delay_between_nodes_only() {
  static const bool between = [] {
    const char* text = std::getenv("TROUPE_GLOO_LINK_DELAY_SCOPE");
    return text != nullptr && std::string(text) == "between-nodes";
  }();
  return between;
}

// Whether code at `address` is Gloo's: only its SO_SNDBUF calls are ignored.
bool is_gloo_code(void* address) {
  Dl_info info;
  return dladdr(address, &info) != 0 && info.dli_fname != nullptr &&
         std::strstr(info.dli_fname, "libgloo") != nullptr;
}

}  // namespace

// Interposes the C library's setsockopt for the whole process (an executable's definition
// comes first in the dynamic linker's search); everything but Gloo's SO_SNDBUF goes
// through to the kernel unchanged.
extern "C" int setsockopt(int fd, int level, int name, const void* value,
                          socklen_t length) noexcept {
  if (level == SOL_SOCKET && name == SO_SNDBUF && send_buffer_fix.load(std::memory_order_relaxed) &&
      is_gloo_code(__builtin_return_address(0))) {
    return 0;  // keep the kernel's autotuned send buffer
  }
  return static_cast<int>(syscall(SYS_setsockopt, fd, level, name, value, length));
}

namespace troupe::cpu {

namespace {

// Gloo's rendezvous over troupe's store; Gloo wants exceptions for failures.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(model::RendezvousStore& store, std::string prefix, std::chrono::milliseconds timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    if (auto done = store_.set(prefix_ + key, data); !done) fail(done.error());
  }
  std::vector<char> get(const std::string& key) override {
    auto value = store_.get(prefix_ + key, timeout_);
    if (!value) fail(value.error());
    return std::move(*value);
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    for (const auto& key : keys) {
      if (auto value = store_.get(prefix_ + key, timeout); !value) fail(value.error());
    }
  }
  // Whether a failure was a wait for another rank that ran out.
  bool timed_out() const { return timed_out_; }

 private:
  [[noreturn]] void fail(const Error& error) {
    timed_out_ = timed_out_ || error.code == ErrorCode::timed_out;
    throw std::runtime_error("rendezvous: " + error.message);
  }
  bool timed_out_ = false;

  model::RendezvousStore& store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

// Runs a collective: refused once the group is broken; a Gloo failure (an exception:
// a timeout, a peer gone) breaks it for good.
template <class Body>
Result<void> guarded(std::string& failure, std::int32_t rank, const char* what, Body&& body) {
  if (!failure.empty()) {
    return make_error(ErrorCode::unavailable, "the group is broken: " + failure);
  }
  try {
    body();
  } catch (const std::exception& e) {
    failure = e.what();
    return make_error(ErrorCode::unavailable,
                      "rank " + std::to_string(rank) + "'s " + what + " failed: " + failure);
  }
  return {};
}

// out[i] = parts[0][i] + parts[1][i] + ... in rank order (rank r's part at r * stride).
void add_in_rank_order(const float* parts, std::size_t stride, std::int32_t ranks, std::size_t n,
                       float* out) {
  std::copy_n(parts, n, out);
  for (std::int32_t r = 1; r < ranks; ++r) {
    const float* part = parts + r * stride;
    for (std::size_t i = 0; i < n; ++i) out[i] += part[i];
  }
}

// Up to this many bytes, or with two ranks, one all-gather of whole buffers sends no more
// than a reduce-scatter and an all-gather would, in one round trip instead of two.
constexpr std::size_t kGatherSumBytes = 64 * 1024;

}  // namespace

struct GlooCommunicator::Impl {
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::chrono::milliseconds timeout;
  std::vector<float> send, received, owned, gathered;  // scratch, kept between steps
  std::vector<float> stamped;          // a point-to-point message and its send time (link delay)
  std::chrono::microseconds delay{0};  // the emulated link's (benchmarks), 0: none
  // The benchmark's Gloo ring, set up for one buffer.
  std::unique_ptr<gloo::AllreduceRing<float>> ring;
  const float* ring_data = nullptr;
  std::size_t ring_size = 0;
};

void set_gloo_send_buffer_fix(bool on) {
  send_buffer_fix.store(on, std::memory_order_relaxed);
}

GlooCommunicator::GlooCommunicator(std::int32_t rank, std::int32_t size, std::unique_ptr<Impl> impl)
    : rank_(rank), size_(size), impl_(std::move(impl)) {}

GlooCommunicator::~GlooCommunicator() = default;

Result<std::unique_ptr<GlooCommunicator>> GlooCommunicator::connect(model::RendezvousStore& store,
                                                                    std::int32_t rank,
                                                                    std::int32_t size,
                                                                    const GlooOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return make_error(ErrorCode::invalid_argument,
                      "rank " + std::to_string(rank) + " of a group of " + std::to_string(size));
  }
  auto impl = std::make_unique<Impl>();
  impl->timeout = options.timeout;
  impl->delay = options.within_node && delay_between_nodes_only() ? std::chrono::microseconds{0}
                                                                  : link_delay();
  StoreAdapter adapter(store, options.prefix + "/", options.timeout);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.host;
    impl->device = gloo::transport::tcp::CreateDevice(attr);
    impl->context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    impl->context->setTimeout(options.timeout);
    impl->context->connectFullMesh(adapter, impl->device);
  } catch (const std::exception& e) {
    // A rank that never came (its address never set, its pair never connected) is not
    // this rank's failure: its group blames the one that did not come.
    const std::string_view what = e.what();
    // Gloo has no exception type for a timeout: a pair that never connected says "Timed out".
    const bool waited = adapter.timed_out() || what.find("Timed out") != std::string_view::npos;
    return make_error(waited ? ErrorCode::timed_out : ErrorCode::unavailable,
                      "rank " + std::to_string(rank) + " of " + std::to_string(size) +
                          " could not connect to its group: " + e.what());
  }
  return std::unique_ptr<GlooCommunicator>(new GlooCommunicator(rank, size, std::move(impl)));
}

Result<void> GlooCommunicator::all_reduce_sum(std::span<float> data) {
  return guarded(failure_, rank_, "all-reduce", [&] {
    if (size_ == 1 || data.empty()) return;
    if (size_ == 2 || data.size_bytes() <= kGatherSumBytes) {
      gather_sum(data);
    } else {
      scatter_gather_sum(data);
    }
    if (impl_->delay.count() > 0) std::this_thread::sleep_for(impl_->delay);
  });
}

Result<void> GlooCommunicator::gather(std::span<const float> part, std::span<float> gathered) {
  if (rank_ == 0 && gathered.size() != part.size() * static_cast<std::size_t>(size_)) {
    return make_error(ErrorCode::invalid_argument, "a gather needs room for every rank's part");
  }
  return guarded(failure_, rank_, "gather", [&] {
    if (size_ == 1) {
      std::copy(part.begin(), part.end(), gathered.begin());
      return;
    }
    gloo::GatherOptions options(impl_->context);
    // Gloo's API takes a mutable pointer; a gather only reads the input.
    options.setInput(const_cast<float*>(part.data()), part.size());
    if (rank_ == 0) options.setOutput(gathered.data(), gathered.size());
    options.setRoot(0);
    options.setTimeout(impl_->timeout);
    gloo::gather(options);
    if (impl_->delay.count() > 0) std::this_thread::sleep_for(impl_->delay);
  });
}

namespace {

// The slot of point-to-point messages: a prefix none of Gloo's collectives use, and the
// message's length as the tag. A receive then matches only a send of its own size: a peer
// out of step (another step's message) leaves it waiting until the timeout, a clean error,
// where Gloo's transport would end the process on a message longer than the buffer.
// (Messages of one size still match in the order they were sent: a worker out of step with
// its group stops stepping, worker::Worker.) The tag is 32 bits: a length's high bits are
// folded in.
constexpr std::uint8_t kPointToPointSlotPrefix = 0x70;

gloo::Slot point_to_point_slot(std::size_t num_floats) {
  const auto n = static_cast<std::uint64_t>(num_floats);
  return gloo::Slot::build(kPointToPointSlotPrefix, static_cast<std::uint32_t>(n ^ (n >> 32)));
}

// With an emulated link delay a message carries its send time (the steady clock's
// nanoseconds, the same clock for every process of the host) in two more floats' bits.
constexpr std::size_t kStampFloats = 2;
static_assert(kStampFloats * sizeof(float) == sizeof(std::int64_t));

}  // namespace

Result<void> GlooCommunicator::send(std::span<const float> data, std::int32_t peer) {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return make_error(ErrorCode::invalid_argument,
                      "rank " + std::to_string(rank_) + " cannot send to rank " +
                          std::to_string(peer) + " of " + std::to_string(size_));
  }
  return guarded(failure_, rank_, "send", [&] {
    if (data.empty()) return;
    std::span<const float> message = data;
    if (impl_->delay.count() > 0) {
      auto& stamped = impl_->stamped;
      stamped.assign(data.begin(), data.end());
      stamped.resize(data.size() + kStampFloats);
      const std::int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
      std::memcpy(stamped.data() + data.size(), &now, sizeof now);
      message = stamped;
    }
    // Gloo's API takes a mutable pointer; a send only reads it.
    auto buffer = impl_->context->createUnboundBuffer(const_cast<float*>(message.data()),
                                                      message.size_bytes());
    buffer->send(peer, point_to_point_slot(message.size()));
    if (!buffer->waitSend(impl_->timeout)) throw std::runtime_error("the send was aborted");
  });
}

Result<void> GlooCommunicator::recv(std::span<float> data, std::int32_t peer) {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return make_error(ErrorCode::invalid_argument,
                      "rank " + std::to_string(rank_) + " cannot receive from rank " +
                          std::to_string(peer) + " of " + std::to_string(size_));
  }
  return guarded(failure_, rank_, "receive", [&] {
    if (data.empty()) return;
    const bool delayed = impl_->delay.count() > 0;
    auto& stamped = impl_->stamped;
    if (delayed) stamped.resize(data.size() + kStampFloats);
    std::span<float> message = delayed ? std::span<float>(stamped) : data;
    auto buffer = impl_->context->createUnboundBuffer(message.data(), message.size_bytes());
    buffer->recv(peer, point_to_point_slot(message.size()));
    if (!buffer->waitRecv(impl_->timeout)) throw std::runtime_error("the receive was aborted");
    if (delayed) {
      std::copy_n(stamped.data(), data.size(), data.data());
      std::int64_t sent = 0;
      std::memcpy(&sent, stamped.data() + data.size(), sizeof sent);
      std::this_thread::sleep_until(
          std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(sent)) +
          impl_->delay);
    }
  });
}

Result<void> GlooCommunicator::gloo_ring_all_reduce(std::span<float> data) {
  return guarded(failure_, rank_, "Gloo ring all-reduce", [&] {
    auto& ring = impl_->ring;
    if (ring == nullptr || impl_->ring_data != data.data() || impl_->ring_size != data.size()) {
      ring = std::make_unique<gloo::AllreduceRing<float>>(
          impl_->context, std::vector<float*>{data.data()}, static_cast<int>(data.size()));
      impl_->ring_data = data.data();
      impl_->ring_size = data.size();
    }
    ring->run();
  });
}

// Every rank gets every rank's buffer and adds them up in rank order.
void GlooCommunicator::gather_sum(std::span<float> data) {
  const std::size_t n = data.size();
  auto& gathered = impl_->gathered;
  gathered.resize(n * size_);
  gloo::AllgatherOptions gather(impl_->context);
  gather.setInput(data.data(), n);
  gather.setOutput(gathered.data(), gathered.size());
  gather.setTimeout(impl_->timeout);
  gloo::allgather(gather);
  add_in_rank_order(gathered.data(), n, size_, n, data.data());
}

// Rank r owns chunk r: it receives every rank's part of it (all-to-all), adds them in rank
// order, and the owners' sums are gathered by all.
void GlooCommunicator::scatter_gather_sum(std::span<float> data) {
  const std::size_t n = data.size();
  const std::size_t chunk = (n + size_ - 1) / size_;
  auto& send = impl_->send;
  auto& received = impl_->received;
  auto& owned = impl_->owned;
  auto& gathered = impl_->gathered;
  send.assign(chunk * size_, 0.0f);
  std::copy_n(data.data(), n, send.data());
  received.resize(chunk * size_);
  gloo::AlltoallOptions exchange(impl_->context);
  exchange.setInput(send.data(), send.size());
  exchange.setOutput(received.data(), received.size());
  exchange.setTimeout(impl_->timeout);
  gloo::alltoall(exchange);
  owned.resize(chunk);
  add_in_rank_order(received.data(), chunk, size_, chunk, owned.data());
  gathered.resize(chunk * size_);
  gloo::AllgatherOptions gather(impl_->context);
  gather.setInput(owned.data(), chunk);
  gather.setOutput(gathered.data(), gathered.size());
  gather.setTimeout(impl_->timeout);
  gloo::allgather(gather);
  std::copy_n(gathered.data(), n, data.data());
}

}  // namespace troupe::cpu
