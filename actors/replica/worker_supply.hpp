// A replica's worker lifecycle, written once: place (on nodes, through the registry),
// spawn (a worker, or a tensor-parallel group around its ranks), load (the spec), and do
// it again after a loss. The engine waits for a replica's first worker at start-up
// (supply_and_wait; a head for all of its replicas' at once, supply_all_and_wait); its
// scheduler asks for each replacement (supply_worker) and hears the outcome as messages.
// Each supply runs in an actor of its own, so that neither waits on the other.
#pragma once

#include <caf/all.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "actors/cluster/cluster_messages.hpp"
#include "actors/messages.hpp"

namespace troupe::actors {

// Where a replica's workers come from.
struct WorkerSource {
  std::int32_t replica = 0;
  std::int32_t tensor_parallel_size = 1;  // workers per replica: TP ranks x pipeline stages
  // The ranks are a pipeline's stages of this many ranks each (stage by stage), each stage
  // placed on a node of its own (0: a tensor-parallel group, or one worker).
  std::int32_t stage_ranks = 0;
  std::chrono::milliseconds collective_timeout{30000};  // of a group's rendezvous and collectives
  std::function<void()> before_step;                    // tests only: handed to every local worker
  // Nodes: the registry places the worker (null: a worker of this process).
  cluster::registry_actor registry;
  // How long to wait for a free node (0: until one joins).
  std::chrono::seconds placement_wait{0};
  // How a placement that found no node within the wait is explained: the replicas and
  // the nodes they need.
  std::int32_t num_replicas = 1;
  std::int32_t nodes_needed = 1;
  // How long a load may take before the worker counts as lost (a group's own answer,
  // naming its failing rank, comes within kGroupLoadTimeout).
  caf::duration load_timeout = caf::infinite;
  // How a worker of this process is made (unset: parallel::spawn_local_worker with the
  // fields above); tests hand in stand-ins.
  std::function<worker_actor(caf::actor_system&)> spawn_local;
};
// Supplies a worker loaded from `spec`, telling `news` (in the supply's actor) what
// happens. On nodes with `retry`, a node that cannot load it is marked unfit and another
// is waited for, until one loads it; without, the first failure is the answer. The
// supply ends, and stops a worker it made, when `owner` (if set) goes first.
void supply_worker(caf::actor_system& system, WorkerSource source, engine::WorkerSpec spec,
                   bool retry, std::uint64_t number, caf::actor_addr owner,
                   std::function<void(SupplyNews)> news);

// The same, waited for from a thread that is no actor's (the engine's start-up), with no
// retry: the loaded worker, or why there is none.
Result<SupplyNews> supply_and_wait(caf::actor_system& system, WorkerSource source,
                                   engine::WorkerSpec spec);

// Several supplies at once (the replicas of a cluster's head at start-up), waited for
// together: each is placed as soon as a node has room, whatever the others' loads. The
// loaded workers in the order of `sources`; or the first failure, when every other
// supply is stopped (and the workers already loaded with it).
Result<std::vector<SupplyNews>> supply_all_and_wait(caf::actor_system& system,
                                                    std::vector<WorkerSource> sources,
                                                    const engine::WorkerSpec& spec);

}  // namespace troupe::actors
