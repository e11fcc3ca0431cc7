// The router actor in front of stand-in replicas that answer as told: what it counts
// when many requests arrive at once.
#include <atomic>
#include <catch2/catch.hpp>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "actors/parallel/router_actor.hpp"
#include "actors/replica/replica_start.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using actors::replica_actor;

namespace {

struct StandInState {
  std::int32_t cached_prefix_tokens = 0;  // of every prompt, under adapter slot `adapter`
  std::int32_t adapter = 0;
  std::int64_t num_received = 0;  // all still waiting: none ever ends
  bool probed = false;
  actors::front_actor router;
  std::int32_t index = 0;
  std::shared_ptr<std::atomic<int>> left;    // set once the router let it leave
  std::shared_ptr<std::atomic<int>> probes;  // set: down (no worker), counting its probes
  static inline const char* name = "test.stand_in_replica";
};

replica_actor::behavior_type stand_in(replica_actor::stateful_pointer<StandInState> self,
                                      std::int32_t cached_prefix_tokens, std::int32_t adapter = 0) {
  self->state.cached_prefix_tokens = cached_prefix_tokens;
  self->state.adapter = adapter;
  return {
      [self](actors::submit_atom, const actors::Submission&) { ++self->state.num_received; },
      [](actors::abort_atom, RequestId, FinishReason) {},
      [](actors::stats_atom) { return EngineStats{}; },
      [](actors::replicas_atom) { return std::vector<ReplicaStats>{ReplicaStats{}}; },
      [self](actors::probe_atom, const std::vector<TokenId>&, std::int32_t adapter) {
        auto& s = self->state;
        // The first answer is late: every request of the burst reaches the router, and
        // is probed, before the first is routed.
        if (!std::exchange(s.probed, true)) std::this_thread::sleep_for(50ms);
        const auto waiting = static_cast<std::int32_t>(s.num_received);
        const std::int32_t cached = adapter == s.adapter ? s.cached_prefix_tokens : 0;
        if (s.probes) ++*s.probes;
        return actors::ReplicaProbe{!s.probes, waiting, 0, 0.0, cached, s.num_received};
      },
      [self](actors::router_atom, const actors::front_actor& router) {
        self->state.router = router;
      },
      [](actors::supplied_atom, const actors::SupplyNews&) {},
      [](actors::lora_atom, std::int32_t, const std::string&) { return std::string(); },
      [self](actors::drain_atom, const std::string&, std::int64_t) {
        // Told to drain, it leaves as an elastic replica does (worker_keeping.cpp).
        self->request(caf::actor_cast<caf::actor>(self->state.router), 5s,
                      actors::leave_atom::value, self->state.index)
            .then([self](bool ok) {
              if (self->state.left) self->state.left->store(ok ? 1 : -1);
            });
      },
      [](actors::timeout_atom, std::uint64_t) {},
  };
}

// A stand-in that knows its index, and says when the router let it leave.
replica_actor::behavior_type leaving_stand_in(replica_actor::stateful_pointer<StandInState> self,
                                              std::int32_t index,
                                              std::shared_ptr<std::atomic<int>> left) {
  self->state.index = index;
  self->state.left = std::move(left);
  return stand_in(self, 0, 0);
}

// A stand-in whose worker is lost: it says it is down, and counts the probes.
replica_actor::behavior_type down_stand_in(replica_actor::stateful_pointer<StandInState> self,
                                           std::shared_ptr<std::atomic<int>> probes) {
  self->state.probes = std::move(probes);
  return stand_in(self, 0, 0);
}

// Elastic replicas with no nodes: the test hears each supply asked for and tells its news
// (placed, loaded) as a node would; a replica that loads is a stand-in.
class StandInFactory : public actors::ReplicaFactory {
 public:
  StandInFactory() : ReplicaFactory(EngineConfig{}, actors::ReplicaStart{}) {}

  void supply(caf::actor_system&, std::int32_t index, caf::actor_addr,
              std::function<void(actors::SupplyNews)> news) const override {
    std::lock_guard lock(mutex_);
    asked_.push_back(index);
    news_[index] = std::move(news);
  }
  actors::StartedReplica make(caf::actor_system& system, std::int32_t index,
                              actors::SupplyNews) const override {
    actors::StartedReplica started;
    started.scheduler = system.spawn(leaving_stand_in, index, nullptr);
    return started;
  }

  std::vector<std::int32_t> asked() const {
    std::lock_guard lock(mutex_);
    return asked_;
  }
  // Supply `index`'s news, as its actor would send it.
  void tell(std::int32_t index, actors::SupplyNews::Stage stage, const std::string& node) const {
    std::function<void(actors::SupplyNews)> news;
    {
      std::lock_guard lock(mutex_);
      news = news_.at(index);
    }
    actors::SupplyNews n;
    n.stage = stage;
    n.nodes = {node};
    news(std::move(n));
  }

 private:
  mutable std::mutex mutex_;
  mutable std::vector<std::int32_t> asked_;
  mutable std::map<std::int32_t, std::function<void(actors::SupplyNews)>> news_;
};

}  // namespace

TEST_CASE("a burst is routed by what the router sent, not only by what replicas have seen",
          "[actors][data_parallel]") {
  caf::actor_system_config config;
  actors::add_message_types(config);
  caf::actor_system system{config};
  // Replica 0 holds the burst's prefix; replica 1 holds none.
  std::vector<replica_actor> replicas{system.spawn(stand_in, 16, 0), system.spawn(stand_in, 0, 0)};
  engine::RouterConfig routing;
  routing.policy = RoutingPolicy::prefix;
  routing.max_load_gap = 2;
  auto router = system.spawn(actors::parallel::router, replicas, routing, caf::timespan{0});
  for (RequestId id = 1; id <= 8; ++id) {
    actors::Submission s;
    s.id = id;
    s.prompt = std::vector<TokenId>(20, 5);
    caf::anon_send(router, actors::submit_atom::value, std::move(s));
  }
  caf::scoped_actor self{system};
  std::vector<ReplicaStats> stats;
  for (int i = 0; i < 200; ++i) {
    self->request(router, 5s, actors::replicas_atom::value)
        .receive([&](const std::vector<ReplicaStats>& s) { stats = s; },
                 [&](const caf::error& e) { FAIL(to_string(e)); });
    if (stats.size() == 2 && stats[0].num_routed + stats[1].num_routed == 8) break;
    std::this_thread::sleep_for(10ms);
  }
  REQUIRE(stats.size() == 2);
  // Counted as it goes, the holder takes requests while it carries at most 2 more than
  // the other: 5 and 3. By the replicas' answers alone (all given before the first
  // arrived) all eight would have gone to the holder.
  CHECK(stats[0].num_routed == 5);
  CHECK(stats[1].num_routed == 3);
  CHECK(stats[0].num_prefix_routed == 5);
  self->send_exit(router, caf::exit_reason::kill);
}

TEST_CASE("the prefix probe is by LoRA adapter: a prefix under one never draws another's request",
          "[actors][data_parallel][lora]") {
  caf::actor_system_config config;
  actors::add_message_types(config);
  caf::actor_system system{config};
  // The same prompt cached on both replicas, under adapter 2 on replica 0 and adapter 1 on
  // replica 1: each adapter's requests go where their own prefix is.
  std::vector<replica_actor> replicas{system.spawn(stand_in, 16, 2), system.spawn(stand_in, 16, 1)};
  engine::RouterConfig routing;
  routing.policy = RoutingPolicy::prefix;
  routing.max_load_gap = 100;
  auto router = system.spawn(actors::parallel::router, replicas, routing, caf::timespan{0});
  for (RequestId id = 1; id <= 4; ++id) {
    actors::Submission s;
    s.id = id;
    s.prompt = std::vector<TokenId>(20, 5);
    s.adapter = id <= 3 ? 1 : 2;  // three for adapter 1, one for adapter 2
    caf::anon_send(router, actors::submit_atom::value, std::move(s));
  }
  caf::scoped_actor self{system};
  std::vector<ReplicaStats> stats;
  for (int i = 0; i < 200; ++i) {
    self->request(router, 5s, actors::replicas_atom::value)
        .receive([&](const std::vector<ReplicaStats>& s) { stats = s; },
                 [&](const caf::error& e) { FAIL(to_string(e)); });
    if (stats.size() == 2 && stats[0].num_routed + stats[1].num_routed == 4) break;
    std::this_thread::sleep_for(10ms);
  }
  REQUIRE(stats.size() == 2);
  CHECK(stats[0].num_routed == 1);
  CHECK(stats[1].num_routed == 3);
  CHECK(stats[0].num_prefix_routed == 1);
  CHECK(stats[1].num_prefix_routed == 3);
  self->send_exit(router, caf::exit_reason::kill);
}

TEST_CASE("an elastic replica that leaves is sent nothing more, and the count follows",
          "[actors][data_parallel][elastic]") {
  caf::actor_system_config config;
  actors::add_message_types(config);
  caf::actor_system system{config};
  auto left = std::make_shared<std::atomic<int>>(0);
  std::vector<replica_actor> replicas{system.spawn(leaving_stand_in, 0, nullptr),
                                      system.spawn(leaving_stand_in, 1, left)};
  actors::parallel::ElasticSetup elastic;  // no factory: none grows here
  elastic.min = 1;
  elastic.max = 2;
  elastic.count = std::make_shared<std::atomic<std::int32_t>>(0);
  const auto count = elastic.count;
  engine::RouterConfig routing;
  routing.policy = RoutingPolicy::round_robin;
  auto router =
      system.spawn(actors::parallel::elastic_router, replicas, routing, caf::timespan{0}, elastic);
  caf::scoped_actor self{system};
  const auto eventually = [](auto done) {
    for (int i = 0; i < 200 && !done(); ++i) std::this_thread::sleep_for(10ms);
    return done();
  };
  CHECK(eventually([&] { return count->load() == 2; }));
  // Its node drains: it asks the router to let it go.
  self->send(replicas[1], actors::drain_atom::value, std::string("n1"), std::int64_t{0});
  REQUIRE(eventually([&] { return left->load() != 0; }));
  CHECK(left->load() == 1);
  CHECK(count->load() == 1);
  // A stranger cannot make a replica leave.
  bool refused = false;
  self->request(router, 5s, actors::leave_atom::value, std::int32_t{0})
      .receive([&](bool ok) { refused = !ok; }, [&](const caf::error& e) { FAIL(to_string(e)); });
  CHECK(refused);
  for (RequestId id = 1; id <= 4; ++id) {
    actors::Submission s;
    s.id = id;
    s.prompt = std::vector<TokenId>(4, 5);
    caf::anon_send(router, actors::submit_atom::value, std::move(s));
  }
  std::vector<ReplicaStats> stats;
  CHECK(eventually([&] {
    self->request(router, 5s, actors::replicas_atom::value)
        .receive([&](const std::vector<ReplicaStats>& s) { stats = s; },
                 [&](const caf::error& e) { FAIL(to_string(e)); });
    return stats.size() == 1 && stats[0].num_routed == 4;
  }));
  REQUIRE(stats.size() == 1);  // the replicas there now
  CHECK(stats[0].index == 0);
  CHECK(count->load() == 1);
  self->send_exit(router, caf::exit_reason::kill);
}

TEST_CASE("a moved request waiting for a replica when the engine shuts down ends, saying why",
          "[actors][data_parallel][failover]") {
  caf::actor_system_config config;
  actors::add_message_types(config);
  caf::actor_system system{config};
  auto probes = std::make_shared<std::atomic<int>>(0);
  std::vector<replica_actor> replicas{system.spawn(down_stand_in, probes)};
  auto router = system.spawn(actors::parallel::router, replicas, engine::RouterConfig{},
                             caf::timespan{std::chrono::seconds(60)});
  auto ended = std::make_shared<std::promise<engine::RequestEvent>>();
  auto requester = system.spawn([ended](actors::request_actor::pointer) {
    return actors::request_actor::behavior_type{
        [ended](actors::token_atom, const engine::RequestEvent& e) {
          if (e.finish_reason != FinishReason::none) ended->set_value(e);
        },
        [](actors::timeout_atom) {},
    };
  });
  auto end = ended->get_future();
  // Handed back by a replica that lost its worker, with the tokens it streamed.
  actors::Submission s;
  s.id = 7;
  s.prompt = {1, 2, 3};
  s.resumed = {4, 5};
  s.moved = true;
  s.requester = requester;
  caf::anon_send(router, actors::submit_atom::value, std::move(s));
  // No replica is up: it is probed, waits 250 ms and is probed again. Just after that
  // second answer it waits for its next retry: the engine shuts down then.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (probes->load() < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  REQUIRE(probes->load() >= 2);
  std::this_thread::sleep_for(50ms);
  caf::anon_send_exit(router, caf::exit_reason::user_shutdown);
  REQUIRE(end.wait_for(10s) == std::future_status::ready);
  const engine::RequestEvent e = end.get();
  CHECK(e.id == 7);
  CHECK(e.finish_reason == FinishReason::abort);
  CHECK(e.error == "the engine is shutting down");
  caf::anon_send_exit(requester, caf::exit_reason::kill);
}

TEST_CASE("an elastic router asks for the next replica as soon as one is placed, not loaded",
          "[actors][data_parallel][elastic]") {
  caf::actor_system_config config;
  actors::add_message_types(config);
  caf::actor_system system{config};
  auto factory = std::make_shared<StandInFactory>();
  actors::parallel::ElasticSetup elastic;
  elastic.factory = factory;
  elastic.min = 1;
  elastic.max = 3;
  elastic.count = std::make_shared<std::atomic<std::int32_t>>(0);
  const auto count = elastic.count;
  std::vector<replica_actor> replicas{system.spawn(leaving_stand_in, 0, nullptr)};
  auto router = system.spawn(actors::parallel::elastic_router, replicas, engine::RouterConfig{},
                             caf::timespan{0}, elastic);
  // Ended whatever fails (its replicas end with it).
  const std::shared_ptr<void> end_router(
      nullptr, [router](void*) { caf::anon_send_exit(router, caf::exit_reason::kill); });
  caf::scoped_actor self{system};
  const auto eventually = [](auto done) {
    for (int i = 0; i < 500 && !done(); ++i) std::this_thread::sleep_for(10ms);
    return done();
  };
  // The router has handled everything sent to it before this.
  const auto settled = [&] {
    self->request(router, 5s, actors::replicas_atom::value)
        .receive([](const std::vector<ReplicaStats>&) {},
                 [](const caf::error& e) { FAIL(to_string(e)); });
  };
  using Stage = actors::SupplyNews::Stage;
  using Asked = std::vector<std::int32_t>;
  REQUIRE(eventually([&] { return factory->asked() == Asked{1}; }));
  // Replica 1 is placed on n1 and loads there; a node that joins meanwhile must find
  // replica 2 waiting for it, not wait for that load.
  factory->tell(1, Stage::placed, "n1");
  settled();
  REQUIRE(factory->asked() == Asked{1, 2});
  // Two loading and one there make the maximum: no fourth is asked for.
  factory->tell(2, Stage::placed, "n2");
  settled();
  CHECK(factory->asked() == Asked{1, 2});
  factory->tell(2, Stage::loaded, "n2");
  factory->tell(1, Stage::loaded, "n1");
  CHECK(eventually([&] { return count->load() == 3; }));
  settled();
  CHECK(factory->asked() == Asked{1, 2});
}
