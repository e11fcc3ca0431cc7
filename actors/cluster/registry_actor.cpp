#include "actors/cluster/registry_actor.hpp"
#include "monitoring/log.hpp"

#include <caf/io/all.hpp>
#include <cstdio>
#include <memory>
#include <optional>
#include <set>

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

}  // namespace

std::vector<caf::node_id> choose_nodes(const std::map<caf::node_id, RegistryState::Node>& nodes,
                                       std::int32_t ranks, std::int32_t stage_ranks) {
  if (ranks < 1 || stage_ranks < 0 || (stage_ranks > 0 && ranks % stage_ranks != 0)) return {};
  std::vector<std::pair<caf::node_id, std::int32_t>> free;  // node, its slots
  for (const auto& [id, node] : nodes) {
    if (!node.replicas.empty() || !node.unfit.empty() || node.draining) continue;
    const std::int32_t slots = node.info.num_slots();
    if (stage_ranks == 0 || slots >= stage_ranks) free.emplace_back(id, slots);
  }
  std::vector<caf::node_id> chosen;
  if (stage_ranks > 0) {
    // A whole stage a node, and no more: the smallest nodes that fit first, so that the
    // larger ones stay free for larger groups.
    std::stable_sort(free.begin(), free.end(),
                     [](const auto& a, const auto& b) { return a.second < b.second; });
    for (const auto& [id, slots] : free) {
      if (static_cast<std::int32_t>(chosen.size()) == ranks) break;
      chosen.insert(chosen.end(), static_cast<std::size_t>(stage_ranks), id);
    }
    if (static_cast<std::int32_t>(chosen.size()) == ranks) return chosen;
    return {};
  }
  std::stable_sort(free.begin(), free.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  for (const auto& [id, slots] : free) {
    const auto needed = ranks - static_cast<std::int32_t>(chosen.size());
    chosen.insert(chosen.end(), static_cast<std::size_t>(std::min(slots, needed)), id);
    if (static_cast<std::int32_t>(chosen.size()) == ranks) return chosen;
  }
  return {};
}

namespace {

// One placement's workers being spawned, one request to the middleman per rank: the
// registry answers joins and lists nodes meanwhile (a remote spawn to a node that died but
// is not yet dropped takes up to kSpawnTimeout).
struct Spawning {
  RegistryState::Waiting waiting;
  std::vector<caf::node_id> nodes;  // a rank's node, in rank order
  std::vector<worker_actor> workers;
  std::size_t left = 0;
  std::optional<std::pair<caf::node_id, std::string>> failed;  // the first node that could not
};

void place_waiting(Self self);

// Every rank's spawn has answered: the placement is the replica's, or the replica waits
// again at the head of the queue (without the node that failed, which leaves the cluster).
void spawned(Self self, const std::shared_ptr<Spawning>& s) {
  auto& state = self->state;
  bool void_placement = s->failed.has_value();
  if (s->failed) {
    const auto& [id, why] = *s->failed;
    if (auto node = state.nodes.find(id); node != state.nodes.end()) {
      monitoring::logf(monitoring::LogLevel::warning,
                       "cannot spawn a worker on node %s (%s); it leaves the cluster",
                       node->second.info.name.c_str(), why.c_str());
      state.nodes.erase(node);
      if (state.metrics) state.metrics->set_num_nodes(state.nodes.size());
    }
  }
  for (const auto& id : s->nodes) void_placement |= !state.nodes.contains(id);  // lost meanwhile
  if (void_placement) {
    for (const auto& w : s->workers) {
      if (w) caf::anon_send_exit(w, caf::exit_reason::kill);
    }
    for (const auto& id : s->nodes) {
      if (auto node = state.nodes.find(id); node != state.nodes.end()) {
        std::erase(node->second.replicas, s->waiting.replica);
      }
    }
    state.waiting.push_front(std::move(s->waiting));
    place_waiting(self);
    return;
  }
  Placement placement;
  placement.workers = std::move(s->workers);
  for (const auto& id : s->nodes) placement.nodes.push_back(state.nodes.at(id).info.name);
  const std::string where = node_label(placement.nodes);
  monitoring::logf(monitoring::LogLevel::info, "replica %d placed on node%s %s", s->waiting.replica,
                   where.find(',') != std::string::npos ? "s" : "", where.c_str());
  s->waiting.promise.deliver(std::move(placement));
}

// Places waiting replicas on nodes with room, in the order they asked. A placement's
// nodes are taken at once (their slots are the replica's while its workers spawn).
void place_waiting(Self self) {
  auto& state = self->state;
  const auto middleman = self->home_system().middleman().actor_handle();
  const std::set<std::string> interface = self->home_system().message_types<worker_actor>();
  while (!state.waiting.empty()) {
    const auto& next = state.waiting.front();
    const auto chosen = choose_nodes(state.nodes, next.ranks, next.stage_ranks);
    if (chosen.empty()) return;
    auto s = std::make_shared<Spawning>();
    s->waiting = std::move(state.waiting.front());
    state.waiting.pop_front();
    s->nodes = chosen;
    s->workers.resize(chosen.size());
    s->left = chosen.size();
    for (const caf::node_id& id : chosen) state.nodes[id].replicas.push_back(s->waiting.replica);
    for (std::size_t r = 0; r < chosen.size(); ++r) {
      self->request(middleman, kSpawnTimeout, caf::spawn_atom::value, chosen[r],
                    std::string(kWorkerType), caf::make_message(), interface)
          .then(
              [self, s, r](caf::strong_actor_ptr& worker) {
                if (worker) {
                  s->workers[r] = caf::actor_cast<worker_actor>(std::move(worker));
                } else if (!s->failed) {
                  s->failed.emplace(s->nodes[r], "no worker came back");
                }
                if (--s->left == 0) spawned(self, s);
              },
              [self, s, r](const caf::error& e) {
                if (!s->failed) s->failed.emplace(s->nodes[r], self->system().render(e));
                if (--s->left == 0) spawned(self, s);
              });
    }
  }
}

// A node joined: its connection (the one the middleman routes to it) is through the
// cluster port's gate, no longer held to the handshake's deadline.
void admit_connection(Self self, const caf::node_id& node) {
  if (!self->state.gate) return;
  auto unknown = [](const std::string& why) {
    monitoring::logf(monitoring::LogLevel::warning,
                     "cannot tell which cluster connection a node joined over (%s): it may be "
                     "closed at the handshake's deadline",
                     why.c_str());
  };
  self->request(self->home_system().middleman().actor_handle(), std::chrono::seconds(5),
                caf::get_atom::value, node)
      .then(
          [gate = self->state.gate, unknown](const caf::node_id&, const std::string& address,
                                             std::uint16_t port) {
            if (address.empty()) return unknown("no direct connection");
            gate->joined(address, port);
          },
          [self, unknown](const caf::error& e) { unknown(self->system().render(e)); });
}

// A draining node whose replicas have all moved off may go: its keeper is told (once).
void release_if_drained(RegistryState::Node& node) {
  if (!node.draining || node.released || !node.replicas.empty()) return;
  node.released = true;
  monitoring::logf(monitoring::LogLevel::info, "node %s is drained; it is released",
                   node.info.name.c_str());
  caf::anon_send(node.keeper, release_atom::value);
}

// Starts a node's drain: no placement there from now on, and each replica on it drains
// within the node's shutdown timeout (release_if_drained once they all have).
DrainAnswer drain_node(Self self, RegistryState::Node& node, const char* asked_by) {
  if (node.draining) return DrainAnswer::already;
  node.draining = true;
  std::set<std::int32_t> replicas(node.replicas.begin(), node.replicas.end());
  monitoring::logf(monitoring::LogLevel::info, "node %s drains (%s): %zu replica(s) move off",
                   node.info.name.c_str(), asked_by, replicas.size());
  for (const std::int32_t r : replicas) {
    const auto index = static_cast<std::size_t>(r);
    if (index < self->state.replicas.size() && self->state.replicas[index]) {
      self->send(self->state.replicas[index], drain_atom::value, node.info.name,
                 node.info.shutdown_timeout_ms);
    } else {
      // No scheduler yet (the head is starting, or an elastic replica's first worker
      // loads there): the replica is placed again elsewhere, as after a loss.
      std::erase(node.replicas, r);
    }
  }
  release_if_drained(node);
  return DrainAnswer::started;
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
                                       std::shared_ptr<monitoring::Metrics> metrics,
                                       std::shared_ptr<ClusterGate> gate) {
  self->state.token = std::move(token);
  self->state.metrics = std::move(metrics);
  self->state.gate = std::move(gate);
  self->set_down_handler([self](const caf::down_msg& down) {
    auto& nodes = self->state.nodes;
    for (auto it = nodes.begin(); it != nodes.end(); ++it) {
      if (it->second.keeper.address() != down.source) continue;
      monitoring::logf(monitoring::LogLevel::warning, "node %s was lost (%s); %zu node(s) left",
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
          monitoring::logf(monitoring::LogLevel::warning,
                           "refused node '%s' (%s): wrong cluster token", info.name.c_str(),
                           to_string(from).c_str());
          return {false, "wrong cluster token"};
        }
        info.token.clear();
        if (auto old = state.nodes.find(from); old != state.nodes.end()) {
          self->demonitor(old->second.keeper.address());
        }
        self->monitor(keeper);
        state.nodes[from] = {info, std::move(keeper), {}, {}, false, false};
        if (state.metrics) state.metrics->record_node_join(state.nodes.size());
        monitoring::logf(monitoring::LogLevel::info, "node %s joined (%s); %zu node(s)",
                         info.name.c_str(), describe(info).c_str(), state.nodes.size());
        admit_connection(self, from);
        place_waiting(self);
        return {true, "welcome, " + info.name};
      },
      [self](place_atom, std::int32_t replica, std::int32_t ranks,
             std::int32_t stage_ranks) -> caf::result<Placement> {
        if (!from_here(self)) return caf::sec::request_receiver_down;
        if (ranks < 1 || stage_ranks < 0 || (stage_ranks > 0 && ranks % stage_ranks != 0))
          return caf::sec::invalid_argument;
        auto& state = self->state;
        // A replica asks again when it lost its workers: their slots are free again.
        for (auto& [id, node] : state.nodes) {
          if (std::erase(node.replicas, replica) > 0) release_if_drained(node);
        }
        auto promise = self->make_response_promise<Placement>();
        state.waiting.push_back({replica, ranks, stage_ranks, promise});
        place_waiting(self);
        return promise;
      },
      [self](nodes_atom) -> caf::result<std::vector<NodeView>> {
        if (!from_here(self)) return caf::sec::request_receiver_down;
        std::vector<NodeView> out;
        for (const auto& [id, node] : self->state.nodes) {
          out.push_back({node.info, to_string(id),
                         node.replicas.empty() ? -1 : node.replicas.front(), node.unfit,
                         node.replicas, node.info.num_slots(), node.draining});
        }
        return out;
      },
      [self](unfit_atom, const std::string& name, const std::string& why) {
        if (!from_here(self)) return;
        for (auto& [id, node] : self->state.nodes) {
          if (node.info.name != name) continue;
          node.unfit = why;
          monitoring::logf(monitoring::LogLevel::warning,
                           "no replica is placed on node %s again: %s", name.c_str(), why.c_str());
        }
        place_waiting(self);
      },
      [self](drain_atom, const std::string& name) -> caf::result<std::int32_t> {
        if (!from_here(self)) return caf::sec::request_receiver_down;
        for (auto& [id, node] : self->state.nodes) {
          if (node.info.name == name) {
            return static_cast<std::int32_t>(drain_node(self, node, "asked over HTTP"));
          }
        }
        return static_cast<std::int32_t>(DrainAnswer::unknown);
      },
      [self](drain_atom) {
        // A node drains itself (its SIGTERM): the sender's node, if it has joined.
        const auto& sender = self->current_sender();
        if (sender == nullptr) return;
        auto node = self->state.nodes.find(sender->node());
        if (node != self->state.nodes.end()) drain_node(self, node->second, "its SIGTERM");
      },
      [self](drained_atom, std::int32_t replica, const std::string& name) {
        if (!from_here(self)) return;
        for (auto& [id, node] : self->state.nodes) {
          if (!node.draining || node.info.name != name) continue;
          if (std::erase(node.replicas, replica) > 0) release_if_drained(node);
        }
      },
      [self](retired_atom, std::int32_t replica) {
        if (!from_here(self)) return;
        for (auto& [id, node] : self->state.nodes) {
          if (std::erase(node.replicas, replica) > 0) release_if_drained(node);
        }
        place_waiting(self);
      },
      [self](replicas_atom, const std::vector<caf::actor>& replicas) {
        if (!from_here(self)) return;
        self->state.replicas.clear();
        for (const auto& r : replicas) {
          self->state.replicas.push_back(caf::actor_cast<replica_actor>(r));
        }
      },
  };
}

}  // namespace troupe::actors::cluster
