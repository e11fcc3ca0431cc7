// The head's registry: the nodes that joined with the cluster token, and the
// placement of replicas' workers on them. A node holds one replica's workers: one, or
// up to its slots (NodeInfo::num_slots) of a tensor-parallel group's ranks; a group
// stays on one node when one has room for all its ranks (vLLM's rule), else spreads over
// several; a pipeline's stages each take a node of their own (a stage that is itself a
// tensor-parallel group, one node with the slots for all its ranks). A node drained (its SIGTERM,
// or the head's POST /v1/cluster/nodes/{name}/drain) takes no new placement; its replicas are told
// to drain, and once each has (its worker ended), the node is released: its keeper hears
// release_atom and the node exits. It spawns a worker on a node by name (CAF's remote spawn, asked
// of the middleman without waiting, so that joins and node lists are answered meanwhile). A
// placement that finds no room waits until a node joins or frees its slots.
#pragma once

#include <caf/all.hpp>
#include <deque>
#include <map>
#include <string>

#include "actors/cluster/cluster_gate.hpp"
#include "actors/cluster/cluster_messages.hpp"
#include "monitoring/metrics.hpp"

namespace troupe::actors::cluster {

struct RegistryState {
  struct Node {
    NodeInfo info;
    caf::actor keeper;                   // its loss is the node's
    std::vector<std::int32_t> replicas;  // the replica of each worker it holds (all one)
    std::string unfit;                   // why no worker is placed there
    bool draining = false;               // its replicas move off; none is placed there
    bool released = false;               // told it may go (it leaves by itself)
  };
  struct Waiting {
    std::int32_t replica = 0;
    std::int32_t ranks = 1;
    std::int32_t stage_ranks = 0;  // a pipeline stage's ranks, each stage a node (0: a group)
    caf::typed_response_promise<Placement> promise;
  };
  std::string token;
  std::map<caf::node_id, Node> nodes;
  std::deque<Waiting> waiting;
  std::shared_ptr<monitoring::Metrics> metrics;
  std::shared_ptr<ClusterGate> gate;    // the cluster port's (null: none), told who joined
  std::vector<replica_actor> replicas;  // the replicas' schedulers, which a drain reaches
  static inline const char* name = "troupe.registry";
};

registry_actor::behavior_type registry(registry_actor::stateful_pointer<RegistryState> self,
                                       std::string token,
                                       std::shared_ptr<monitoring::Metrics> metrics,
                                       std::shared_ptr<ClusterGate> gate);

// Where a replica's `ranks` workers go, a node for each in rank order: nodes hold one
// replica's workers at most (replicas never share a node's cores or GPUs). All ranks on
// the free node with the most slots when it has room for them (a tensor-parallel group,
// as vLLM places one), else over the free nodes with the most slots first. With
// `stage_ranks` > 0 the ranks are a pipeline's stages of that many ranks each (in stage
// order): each stage on a free node of its own with the slots for all its ranks, so that a
// stage's node holds only its layers and its tensor-parallel ranks all-reduce within the
// node; the nodes with the fewest slots that fit first. Empty when the free nodes have too
// little room.
std::vector<caf::node_id> choose_nodes(const std::map<caf::node_id, RegistryState::Node>& nodes,
                                       std::int32_t ranks, std::int32_t stage_ranks = 0);

// Whether two tokens are equal, in time independent of where they differ.
bool tokens_match(const std::string& a, const std::string& b);

}  // namespace troupe::actors::cluster
