// The step events hub: the JSON a viewer gets, and a slow viewer losing its oldest
// events (counted) instead of holding the publisher.
#include "monitoring/step_events.hpp"

#include <atomic>
#include <catch2/catch.hpp>
#include <limits>
#include <thread>

using namespace troupe;
using monitoring::StepEvent;
using monitoring::StepEvents;

namespace {

StepEvent numbered(std::uint64_t step) {
  StepEvent e;
  e.step = step;
  return e;
}

}  // namespace

TEST_CASE("a step event renders as one JSON object with every field", "[monitoring]") {
  StepEvent e;
  e.replica = 1;
  e.step = 812;
  e.time_ms = 1764700000123.4;
  e.step_ms = 3.25;
  e.round_trip_ms = 3.9;
  e.num_prefill_tokens = 8;
  e.num_decode_tokens = 1;
  e.num_generated_tokens = 2;
  e.batch = {{17, 8, true}, {12, 1, false}};
  e.first_tokens = {{17, 12.5}};
  e.finished = {{12, "length"}};
  e.num_running = 4;
  e.num_waiting = 1;
  e.kv_usage = 0.25;
  e.num_kv_blocks = 128;
  e.prefix_hit_tokens = 120;
  e.prefix_queried_tokens = 400;
  e.num_preemptions = 2;
  CHECK(monitoring::render_step_event(e) ==
        R"({"type":"step","replica":1,"step":812,"time_ms":1764700000123.400,)"
        R"("step_ms":3.250,"round_trip_ms":3.900,"prefill_tokens":8,"decode_tokens":1,)"
        R"("generated_tokens":2,)"
        R"("batch":[{"id":17,"prefill":8},{"id":12,"decode":1}],)"
        R"("first_tokens":[{"id":17,"ttft_ms":12.500}],"finished":[{"id":12,"reason":"length"}],)"
        R"("running":4,"waiting":1,"kv_usage":0.25000,"kv_blocks":128,)"
        R"("prefix_hit_tokens":120,"prefix_queried_tokens":400,"preemptions":2})");
  SECTION("a decode with a draft says how many tokens it proposed and how many were accepted") {
    e.batch = {{12, 5, false, 4, 3}, {13, 1, false}};
    e.num_decode_tokens = 6;
    e.num_drafted_tokens = 4;
    e.num_accepted_tokens = 3;
    const std::string text = monitoring::render_step_event(e);
    CHECK(text.find(R"("generated_tokens":2,"drafted_tokens":4,"accepted_tokens":3,)") !=
          std::string::npos);
    CHECK(text.find(
              R"("batch":[{"id":12,"decode":5,"drafted":4,"accepted":3},{"id":13,"decode":1}])") !=
          std::string::npos);
  }
  SECTION("an idle step has empty lists, and a number that is not one is 0") {
    StepEvent idle;
    idle.step_ms = std::numeric_limits<double>::quiet_NaN();
    const std::string text = monitoring::render_step_event(idle);
    CHECK(text.find(R"("batch":[],"first_tokens":[],"finished":[])") != std::string::npos);
    CHECK(text.find(R"("step_ms":0.000)") != std::string::npos);
  }
}

TEST_CASE("no one watches until a viewer comes, and none after it goes", "[monitoring]") {
  StepEvents events;
  CHECK_FALSE(events.watched());
  events.publish(numbered(1));  // nothing to do, nowhere to go
  auto viewer = events.watch(8, {});
  CHECK(events.watched());
  events.publish(numbered(2));
  std::int64_t dropped = -1;
  const auto got = viewer->take(dropped);
  REQUIRE(got.size() == 1);
  CHECK(got[0]->find(R"("step":2,)") != std::string::npos);
  CHECK(dropped == 0);
  events.unwatch(viewer);
  CHECK_FALSE(events.watched());
}

TEST_CASE("a viewer that reads too slowly loses its oldest events and is told how many",
          "[monitoring]") {
  StepEvents events;
  int num_wakes = 0;
  auto slow = events.watch(4, [&] { ++num_wakes; });
  auto quick = events.watch(64, {});
  for (std::uint64_t step = 1; step <= 10; ++step) events.publish(numbered(step));
  // The bell rang once: when the first event came into an empty queue.
  CHECK(num_wakes == 1);
  std::int64_t dropped = 0;
  const auto kept = slow->take(dropped);
  CHECK(dropped == 6);
  REQUIRE(kept.size() == 4);
  CHECK(kept.front()->find(R"("step":7,)") != std::string::npos);
  CHECK(kept.back()->find(R"("step":10,)") != std::string::npos);
  // The other viewer lost nothing: each has its own queue.
  CHECK(quick->take(dropped).size() == 10);
  CHECK(dropped == 0);
  // Taken, the count starts again, and the next event rings again.
  events.publish(numbered(11));
  CHECK(num_wakes == 2);
  CHECK(slow->take(dropped).size() == 1);
  CHECK(dropped == 0);
}

// The step number in a rendered event.
static std::uint64_t step_of(const std::string& event) {
  const auto at = event.find(R"("step":)") + 7;
  return std::stoull(event.substr(at, event.find(',', at) - at));
}

TEST_CASE("viewers come and go while steps are published from another thread", "[monitoring]") {
  StepEvents events;
  std::atomic<bool> done{false};
  std::thread publisher([&] {
    for (std::uint64_t step = 1; !done.load(); ++step) events.publish(numbered(step));
  });
  // Whatever a viewer misses, it is told: each event follows the one before it, or the
  // ones dropped between them.
  int num_gaps = 0;
  std::int64_t num_seen = 0;
  for (int i = 0; i < 100; ++i) {
    auto viewer = events.watch(16, [] {});
    std::uint64_t last = 0;
    for (int round = 0; round < 5; ++round) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      std::int64_t dropped = 0;
      for (const auto& event : viewer->take(dropped)) {
        const std::uint64_t step = step_of(*event);
        if (last != 0) {
          if (step != last + static_cast<std::uint64_t>(dropped) + 1) ++num_gaps;
        }
        dropped = 0;
        last = step;
        ++num_seen;
      }
    }
    events.unwatch(viewer);
  }
  done = true;
  publisher.join();
  CHECK_FALSE(events.watched());
  CHECK(num_gaps == 0);
  CHECK(num_seen > 0);
}
