// The scheduler actor: one replica, a shell around engine::EngineCore. One step is in
// flight at a time (a pipelined replica's: up to its micro-batches, over disjoint
// sequences, applied in the order they were sent); while it runs, submissions and aborts
// are taken in, and the next step is planned when it returns.
//
// Its worker comes from the replica's worker supply (worker_supply.hpp): a thread of this
// process, or workers on nodes of a cluster, perhaps a tensor-parallel group replaced as a
// whole. A local worker whose step threw is replaced by a fresh one loaded from the same
// spec, and the running sequences are recomputed. A remote worker that is lost (its node
// died, its connection was cut, a step timed out, a rank of its group failed) takes its KV
// cache and samplers with it: requests that have streamed nothing go back to the router
// for another replica, the others with the tokens they sent, and the replica is down until
// the registry places new workers on nodes. A replica whose node drains takes no new
// requests, hands its queue back, and lets its running requests finish within the node's
// shutdown timeout before its worker ends (replica_drain.hpp). An elastic replica
// (EngineConfig::elastic) whose node goes does not wait for another: once its requests
// have moved, it leaves the router and ends.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "actors/messages.hpp"
#include "actors/replica/step_observer.hpp"
#include "actors/replica/worker_supply.hpp"
#include "engine/engine_core.hpp"

namespace troupe::actors {

struct ReplicaSetup {
  std::int32_t index = 0;
  engine::SchedulerConfig config;  // sized from the first worker's load report
  // A token budget sized to the machine (none: config.max_num_batched_tokens).
  std::optional<engine::TokenBudgetConfig> token_budget;
  std::vector<TokenId> end_of_generation;
  SupplyNews first;  // the worker it starts with, loaded (its report's calibration steps)
  engine::WorkerSpec spec;
  WorkerSource source;                         // where its replacements come from
  caf::duration step_timeout = caf::infinite;  // a remote worker slower than this is lost
  std::shared_ptr<monitoring::Metrics> metrics;
  std::shared_ptr<monitoring::StepEvents> step_events;  // each step, when someone watches
  // How many replicas have a worker (the engine refuses requests at zero); counted
  // with this one already, which gives it up when it loses its worker.
  std::shared_ptr<std::atomic<std::int32_t>> replicas_up;
  // Elastic data parallelism, on nodes: a replica whose node goes (lost, or drained)
  // leaves the router and ends rather than wait for another node (worker_keeping.hpp).
  bool elastic = false;
  // Alone (no router) on nodes: how long the requests a drain left here wait for the next
  // worker before they end with an error (--failover-timeout, as a moved request waits
  // for a replica; 0: they end at once).
  caf::timespan failover_timeout{0};
};

struct SchedulerState {
  std::unique_ptr<engine::EngineCore> core;
  ReplicaSetup setup;
  std::unique_ptr<StepObserver> observer;
  worker_actor worker;               // null while a replacement is supplied
  std::vector<std::string> nodes;    // where it runs (empty: this process, or not placed yet)
  std::vector<ReplicaWorker> parts;  // what its loaded worker's ranks hold (empty: none loaded)
  bool worker_ready = true;          // false while a replacement is placed or loads
  std::uint64_t supply = 0;          // the number of the latest supply asked for
  front_actor router;                // where a lost worker's unstarted requests go (null: none)
  std::int64_t num_received = 0;     // submissions (ReplicaProbe::num_received)
  // Run-time LoRA loads and unloads so far, and how many the latest supply's spec held: a
  // worker supplied from an older spec is told the slots when it arrives.
  std::uint64_t lora_changes = 0;
  std::uint64_t supply_lora_changes = 0;
  bool counted_up = true;  // counted in replicas_up (takes_requests() when last told)
  // Its node drains (replica_drain.hpp): which node, and the drain's number (its timer's).
  bool draining = false;
  bool drain_expired = false;  // its timeout passed: it ends after the step in flight
  std::string draining_node;
  std::uint64_t drain_number = 0;
  // Alone, after a drain: the number of the timer (a drain number) that bounds how long
  // its requests wait for the next worker (0: none runs).
  std::uint64_t worker_wait = 0;
  std::string worker_wait_why;  // why they wait ("replica 0 drained off node n0")
  bool leaving = false;         // elastic: its node went; it ends once the router has let it go
  // Outputs of steps that answered before an older step in flight (applied in order),
  // with their round trips.
  struct EarlyOutput {
    engine::StepOutput output;
    double round_trip_seconds = 0.0;
  };
  std::map<std::uint64_t, EarlyOutput> early_outputs;
  static inline const char* name = "troupe.scheduler";
};

replica_actor::behavior_type scheduler(replica_actor::stateful_pointer<SchedulerState> self,
                                       ReplicaSetup setup);

}  // namespace troupe::actors
