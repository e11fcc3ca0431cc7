// The head's registry in this process: a node on which no worker can be spawned leaves
// the cluster, and the replica waits at the head of the queue for the next node. (Here
// every spawn fails at once; that a slow spawn no longer holds the registry is not shown.)
#include <catch2/catch.hpp>

#include "actors/cluster/registry_actor.hpp"

using namespace troupe;
using namespace std::chrono_literals;
namespace cluster = actors::cluster;

TEST_CASE("a node that cannot spawn a worker leaves, and the replica tries the next node",
          "[actors][cluster]") {
  caf::actor_system_config config;
  actors::add_message_types(config);
  cluster::add_cluster_types(config);
  cluster::load_middleman(config, {});
  caf::actor_system system{config};
  auto registry =
      system.spawn<caf::detached>(cluster::registry, std::string("token"), nullptr, nullptr);
  caf::scoped_actor self{system};
  auto keeper =
      system.spawn([](caf::event_based_actor*) -> caf::behavior { return {[](std::int32_t) {}}; });
  // Nodes that are this process: no node process serves a spawn by name here, so each
  // spawn fails (as on a node that went away before it was dropped).
  auto join = [&](const std::string& name) {
    cluster::NodeInfo info;
    info.name = name;
    info.token = "token";
    info.num_cores = 2;
    info.device = "cpu";
    self->request(registry, 5s, cluster::join_atom::value, info, caf::actor(keeper))
        .receive([](const cluster::JoinReply& r) { CHECK(r.accepted); },
                 [](const caf::error& e) { FAIL(to_string(e)); });
  };
  auto nodes_left_soon = [&] {
    std::vector<cluster::NodeView> nodes;
    for (int i = 0; i < 100; ++i) {
      self->request(registry, 2s, cluster::nodes_atom::value)
          .receive(
              [&](const std::vector<cluster::NodeView>& n) { nodes = n; },
              [](const caf::error& e) { FAIL("the registry did not answer: " << to_string(e)); });
      if (nodes.empty()) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  };
  join("n0");
  self->send(registry, cluster::place_atom::value, std::int32_t{0}, std::int32_t{1});
  CHECK(nodes_left_soon());
  // The replica waited for the next node, and tried it.
  join("n1");
  CHECK(nodes_left_soon());
  self->send_exit(registry, caf::exit_reason::kill);
  self->send_exit(keeper, caf::exit_reason::kill);
}
