// The actors' vocabulary: atoms, message types and the three actor interfaces.
// Every message is a plain value with an inspect() (actors/wire.hpp): the worker's
// can cross to another node.
#pragma once

#include <caf/all.hpp>
#include <chrono>
#include <string>
#include <vector>

#include "actors/wire.hpp"
#include "engine/engine_core.hpp"
#include "engine/worker_protocol.hpp"
#include "troupe/engine.hpp"

namespace troupe::actors {

using load_atom = caf::atom_constant<caf::atom("load")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using submit_atom = caf::atom_constant<caf::atom("submit")>;
using abort_atom = caf::atom_constant<caf::atom("abort")>;
using token_atom = caf::atom_constant<caf::atom("token")>;
using timeout_atom = caf::atom_constant<caf::atom("timeout")>;
using stats_atom = caf::atom_constant<caf::atom("stats")>;
using probe_atom = caf::atom_constant<caf::atom("probe")>;
using replicas_atom = caf::atom_constant<caf::atom("replicas")>;
using router_atom = caf::atom_constant<caf::atom("router")>;
using store_set_atom = caf::atom_constant<caf::atom("storeset")>;
using store_get_atom = caf::atom_constant<caf::atom("storeget")>;
using supplied_atom = caf::atom_constant<caf::atom("supplied")>;
using lora_atom = caf::atom_constant<caf::atom("lora")>;
using drain_atom = caf::atom_constant<caf::atom("drain")>;
using drained_atom = caf::atom_constant<caf::atom("drained")>;
// Elastic data parallelism: a replica leaves with its node; the router asks for the next
// replica's worker, and hears that it has grown by one.
using leave_atom = caf::atom_constant<caf::atom("leave")>;
using grow_atom = caf::atom_constant<caf::atom("grow")>;
using grown_atom = caf::atom_constant<caf::atom("grown")>;

// How long a worker may take to load (a large model from a slow disk). Whoever waits on
// a group waits a minute more: the group's own answer, naming its failing rank, comes first.
inline constexpr std::chrono::minutes kLoadTimeout{10};
inline constexpr std::chrono::minutes kGroupLoadTimeout = kLoadTimeout + std::chrono::minutes(1);

// Where the ranks of a tensor-parallel group meet: a key-value store kept by the actor
// that leads the group (values are bytes: Gloo's addresses).
using rendezvous_actor = caf::typed_actor<
    // Sets a key.
    caf::replies_to<store_set_atom, std::string, std::string>::with<bool>,
    // A key's value, answered once some rank has set it.
    caf::replies_to<store_get_atom, std::string>::with<std::string>>;

// What a rank needs to join its group.
struct GroupJoin {
  rendezvous_actor store;
  std::string prefix;               // this formation's keys in the store
  std::int64_t timeout_ms = 30000;  // a rendezvous or collective that takes longer fails
};

// The worker owns the backend, the model and the KV cache.
using worker_actor = caf::typed_actor<
    // Loads the model and sizes the KV cache; answers what it holds (or why it failed).
    caf::replies_to<load_atom, engine::WorkerSpec>::with<engine::LoadReport>,
    // Loads rank spec.rank of spec.world_size: its shard, its part of the KV cache, its
    // end of the group's communicator (through `join`).
    caf::replies_to<load_atom, engine::WorkerSpec, GroupJoin>::with<engine::LoadReport>,
    // Runs one step: forward pass and sampling; answers the sampled tokens.
    caf::replies_to<step_atom, engine::StepWork>::with<engine::StepOutput>,
    // Puts the LoRA adapter file at the path (read where the worker runs) in the slot,
    // replacing what it held; an empty path empties it. Answers why not, or "" when done.
    caf::replies_to<lora_atom, std::int32_t, std::string>::with<std::string>>;

// What a supply tells its replica, in order: `placed` (a worker loads on `nodes`) for each
// node tried, then `loaded` or `failed` once.
struct SupplyNews {
  enum class Stage : std::uint8_t { placed, loaded, failed };
  std::uint64_t number = 0;  // which supply of the replica (a stale one's news is ignored)
  Stage stage = Stage::failed;
  worker_actor worker;             // loaded: the worker, monitored by no one yet
  std::vector<std::string> nodes;  // each rank's node (empty: this process)
  engine::LoadReport report;       // loaded: what it holds
  Error error;                     // failed: why (a node's failure names the node)
};

// The end of request `id`, with no token: for a request that ends before it runs.
inline engine::RequestEvent end_of(RequestId id, FinishReason reason, std::string why) {
  engine::RequestEvent end;
  end.id = id;
  end.finish_reason = reason;
  end.error = std::move(why);
  return end;
}

// One per request: turns tokens into text events for its caller.
using request_actor = caf::typed_actor<
    // A token sampled for this request, or its end.
    caf::reacts_to<token_atom, engine::RequestEvent>,
    // The request's deadline passed.
    caf::reacts_to<timeout_atom>>;

struct Submission {
  RequestId id = 0;
  std::vector<TokenId> prompt;
  SamplingParams params;
  std::int32_t priority = 0;
  request_actor requester;
  std::int32_t adapter = 0;  // GenerateRequest::lora_adapter
  // The tokens it already streamed (its worker was lost): it resumes after them
  // (engine::CoreRequest::resumed). Empty for a new request.
  std::vector<TokenId> resumed = {};
  // Handed back by a replica that lost its worker; while no replica is up, the router
  // tries again until failover_deadline_ns (steady clock; 0: not yet set).
  bool moved = false;
  std::int64_t failover_deadline_ns = 0;
};

// The engine's front, which it sends requests to: one replica's scheduler, or the router
// in front of several.
using front_actor = caf::typed_actor<
    // Queues a request.
    caf::reacts_to<submit_atom, Submission>,
    // Ends a request now (cancelled, stop string, deadline); frees its blocks.
    caf::reacts_to<abort_atom, RequestId, FinishReason>,
    // The engine's numbers.
    caf::replies_to<stats_atom>::with<EngineStats>,
    // Each replica's numbers.
    caf::replies_to<replicas_atom>::with<std::vector<ReplicaStats>>,
    // A LoRA adapter in a slot of every replica's worker(s) (lora_atom of worker_actor),
    // kept for the workers that replace them; the slot's cached prefixes are forgotten.
    // Answers why not, or "" when every replica holds it (a failure leaves none holding it).
    caf::replies_to<lora_atom, std::int32_t, std::string>::with<std::string>>;

// What a replica tells the router about itself and one prompt.
struct ReplicaProbe {
  bool up = true;  // it has a worker
  std::int32_t num_waiting = 0;
  std::int32_t num_running = 0;
  double kv_usage = 0.0;
  std::int32_t cached_prefix_tokens = 0;
  // Submissions it has received, for the router to count those it sent that are not yet
  // in num_waiting (a burst's requests are all probed before the first arrives).
  std::int64_t num_received = 0;
};

// One replica's scheduler: runs the iteration loop (plans each step, sends it to the
// worker, fans out tokens), and answers the router's probes.
using replica_actor = front_actor::extend<
    // Its load, and how much of this prompt its prefix cache holds under this LoRA
    // adapter slot (a prefix cached under another adapter does not count).
    caf::replies_to<probe_atom, std::vector<TokenId>, std::int32_t>::with<ReplicaProbe>,
    // The router in front of it, which takes back the requests of a lost worker (once).
    caf::reacts_to<router_atom, front_actor>,
    // News of the worker supply it asked for (worker_supply.hpp).
    caf::reacts_to<supplied_atom, SupplyNews>,
    // Its node drains (replica_drain.hpp): no new requests, the queued ones move, the
    // running ones finish within the timeout (ms) or move with their tokens; then the
    // worker ends and the registry hears `drained`.
    caf::reacts_to<drain_atom, std::string, std::int64_t>,
    // The drain of this number ran out of time.
    caf::reacts_to<timeout_atom, std::uint64_t>>;

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Submission& x) {
  return f(caf::meta::type_name("troupe.Submission"), x.id, x.prompt, x.params, x.priority,
           x.requester, x.adapter, x.resumed, x.moved, x.failover_deadline_ns);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SupplyNews& x) {
  return f(caf::meta::type_name("troupe.SupplyNews"), x.number, x.stage, x.worker, x.nodes,
           x.report, x.error.code, x.error.message);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, GroupJoin& x) {
  return f(caf::meta::type_name("troupe.GroupJoin"), x.store, x.prefix, x.timeout_ms);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ReplicaProbe& x) {
  return f(caf::meta::type_name("troupe.ReplicaProbe"), x.up, x.num_waiting, x.num_running,
           x.kv_usage, x.cached_prefix_tokens, x.num_received);
}

}  // namespace troupe::actors
