// Loading workers through the actors: a tensor-parallel group's load names the rank that
// failed it, so that its scheduler avoids that rank's node (a rank that gave up waiting for
// the others is not the cause while another rank stays silent), and a load waited for from
// outside the actors ends when its worker goes. The workers here are stand-ins that answer
// as told.
#include <catch2/catch.hpp>
#include <optional>

#include "actors/parallel/group_actor.hpp"
#include "actors/replica/worker_supply.hpp"
#include "actors/worker_actor.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using actors::worker_actor;

namespace {

// Long beside an answer given at once, even on a loaded machine: the checks tell the two apart.
constexpr auto kCollectiveTimeout = 1000ms;

struct StandInState {
  std::vector<caf::typed_response_promise<engine::LoadReport>> held;  // never answered
  static inline const char* name = "test.stand_in_rank";
};

engine::LoadReport failure(ErrorCode code, std::string message) {
  engine::LoadReport report;
  report.failed = true;
  report.error = {code, std::move(message), true};
  return report;
}

// A rank whose load answers `answer`, or never when there is none.
worker_actor::behavior_type stand_in(worker_actor::stateful_pointer<StandInState> self,
                                     std::optional<engine::LoadReport> answer) {
  return {
      [](actors::load_atom, const engine::WorkerSpec&) { return engine::LoadReport{}; },
      [self, answer](actors::load_atom, const engine::WorkerSpec&,
                     const actors::GroupJoin&) -> caf::result<engine::LoadReport> {
        if (answer) return *answer;
        self->state.held.push_back(self->make_response_promise<engine::LoadReport>());
        return self->state.held.back();
      },
      [](actors::step_atom, const engine::StepWork& work) {
        return engine::failed_step(work.step_id, {ErrorCode::internal, "no steps here", true});
      },
      [](actors::lora_atom, std::int32_t, const std::string&) { return std::string("no LoRA"); },
  };
}

// A worker that goes away in the middle of its load, as a node's process killed then.
worker_actor::behavior_type vanishing(worker_actor::stateful_pointer<StandInState> self) {
  auto vanish = [self]() -> caf::result<engine::LoadReport> {
    self->state.held.push_back(self->make_response_promise<engine::LoadReport>());
    self->quit(caf::exit_reason::kill);
    return self->state.held.back();
  };
  return {
      [vanish](actors::load_atom, const engine::WorkerSpec&) { return vanish(); },
      [vanish](actors::load_atom, const engine::WorkerSpec&, const actors::GroupJoin&) {
        return vanish();
      },
      [](actors::step_atom, const engine::StepWork& work) {
        return engine::failed_step(work.step_id, {ErrorCode::internal, "no steps here", true});
      },
      [](actors::lora_atom, std::int32_t, const std::string&) { return std::string("no LoRA"); },
  };
}

struct Loaded {
  engine::LoadReport report;
  std::chrono::steady_clock::duration took{};
};

// Loads a group of two stand-ins on nodes n0 and n1.
Loaded load_group(std::optional<engine::LoadReport> rank0,
                  std::optional<engine::LoadReport> rank1) {
  caf::actor_system_config config;
  actors::add_message_types(config);
  caf::actor_system system{config};
  std::vector<worker_actor> ranks{system.spawn(stand_in, std::move(rank0)),
                                  system.spawn(stand_in, std::move(rank1))};
  auto group = system.spawn(actors::parallel::group, ranks, std::vector<std::string>{"n0", "n1"},
                            std::chrono::milliseconds(kCollectiveTimeout));
  caf::scoped_actor self{system};
  Loaded loaded;
  const auto start = std::chrono::steady_clock::now();
  self->request(group, std::chrono::seconds(10), actors::load_atom::value, engine::WorkerSpec{})
      .receive([&](const engine::LoadReport& report) { loaded.report = report; },
               [&](const caf::error& e) { FAIL("the group did not answer: " << to_string(e)); });
  loaded.took = std::chrono::steady_clock::now() - start;
  self->send_exit(group, caf::exit_reason::kill);  // its ranks end with it
  return loaded;
}

const auto kGaveUp = failure(ErrorCode::timed_out, "no rank set 'tp/1' within 1000 ms");

}  // namespace

TEST_CASE("a rank that gave up waiting is not blamed while another stays silent", "[actors][tp]") {
  const auto loaded = load_group(kGaveUp, std::nullopt);
  REQUIRE(loaded.report.failed);
  CHECK(loaded.report.failed_rank == 1);
  CHECK_THAT(loaded.report.error.message,
             Catch::StartsWith("rank 1 (node n1): it did not join its group within 1000 ms") &&
                 Catch::Contains("rank 0 (node n0) gave up on it: no rank set"));
  // Decided one collective timeout after the first rank gave up, not at the load timeout.
  CHECK(loaded.took >= kCollectiveTimeout);
  CHECK(loaded.took < 5s);
}

TEST_CASE("a rank's own failure is the group's at once, and names it", "[actors][tp]") {
  SECTION("a GPU still held by rank 0's last backend, while rank 1 is still loading") {
    const auto loaded =
        load_group(failure(ErrorCode::unavailable, "GPU 0 is still held by a backend that failed"),
                   std::nullopt);
    REQUIRE(loaded.report.failed);
    CHECK(loaded.report.failed_rank == 0);
    CHECK(loaded.took < kCollectiveTimeout);
  }
  SECTION("out of memory on rank 0 while rank 1 is still loading") {
    const auto loaded =
        load_group(failure(ErrorCode::out_of_range, "out of GPU memory"), std::nullopt);
    REQUIRE(loaded.report.failed);
    CHECK(loaded.report.failed_rank == 0);
    CHECK(loaded.report.error.message == "rank 0 (node n0): out of GPU memory");
    CHECK(loaded.took < kCollectiveTimeout);
  }
  SECTION("rank 1's corrupt file, whichever rank answered first") {
    const auto loaded = load_group(kGaveUp, failure(ErrorCode::invalid_file, "truncated"));
    REQUIRE(loaded.report.failed);
    CHECK(loaded.report.failed_rank == 1);
    CHECK(loaded.report.error.message == "rank 1 (node n1): truncated");
  }
  SECTION("both gave up: the first that did is named, once both answered") {
    const auto loaded = load_group(kGaveUp, kGaveUp);
    REQUIRE(loaded.report.failed);
    CHECK((loaded.report.failed_rank == 0 || loaded.report.failed_rank == 1));
    CHECK_THAT(loaded.report.error.message, Catch::Contains("no rank set"));
  }
  SECTION("both loaded: the group's report") {
    engine::LoadReport ok;
    ok.num_kv_blocks = 64;
    ok.device_name = "cpu";
    const auto loaded = load_group(ok, ok);
    CHECK_FALSE(loaded.report.failed);
    CHECK(loaded.report.num_kv_blocks == 64);
  }
}

// A replica's worker supply with this worker standing in for the one it would spawn.
Result<actors::SupplyNews> supply_with(caf::actor_system& system, worker_actor worker,
                                       caf::duration load_timeout) {
  actors::WorkerSource source;
  source.load_timeout = load_timeout;
  source.spawn_local = [worker](caf::actor_system&) { return worker; };
  return actors::supply_and_wait(system, source, engine::WorkerSpec{});
}

TEST_CASE("a worker supply waited for from outside the actors ends when its worker goes",
          "[actors][tp]") {
  caf::actor_system_config config;
  actors::add_message_types(config);
  caf::actor_system system{config};
  const caf::duration ten_minutes{std::chrono::minutes(10)};
  SECTION("a worker that goes while it loads: at once, not at the timeout") {
    const auto start = std::chrono::steady_clock::now();
    const auto loaded = supply_with(system, system.spawn(vanishing), ten_minutes);
    REQUIRE_FALSE(loaded.has_value());
    CHECK_THAT(loaded.error().message, Catch::StartsWith("the worker went away while it loaded"));
    CHECK(std::chrono::steady_clock::now() - start < 5s);
  }
  SECTION("a silent worker: at the timeout") {
    auto silent = system.spawn(stand_in, std::optional<engine::LoadReport>());
    // Only a group's load is held by the stand-in; a plain load it answers at once.
    const auto group =
        system.spawn(actors::parallel::group, std::vector<worker_actor>{silent},
                     std::vector<std::string>{"n0"}, std::chrono::milliseconds(kCollectiveTimeout));
    const auto loaded = supply_with(system, group, caf::duration{200ms});
    REQUIRE_FALSE(loaded.has_value());
    CHECK_THAT(loaded.error().message, Catch::Contains("timeout"));
    caf::anon_send_exit(group, caf::exit_reason::kill);
  }
  SECTION("a failed load: its error") {
    auto failing =
        system.spawn(stand_in, std::optional(failure(ErrorCode::invalid_file, "truncated")));
    const auto group =
        system.spawn(actors::parallel::group, std::vector<worker_actor>{failing},
                     std::vector<std::string>{"n0"}, std::chrono::milliseconds(kCollectiveTimeout));
    const auto loaded = supply_with(system, group, ten_minutes);
    REQUIRE_FALSE(loaded.has_value());
    CHECK(loaded.error().code == ErrorCode::invalid_file);
    CHECK(loaded.error().message == "rank 0 (node n0): truncated");
    caf::anon_send_exit(group, caf::exit_reason::kill);
  }
}

namespace {

using go_atom = caf::atom_constant<caf::atom("go")>;
constexpr auto kHeldAtMost = 5s;

// A worker whose load is answered only once `go` comes (a replica whose load takes as long
// as another's takes to start): `report` then, or a failure when `fail`. A `go` that comes
// before its own load request (the other supply was faster) counts when that request does.
// Unanswered within kHeldAtMost, it fails, saying so.
caf::behavior held_load(caf::event_based_actor* self, engine::LoadReport report, bool fail) {
  auto held = std::make_shared<std::optional<caf::response_promise>>();
  auto told_early = std::make_shared<bool>(false);
  auto answer = [report, fail](caf::response_promise& promise, bool told) {
    if (!told) {
      promise.deliver(
          failure(ErrorCode::timed_out, "no other replica was asked for while this one loaded"));
    } else {
      promise.deliver(fail ? failure(ErrorCode::invalid_file, "truncated") : report);
    }
  };
  return {
      [self, held, told_early, answer](actors::load_atom,
                                       const engine::WorkerSpec&) -> caf::response_promise {
        auto promise = self->make_response_promise();
        if (*told_early) {
          answer(promise, true);
          return promise;
        }
        *held = promise;
        self->delayed_send(self, kHeldAtMost, go_atom::value, false);
        return promise;
      },
      [held, told_early, answer](go_atom, bool told) {
        if (!*held) {
          *told_early = *told_early || told;
          return;
        }
        answer(**held, told);
        held->reset();
      },
  };
}

// A worker that loads at once, telling `other` (a held_load) to answer.
caf::behavior telling_load(caf::event_based_actor* self, caf::actor other,
                           engine::LoadReport report) {
  return {
      [self, other, report](actors::load_atom, const engine::WorkerSpec&) {
        self->send(other, go_atom::value, true);
        return report;
      },
  };
}

engine::LoadReport with_blocks(std::int32_t n) {
  engine::LoadReport report;
  report.num_kv_blocks = n;
  return report;
}

actors::WorkerSource stand_in_source(std::int32_t replica, const caf::actor& worker) {
  actors::WorkerSource source;
  source.replica = replica;
  source.spawn_local = [worker](caf::actor_system&) {
    return caf::actor_cast<worker_actor>(worker);
  };
  return source;
}

}  // namespace

TEST_CASE("a head's replicas are supplied at once: one loads while another's load is held",
          "[actors][cluster]") {
  caf::actor_system_config config;
  actors::add_message_types(config);
  caf::actor_system system{config};
  // Replica 0's load ends only once replica 1's has started: one after the other, it
  // would wait for replica 1 (and give up after kHeldAtMost).
  auto first = system.spawn(held_load, with_blocks(10), false);
  auto second = system.spawn(telling_load, first, with_blocks(11));
  const auto start = std::chrono::steady_clock::now();
  auto loaded = actors::supply_all_and_wait(
      system, {stand_in_source(0, first), stand_in_source(1, second)}, engine::WorkerSpec{});
  INFO((loaded ? std::string() : loaded.error().message));
  REQUIRE(loaded.has_value());
  REQUIRE(loaded->size() == 2);
  CHECK((*loaded)[0].report.num_kv_blocks == 10);  // in the replicas' order
  CHECK((*loaded)[1].report.num_kv_blocks == 11);
  CHECK(std::chrono::steady_clock::now() - start < kHeldAtMost);
  for (auto& n : *loaded) caf::anon_send_exit(n.worker, caf::exit_reason::kill);
}

TEST_CASE("one failed supply of a head's replicas stops the others, loaded or loading",
          "[actors][cluster]") {
  caf::actor_system_config config;
  actors::add_message_types(config);
  caf::actor_system system{config};
  // Replica 0 fails once replica 1 has loaded; replica 2's load never ends.
  auto failing = system.spawn(held_load, engine::LoadReport{}, true);
  auto loads = system.spawn(telling_load, failing, with_blocks(11));
  auto silent = system.spawn(held_load, engine::LoadReport{}, false);
  caf::scoped_actor self{system};
  self->monitor(loads);
  self->monitor(silent);
  auto loaded = actors::supply_all_and_wait(
      system, {stand_in_source(0, failing), stand_in_source(1, loads), stand_in_source(2, silent)},
      engine::WorkerSpec{});
  REQUIRE_FALSE(loaded.has_value());
  CHECK(loaded.error().code == ErrorCode::invalid_file);
  CHECK(loaded.error().message == "truncated");
  // Both other workers end: the one that loaded, and the one still loading.
  int ended = 0;
  for (int i = 0; i < 2; ++i) {
    self->receive([&](const caf::down_msg&) { ++ended; },
                  caf::after(std::chrono::seconds(5)) >> [] {});
  }
  CHECK(ended == 2);
}
