// The CPU ranks' communicator: Gloo over TCP (Debian's libgloo-dev). Its all-reduce adds
// every element in rank order (an all-gather, or an all-to-all then an all-gather of the
// owners' sums), so the result is the same bits on every rank and for every batch.
//
// Gloo's TCP pairs size SO_SNDBUF from their first message, a tiny one, which turns off
// the kernel's send-buffer autotuning: all-reduces of 64 KB and more then stall on
// delayed ACKs (../shared/STACK.md measured 1 MB at 90 ms). This library interposes
// setsockopt() so that Gloo's SO_SNDBUF calls are ignored (set_gloo_send_buffer_fix).
//
// For benchmarks only: TROUPE_GLOO_LINK_DELAY_US=d (microseconds) emulates a link with that
// one-way delay where `tc netem` cannot run (a kernel without queueing disciplines, as
// here). A point-to-point message carries its send time and is not received before
// send time + d; a collective returns d after it completes (two ranks that enter together
// exchange once: one one-way delay). Every process of a group must be given the same d.
// TROUPE_GLOO_LINK_DELAY_SCOPE=between-nodes spares groups within a node
// (GlooOptions::within_node: a pipeline stage's ranks), as PP x TP across machines has it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "model/collective.hpp"

namespace troupe::cpu {

struct GlooOptions {
  std::string host = "127.0.0.1";  // the address this rank's peers reach it on
  std::string prefix = "tp";       // the group's keys in the store: one per formation
  // A rendezvous or collective that takes longer fails (and the group with it).
  std::chrono::milliseconds timeout{30000};
  // Its ranks share a node (a pipeline stage's group): only an emulated link delay reads it.
  bool within_node = false;
};

class GlooCommunicator final : public model::Communicator {
 public:
  // Connects rank `rank` of `size` to the others through `store` (every rank calls it;
  // it returns when all are connected, or fails after the timeout).
  static Result<std::unique_ptr<GlooCommunicator>> connect(model::RendezvousStore& store,
                                                           std::int32_t rank, std::int32_t size,
                                                           const GlooOptions& options);
  ~GlooCommunicator() override;

  std::int32_t rank() const override { return rank_; }
  std::int32_t size() const override { return size_; }
  Result<void> all_reduce_sum(std::span<float> data) override;
  Result<void> gather(std::span<const float> part, std::span<float> gathered) override;
  // Gloo's unbound buffers on the pair to `peer`, one slot for every message: a pair
  // delivers in order.
  Result<void> send(std::span<const float> data, std::int32_t peer) override;
  Result<void> recv(std::span<float> data, std::int32_t peer) override;
  // Gloo's classic ring all-reduce (gloo::AllreduceRing, pinned buffers, set up again when
  // `data` changes), whose order of addition depends on the buffer's size (so not
  // batch-invariant beyond two ranks): the benchmark's point of comparison.
  Result<void> gloo_ring_all_reduce(std::span<float> data);

 private:
  struct Impl;
  GlooCommunicator(std::int32_t rank, std::int32_t size, std::unique_ptr<Impl> impl);
  void gather_sum(std::span<float> data);
  void scatter_gather_sum(std::span<float> data);

  std::int32_t rank_;
  std::int32_t size_;
  std::unique_ptr<Impl> impl_;
  std::string failure_;  // why the group broke, once it has
};

// Whether Gloo's SO_SNDBUF calls are ignored (default: yes, unless the environment sets
// TROUPE_GLOO_KEEP_SNDBUF). Off only to measure the difference: it applies to the calls
// Gloo makes after it changes.
void set_gloo_send_buffer_fix(bool on);

}  // namespace troupe::cpu
