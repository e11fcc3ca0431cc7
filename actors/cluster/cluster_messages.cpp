#include "actors/cluster/cluster_messages.hpp"

#include <caf/io/all.hpp>

namespace troupe::actors::cluster {

void add_cluster_types(caf::actor_system_config& config) {
  config.add_message_type<NodeInfo>("troupe.NodeInfo")
      .add_message_type<JoinReply>("troupe.JoinReply")
      .add_message_type<NodeView>("troupe.NodeView")
      .add_message_type<std::vector<NodeView>>("troupe.NodeViews")
      .add_message_type<Placement>("troupe.Placement")
      .add_message_type<worker_actor>(kWorkerType)
      .add_message_type<registry_actor>("troupe.registry");
}

void load_middleman(caf::actor_system_config& config) {
  config.load<caf::io::middleman>();
  // Every peer must send heartbeats, or an idle healthy one is dropped (STACK.md).
  config.set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(500)});
  config.set("middleman.connection-timeout", caf::timespan{std::chrono::seconds(3)});
}

}  // namespace troupe::actors::cluster
