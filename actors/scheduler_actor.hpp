// The scheduler actor: one replica, a shell around engine::EngineCore. One step is in
// flight at a time; while it runs, submissions and aborts are taken in, and the next
// step is planned when it returns.
//
// Its worker is local (a thread of this process) or remote (on a node, in a cluster),
// and may be a tensor-parallel group of ranks' workers (actors/cluster/group_actor),
// which is replaced as a whole. A local worker whose step threw is replaced by a fresh
// one loaded from the same spec, and the running sequences are recomputed. A remote
// worker that is lost (its node died, its connection was cut, a step timed out, a rank
// of its group failed) takes its KV cache and samplers with it: requests that have
// streamed nothing go back to the router for another replica, the others end with an
// error, and the replica is down until the registry places new workers on nodes.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "actors/cluster/cluster_messages.hpp"
#include "actors/messages.hpp"
#include "engine/engine_core.hpp"
#include "monitoring/metrics.hpp"
#include "monitoring/step_events.hpp"

namespace troupe::actors {

struct ReplicaSetup {
  std::int32_t index = 0;
  engine::SchedulerConfig config;  // sized from the worker's load report
  // A token budget sized to the machine (none: config.max_num_batched_tokens), and
  // the worker's calibration steps it starts from.
  std::optional<engine::TokenBudgetConfig> token_budget;
  std::vector<engine::StepCost> step_costs;
  std::vector<TokenId> end_of_generation;
  worker_actor worker;  // loaded with `spec` already
  engine::WorkerSpec spec;
  std::function<void()> before_step;                    // tests only: handed to every local worker
  std::int32_t tensor_parallel_size = 1;                // ranks of its worker
  std::chrono::milliseconds collective_timeout{30000};  // of a group's rendezvous and collectives
  std::shared_ptr<monitoring::Metrics> metrics;
  std::shared_ptr<monitoring::StepEvents> step_events;  // each step, when someone watches
  // A remote worker: where it runs, where its replacement comes from, how long a step
  // may take before the worker counts as lost.
  std::string node;                  // for people: the node, or a group's nodes
  std::vector<std::string> nodes;    // each rank's node
  cluster::registry_actor registry;  // null: the worker is local
  caf::duration step_timeout = caf::infinite;
  // How many replicas have a worker (the engine refuses requests at zero); counted
  // with this one already, which gives it up when it loses its worker.
  std::shared_ptr<std::atomic<std::int32_t>> replicas_up;
};

struct SchedulerState {
  std::unique_ptr<engine::EngineCore> core;
  ReplicaSetup setup;
  scheduler_actor router;         // where a lost worker's unstarted requests go (null: none)
  bool worker_ready = true;       // false while a replacement is placed or loads
  bool placing = false;           // a placement is asked of the registry (one at a time)
  std::int64_t num_received = 0;  // submissions (ReplicaProbe::num_received)
  // Requests cancelled since the last step, for its event (only while someone watches).
  std::vector<monitoring::StepEvent::Finished> cancelled;
  static inline const char* name = "troupe.scheduler";
};

replica_actor::behavior_type scheduler(replica_actor::stateful_pointer<SchedulerState> self,
                                       ReplicaSetup setup);

}  // namespace troupe::actors
