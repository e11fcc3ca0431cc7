#include "actors/cluster/registry_actor.hpp"

#include <caf/io/all.hpp>
#include <cstdio>

namespace troupe::actors::cluster {

namespace {

using Self = registry_actor::stateful_pointer<RegistryState>;

constexpr auto kSpawnTimeout = std::chrono::seconds(10);

std::string describe(const NodeInfo& info) {
  char line[160];
  std::snprintf(line, sizeof line, "%d cores, %.1f GiB, %s", info.num_cores,
                static_cast<double>(info.memory_bytes) / (1 << 30), info.device.c_str());
  std::string out = line;
  for (std::size_t i = 0; i < info.gpu_names.size(); ++i) out += ", " + info.gpu_names[i];
  return out;
}

// Only the head's own actors place replicas or list nodes.
bool from_here(Self self) {
  const auto& sender = self->current_sender();
  return sender != nullptr && sender->node() == self->node();
}

// Places waiting replicas on free nodes, in the order they asked.
void place_waiting(Self self) {
  auto& state = self->state;
  while (!state.waiting.empty()) {
    auto node = std::find_if(state.nodes.begin(), state.nodes.end(), [](const auto& n) {
      return n.second.replica < 0 && n.second.unfit.empty();
    });
    if (node == state.nodes.end()) return;
    auto& mm = self->home_system().middleman();
    auto worker =
        mm.remote_spawn<worker_actor>(node->first, kWorkerType, caf::make_message(), kSpawnTimeout);
    if (!worker) {
      std::fprintf(stderr, "troupe: cannot spawn a worker on node %s (%s); it leaves the cluster\n",
                   node->second.info.name.c_str(), self->system().render(worker.error()).c_str());
      state.nodes.erase(node);
      continue;
    }
    RegistryState::Waiting w = std::move(state.waiting.front());
    state.waiting.pop_front();
    node->second.replica = w.replica;
    std::fprintf(stderr, "troupe: replica %d placed on node %s\n", w.replica,
                 node->second.info.name.c_str());
    w.promise.deliver(Placement{std::move(*worker), node->second.info.name});
  }
}

}  // namespace

bool tokens_match(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

registry_actor::behavior_type registry(Self self, std::string token,
                                       std::shared_ptr<monitoring::Metrics> metrics) {
  self->state.token = std::move(token);
  self->state.metrics = std::move(metrics);
  self->set_down_handler([self](const caf::down_msg& down) {
    auto& nodes = self->state.nodes;
    for (auto it = nodes.begin(); it != nodes.end(); ++it) {
      if (it->second.keeper.address() != down.source) continue;
      std::fprintf(stderr, "troupe: node %s was lost (%s); %zu node(s) left\n",
                   it->second.info.name.c_str(), self->system().render(down.reason).c_str(),
                   nodes.size() - 1);
      nodes.erase(it);
      if (self->state.metrics) self->state.metrics->set_num_nodes(nodes.size());
      return;
    }
  });
  return {
      [self](join_atom, NodeInfo& info, caf::actor& keeper) -> JoinReply {
        auto& state = self->state;
        const auto& sender = self->current_sender();
        if (sender == nullptr || keeper == nullptr) return {false, "a join needs its sender"};
        const caf::node_id from = sender->node();
        if (!tokens_match(info.token, state.token)) {
          std::fprintf(stderr, "troupe: refused node '%s' (%s): wrong cluster token\n",
                       info.name.c_str(), to_string(from).c_str());
          return {false, "wrong cluster token"};
        }
        info.token.clear();
        if (auto old = state.nodes.find(from); old != state.nodes.end()) {
          self->demonitor(old->second.keeper.address());
        }
        self->monitor(keeper);
        state.nodes[from] = {info, std::move(keeper), -1, {}};
        if (state.metrics) state.metrics->record_node_join(state.nodes.size());
        std::fprintf(stderr, "troupe: node %s joined (%s); %zu node(s)\n", info.name.c_str(),
                     describe(info).c_str(), state.nodes.size());
        place_waiting(self);
        return {true, "welcome, " + info.name};
      },
      [self](place_atom, std::int32_t replica) -> caf::result<Placement> {
        if (!from_here(self)) return caf::sec::request_receiver_down;
        auto& state = self->state;
        // A replica asks again when it lost its worker: its old node is free again.
        for (auto& [id, node] : state.nodes) {
          if (node.replica == replica) node.replica = -1;
        }
        auto promise = self->make_response_promise<Placement>();
        state.waiting.push_back({replica, promise});
        place_waiting(self);
        return promise;
      },
      [self](nodes_atom) -> caf::result<std::vector<NodeView>> {
        if (!from_here(self)) return caf::sec::request_receiver_down;
        std::vector<NodeView> out;
        for (const auto& [id, node] : self->state.nodes) {
          out.push_back({node.info, to_string(id), node.replica, node.unfit});
        }
        return out;
      },
      [self](unfit_atom, const std::string& name, const std::string& why) {
        if (!from_here(self)) return;
        for (auto& [id, node] : self->state.nodes) {
          if (node.info.name != name) continue;
          node.unfit = why;
          node.replica = -1;
          std::fprintf(stderr, "troupe: no replica is placed on node %s again: %s\n", name.c_str(),
                       why.c_str());
        }
        place_waiting(self);
      },
  };
}

}  // namespace troupe::actors::cluster
