// The router actor: the engine's one scheduler when it runs several data-parallel
// replicas. Each submission is probed against every replica (its load, and how much
// of the prompt its prefix cache holds: exact, since the replicas' schedulers live
// here), engine::Router picks one, and the submission goes there. Aborts go to every
// replica (the one holding the request ends it; the others know nothing of it).
//
// Elastic (EngineConfig::elastic, elastic.hpp): the replicas come and go. One replica's
// first worker is always waiting for a node while there are fewer than the maximum (the
// registry places it on the next node with room, and the next one is asked for at once);
// once it loads, the replica joins the others. A replica whose node goes leaves: its index
// is empty (and reused by a later one).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "actors/cluster/cluster_messages.hpp"
#include "actors/messages.hpp"
#include "engine/router.hpp"
#include "monitoring/metrics.hpp"

namespace troupe::actors {
class ReplicaFactory;
}

namespace troupe::actors::parallel {

// The router's interface: the front's, and the elastic replicas' comings and goings.
using router_actor = front_actor::extend<
    // A replica leaves with its node (elastic): the router sends it nothing more, then
    // answers (whatever it sent before reaches the replica first).
    caf::replies_to<leave_atom, std::int32_t>::with<bool>,
    // The first worker of the replica of this index loaded (or its supply failed).
    caf::reacts_to<grown_atom, std::int32_t, SupplyNews>,
    // Ask for the next replica's worker (again, after a failed supply).
    caf::reacts_to<grow_atom>>;

// What an elastic router needs to start replicas and say how many there are.
struct ElasticSetup {
  std::shared_ptr<const ReplicaFactory> factory;
  std::int32_t min = 1;
  std::int32_t max = 1;  // EngineConfig::kUnboundedReplicas: no cap
  cluster::registry_actor registry;
  std::shared_ptr<std::atomic<std::int32_t>> count;  // replicas there now (Engine reads it)
  std::shared_ptr<monitoring::Metrics> metrics;
};

struct RouterState {
  struct Replica {
    replica_actor actor;  // null: no replica at this index now (elastic)
    std::int64_t num_routed = 0;
    std::int64_t num_prefix_routed = 0;
  };
  // A submission whose probes are out.
  struct Pending {
    Submission submission;
    std::vector<engine::ReplicaView> views;
    std::vector<std::int64_t> received;  // each replica's num_received when it answered
    std::size_t num_unanswered = 0;
  };
  std::vector<Replica> replicas;  // by index
  engine::Router router;
  std::unordered_map<RequestId, Pending> pending;
  // Moved requests that found no replica up, by id: their submissions wait in a delayed
  // message (kFailoverRetry), lost if the router ends first; so it ends them here then.
  std::unordered_map<RequestId, request_actor> retrying;
  // Ids aborted while not here (the last kMaxRecentAborts): a request that a replica hands
  // back after losing its worker may be cancelled on its way, and must not run.
  std::unordered_set<RequestId> recent_aborts;
  std::deque<RequestId> recent_abort_order;
  caf::timespan failover_timeout{0};  // how long a moved request waits for a replica
  // Elastic only (null factory: a fixed count).
  ElasticSetup elastic;
  // The indexes whose first worker is asked for, each with whether it is placed (loading
  // on a node) yet: one at most waits for a node, the placed ones load meanwhile.
  std::map<std::int32_t, bool> growing;
  // Run-time LoRA adapter paths by slot - 1, as last set: a replica that joins gets them.
  std::vector<std::optional<std::string>> lora_paths;
  static inline const char* name = "troupe.router";
};

using RouterSelf = router_actor::stateful_pointer<RouterState>;

// A fixed set of replicas.
router_actor::behavior_type router(RouterSelf self, std::vector<replica_actor> replicas,
                                   engine::RouterConfig config, caf::timespan failover_timeout);

// Replicas that come and go with nodes, `replicas` the first.
router_actor::behavior_type elastic_router(RouterSelf self, std::vector<replica_actor> replicas,
                                           engine::RouterConfig config,
                                           caf::timespan failover_timeout, ElasticSetup elastic);

// The engine's numbers from its replicas': counts add up, KV usage is over all blocks.
EngineStats sum_stats(const std::vector<ReplicaStats>& replicas);

}  // namespace troupe::actors::parallel
