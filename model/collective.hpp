// What the ranks of a tensor-parallel group share: a communicator that sums a buffer
// over the group (and passes a pipeline's hidden states from stage to stage), and the key-value
// store the ranks meet through to connect. The CPU implementation is Gloo (cpu/gloo_communicator),
// the GPU's NCCL; the stores are in model/rendezvous_stores.hpp, and the head's actors are one
// across processes (actors/).
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "troupe/result.hpp"

namespace troupe::model {

// One rank's end of a group. Not thread-safe: one step at a time calls it.
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual std::int32_t rank() const = 0;
  virtual std::int32_t size() const = 0;
  // data = the sum of data over the ranks, added element by element in rank order
  // (rank 0's value, plus rank 1's, ...), so every rank holds the same bits and no element
  // depends on how many others there are (the batch). A collective that fails or does not
  // finish within the group's timeout is an error, and every later call fails at once:
  // the group must be formed again.
  virtual Result<void> all_reduce_sum(std::span<float> data) = 0;
  // Rank 0's `gathered` = every rank's `part`, one after the other in rank order
  // ([size, part.size()]); the others pass an empty `gathered`. Fails as all_reduce_sum.
  virtual Result<void> gather(std::span<const float> part, std::span<float> gathered) = 0;
  // Point to point, as a pipeline's stages pass hidden states on: `data` to rank `peer`,
  // and `data` filled from rank `peer`. Each send is matched by the peer's recv of the same
  // size, in the order they were made. Fails as all_reduce_sum (a timeout breaks the group).
  virtual Result<void> send(std::span<const float> data, std::int32_t peer) {
    (void)data, (void)peer;
    return make_error(ErrorCode::unsupported, "this communicator has no point-to-point send");
  }
  virtual Result<void> recv(std::span<float> data, std::int32_t peer) {
    (void)data, (void)peer;
    return make_error(ErrorCode::unsupported, "this communicator has no point-to-point recv");
  }
  // Takes now what all-reduces of up to `max_all_reduce` floats and gathers of parts of up
  // to `max_gather_part` floats will need, and connects the ranks for both, so that memory
  // sized after it (a GPU's KV pool) leaves them room. Every rank calls it with the same
  // sizes, at the same point. Gloo keeps its buffers in host memory: nothing to do there.
  virtual Result<void> reserve(std::size_t max_all_reduce, std::size_t max_gather_part) {
    (void)max_all_reduce;
    (void)max_gather_part;
    return {};
  }
};

// A key-value store for the ranks' rendezvous: each rank sets its address under its own
// key and reads the others'.
class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;

  virtual Result<void> set(const std::string& key, const std::vector<char>& value) = 0;
  // Waits until `key` is set, or fails after `timeout`.
  virtual Result<std::vector<char>> get(const std::string& key,
                                        std::chrono::milliseconds timeout) = 0;
};

}  // namespace troupe::model
