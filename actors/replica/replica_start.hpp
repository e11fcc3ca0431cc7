// A replica's start: its first worker supplied and loaded (here, or on nodes of a
// cluster), then its scheduler sized from the worker's load report.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/replica/scheduler_actor.hpp"
#include "troupe/config.hpp"

namespace troupe::actors {

struct ReplicaStart {
  std::int32_t index = 0;
  engine::WorkerSpec spec;
  std::int32_t max_model_len = 0;
  std::vector<TokenId> end_of_generation;
  cluster::registry_actor registry;   // a cluster's head: workers go on nodes (null: here)
  std::function<void()> before_step;  // tests only: handed to every local worker
  std::shared_ptr<std::atomic<std::int32_t>> replicas_up;
};

struct StartedReplica {
  replica_actor scheduler;
  engine::LoadReport report;  // its first worker's
  // The token budget it starts with, for people: "2048 tokens per step", or the auto
  // budget with what it measured.
  std::string token_budget_description;
};

// Starts replica `start.index` of an engine set up by `config`; waits for its worker.
Result<StartedReplica> start_replica(caf::actor_system& system, const EngineConfig& config,
                                     ReplicaStart start);

// Starts the engine's `config.data_parallel_size` replicas (`every`: what each gets but its
// index) and waits for them all. A cluster's head asks for every replica's first worker at
// once, so that each node with room is placed as it joins, whatever the loads before it;
// local replicas load one after another (they share the cores, which each one's load
// measures for its token budget).
Result<std::vector<StartedReplica>> start_replicas(caf::actor_system& system,
                                                   const EngineConfig& config,
                                                   const ReplicaStart& every);

// Replicas started while serving (elastic data parallelism, EngineConfig::elastic): each
// one's first worker is placed on the next node with room, waited for as long as it takes,
// then its scheduler is made around it. Copied into the router, which asks for them.
// (Virtual: tests stand in for the nodes.)
class ReplicaFactory {
 public:
  // `start`: what every replica gets (its index is each one's own).
  ReplicaFactory(EngineConfig config, ReplicaStart start);
  virtual ~ReplicaFactory() = default;

  // Asks for replica `index`'s first worker; `news` hears the supply's news (in the
  // supply's actor): placed, then loaded (or failed). The supply ends, and stops its
  // worker, when `owner` ends first.
  virtual void supply(caf::actor_system& system, std::int32_t index, caf::actor_addr owner,
                      std::function<void(SupplyNews)> news) const;
  // Replica `index`'s scheduler around the worker its supply loaded (`first`).
  virtual StartedReplica make(caf::actor_system& system, std::int32_t index,
                              SupplyNews first) const;

 private:
  EngineConfig config_;
  ReplicaStart start_;
};

}  // namespace troupe::actors
