// The engine's iterations as they happen, for whoever watches (the live page's timeline,
// GET /v1/engine/events): each replica's scheduler publishes one event per step, and each
// viewer takes them from its own bounded queue. Publishing costs one relaxed load when no
// one watches; a viewer that reads too slowly loses its oldest events (counted), so a
// step never waits on a viewer.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::monitoring {

// One iteration of one replica: a plain value, rendered once for every viewer.
struct StepEvent {
  struct Entry {
    std::uint64_t id = 0;  // the engine's request id
    std::int32_t num_tokens = 0;
    bool prefill = false;  // a prompt chunk; else one decode token
    // Speculative decoding: of num_tokens, the proposed ones, and of those the accepted.
    std::int32_t drafted = 0;
    std::int32_t accepted = 0;
  };
  struct FirstToken {
    std::uint64_t id = 0;
    double ttft_ms = 0.0;  // from the engine taking the request to its first token
  };
  struct Finished {
    std::uint64_t id = 0;
    std::string_view reason;  // "stop", "length", "abort", "error" (static strings)
  };

  std::int32_t replica = 0;
  std::uint64_t step = 0;
  double time_ms = 0.0;  // Unix time at the step's end
  double step_ms = 0.0;  // the worker's compute
  double round_trip_ms = 0.0;
  std::int32_t num_prefill_tokens = 0;
  std::int32_t num_decode_tokens = 0;
  // Tokens sampled: the decodes', and each first token from a prompt's last chunk (a
  // one-token chunk counts as a decode above when it samples: a prompt the prefix cache
  // held but for its last token).
  std::int32_t num_generated_tokens = 0;
  std::int32_t num_drafted_tokens = 0;   // proposed tokens verified (in num_decode_tokens)
  std::int32_t num_accepted_tokens = 0;  // of which accepted
  std::vector<Entry> batch;
  std::vector<FirstToken> first_tokens;
  std::vector<Finished> finished;
  std::int32_t num_running = 0;
  std::int32_t num_waiting = 0;
  double kv_usage = 0.0;  // of num_kv_blocks, 0..1
  std::int32_t num_kv_blocks = 0;
  // Since the replica started:
  std::int64_t prefix_hit_tokens = 0;
  std::int64_t prefix_queried_tokens = 0;
  std::int64_t num_preemptions = 0;
};

// The event as the stream carries it: one JSON object, without the viewer's "dropped".
std::string render_step_event(const StepEvent& event);

class StepEvents {
 public:
  // One viewer's queue. `wake` is called (from the publishing thread, without blocking)
  // when an event arrives in an empty queue; the viewer then takes what is there.
  class Viewer {
   public:
    Viewer(std::size_t capacity, std::function<void()> wake);
    // The queued events, oldest first; `dropped` gets how many were lost before them.
    std::vector<std::shared_ptr<const std::string>> take(std::int64_t& dropped);

   private:
    friend class StepEvents;
    void push(const std::shared_ptr<const std::string>& event);

    const std::size_t capacity_;
    std::function<void()> wake_;
    std::mutex mutex_;
    std::deque<std::shared_ptr<const std::string>> queue_;
    std::int64_t dropped_ = 0;
  };

  // Whether anyone watches: the scheduler builds no event otherwise.
  bool watched() const noexcept { return num_viewers_.load(std::memory_order_relaxed) != 0; }
  void publish(const StepEvent& event);

  // A viewer with room for `capacity` events; it watches until `unwatch`. `wake` must not
  // block and must stay callable until `unwatch` returns.
  std::shared_ptr<Viewer> watch(std::size_t capacity, std::function<void()> wake);
  void unwatch(const std::shared_ptr<Viewer>& viewer);

 private:
  std::atomic<int> num_viewers_{0};
  std::mutex mutex_;
  std::vector<std::shared_ptr<Viewer>> viewers_;
};

}  // namespace troupe::monitoring
