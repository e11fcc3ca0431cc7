// The router actor: the engine's one scheduler when it runs several data-parallel
// replicas. Each submission is probed against every replica (its load, and how much
// of the prompt its prefix cache holds: exact, since the replicas' schedulers live
// here), engine::Router picks one, and the submission goes there. Aborts go to every
// replica (the one holding the request ends it; the others know nothing of it).
#pragma once

#include <cstdint>
#include <deque>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "actors/messages.hpp"
#include "engine/router.hpp"

namespace troupe::actors::parallel {

struct RouterState {
  struct Replica {
    replica_actor actor;
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
  std::vector<Replica> replicas;
  engine::Router router;
  std::unordered_map<RequestId, Pending> pending;
  // Ids aborted while not here (the last kMaxRecentAborts): a request that a replica hands
  // back after losing its worker may be cancelled on its way, and must not run.
  std::unordered_set<RequestId> recent_aborts;
  std::deque<RequestId> recent_abort_order;
  caf::timespan failover_timeout{0};  // how long a moved request waits for a replica
  static inline const char* name = "troupe.router";
};

front_actor::behavior_type router(front_actor::stateful_pointer<RouterState> self,
                                  std::vector<replica_actor> replicas, engine::RouterConfig config,
                                  caf::timespan failover_timeout);

// The engine's numbers from its replicas': counts add up, KV usage is over all blocks.
EngineStats sum_stats(const std::vector<ReplicaStats>& replicas);

}  // namespace troupe::actors::parallel
