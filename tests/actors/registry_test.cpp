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
  self->send(registry, cluster::place_atom::value, std::int32_t{0}, std::int32_t{1},
             std::int32_t{0});
  CHECK(nodes_left_soon());
  // The replica waited for the next node, and tried it.
  join("n1");
  CHECK(nodes_left_soon());
  self->send_exit(registry, caf::exit_reason::kill);
  self->send_exit(keeper, caf::exit_reason::kill);
}

namespace {

// `count` free CPU nodes of `slots` slots each (2 cores, 2 / slots threads a worker).
std::map<caf::node_id, cluster::RegistryState::Node> free_nodes(int count, int slots) {
  std::map<caf::node_id, cluster::RegistryState::Node> nodes;
  for (int i = 0; i < count; ++i) {
    cluster::RegistryState::Node node;
    node.info.name = "n" + std::to_string(i);
    node.info.num_cores = 2;
    node.info.num_threads = 2 / slots;
    node.info.device = "cpu";
    // Node ids differ by process id only, as processes on one host do.
    const auto id = caf::make_node_id(static_cast<std::uint32_t>(100 + i),
                                      "0123456789abcdef0123456789abcdef01234567");
    REQUIRE(id);
    nodes[*id] = node;
  }
  return nodes;
}

}  // namespace

TEST_CASE("a group stays on one node with room, a pipeline's stages take a node each",
          "[actors][cluster]") {
  auto nodes = free_nodes(4, 2);
  // Two tensor-parallel ranks: one node holds both.
  const auto group = cluster::choose_nodes(nodes, 2, 0);
  REQUIRE(group.size() == 2u);
  CHECK(group[0] == group[1]);
  // Two pipeline stages: two nodes, though either has the slots for both.
  const auto stages = cluster::choose_nodes(nodes, 2, 1);
  REQUIRE(stages.size() == 2u);
  CHECK(stages[0] != stages[1]);
  // DP 2 x PP 2 on four nodes: the second replica's stages take the two nodes left.
  for (const auto& id : stages) nodes.at(id).replicas.push_back(0);
  const auto second = cluster::choose_nodes(nodes, 2, 1);
  REQUIRE(second.size() == 2u);
  CHECK(second[0] != second[1]);
  for (const auto& id : second) CHECK(nodes.at(id).replicas.empty());
  // A third replica's stages find no room (each free node holds one stage at most).
  for (const auto& id : second) nodes.at(id).replicas.push_back(1);
  CHECK(cluster::choose_nodes(nodes, 2, 1).empty());
  // Nor do four stages on three free nodes.
  auto three = free_nodes(3, 2);
  CHECK(cluster::choose_nodes(three, 4, 1).empty());
  CHECK(cluster::choose_nodes(three, 3, 1).size() == 3u);
}

TEST_CASE("a pipeline whose stages are tensor-parallel groups: each stage whole on a node",
          "[actors][cluster]") {
  // PP 2 x TP 2 on nodes of two slots: one node per stage, both of its ranks there.
  auto nodes = free_nodes(3, 2);
  const auto placed = cluster::choose_nodes(nodes, 4, 2);
  REQUIRE(placed.size() == 4u);
  CHECK(placed[0] == placed[1]);
  CHECK(placed[2] == placed[3]);
  CHECK(placed[0] != placed[2]);
  // A stage is never spread: nodes of one slot each hold no stage of two ranks, however
  // many there are.
  auto small = free_nodes(4, 1);
  CHECK(cluster::choose_nodes(small, 4, 2).empty());
  // A node with more slots than a stage takes one stage only.
  auto big = free_nodes(1, 2);
  CHECK(cluster::choose_nodes(big, 2, 1).empty());
  CHECK(cluster::choose_nodes(big, 2, 2).size() == 2u);
  // Ranks that are no whole number of stages are refused.
  CHECK(cluster::choose_nodes(nodes, 3, 2).empty());
  // The smallest nodes that fit first: two stages of two ranks take the 2-slot nodes and
  // leave the 8-slot one for a group of 8.
  auto mixed = free_nodes(3, 2);
  auto& large = mixed.begin()->second;
  large.info.num_cores = 8;
  large.info.num_threads = 1;
  const auto fitted = cluster::choose_nodes(mixed, 4, 2);
  REQUIRE(fitted.size() == 4u);
  for (const auto& id : fitted) CHECK(id != mixed.begin()->first);
}
