// A tensor-parallel group, or a pipeline's stages: one replica's worker made of several
// ranks' workers, in this process or on nodes. To its scheduler it is a worker
// (worker_actor): it loads every rank with its shard (or stage i's layers: a spec with
// pipeline_size > 1; with more workers than stages, each stage is a tensor-parallel group
// of its own, stage by stage), sends each step to every rank and answers rank 0's tokens
// (the last stage's rank 0's) once all are done. To its ranks it is the rendezvous store they
// connect through. A group fails as a whole: a rank that goes ends it (and its other ranks with
// it); a rank's failed step is fatal, and its scheduler replaces the group.
#pragma once

#include <caf/all.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "actors/cluster/cluster_messages.hpp"
#include "actors/messages.hpp"

namespace troupe::actors::parallel {

using blame_atom = caf::atom_constant<caf::atom("blame")>;

// A worker to its scheduler, a store to its ranks, and a timer to itself (blame_atom: a
// load whose failing rank waited for another is decided).
using group_actor =
    worker_actor::extend_with<rendezvous_actor>::extend<caf::reacts_to<blame_atom, std::uint64_t>>;

// Every rank's answer to one request, and who is waiting for all of them. The first
// failure is answered at once: it is the cause (the other ranks' failures that follow
// are theirs waiting in a collective for the failed one).
template <typename Answer>
struct Gathering {
  std::vector<Answer> answers;
  std::size_t pending = 0;
  bool answered = false;
  caf::typed_response_promise<Answer> promise;
};

// A load's gathering. A rank whose load failed for want of the others (a wait for them
// ran out: ErrorCode::timed_out) is not the cause while another has not answered: the
// group waits one collective timeout more, and blames the first rank still silent (the
// node its scheduler then avoids). Any other failure is the cause, answered at once.
struct Loading : Gathering<engine::LoadReport> {
  std::uint64_t number = 0;  // which load of the group (a late timer's is stale)
  std::vector<bool> answered_ranks;
  std::optional<std::pair<std::size_t, engine::LoadReport>> waited;  // the first such failure
};

struct GroupState {
  std::vector<worker_actor> ranks;
  std::vector<std::string> nodes;  // each rank's node, for people (empty: this process)
  std::chrono::milliseconds collective_timeout{30000};
  bool pipeline = false;  // the ranks are a pipeline's stages (WorkerSpec::pipeline_size > 1)
  std::int32_t stage_ranks = 1;  // a pipeline stage's tensor-parallel ranks (the ranks, if none)
  std::map<std::string, std::string> store;  // the ranks' rendezvous
  std::multimap<std::string, caf::typed_response_promise<std::string>> waiting;
  // What is in flight, answered with the failure if a rank goes meanwhile.
  std::shared_ptr<Loading> loading;
  std::uint64_t num_loads = 0;
  std::map<std::uint64_t, std::shared_ptr<Gathering<engine::StepOutput>>> stepping;
  static inline const char* name = "troupe.group";
};

group_actor::behavior_type group(group_actor::stateful_pointer<GroupState> self,
                                 std::vector<worker_actor> ranks, std::vector<std::string> nodes,
                                 std::chrono::milliseconds collective_timeout);

// A replica's worker in this process: one worker thread, or a group of `world_size`
// rank workers (a thread each) on loopback.
worker_actor spawn_local_worker(caf::actor_system& system, std::int32_t world_size,
                                const std::function<void()>& before_step,
                                std::chrono::milliseconds collective_timeout);

// A replica's worker from the workers the registry placed for it: the one worker, or a
// group (in this process) around its ranks.
worker_actor worker_for(caf::actor_system& system, cluster::Placement placed,
                        std::chrono::milliseconds collective_timeout);

}  // namespace troupe::actors::parallel
