// The replica's hold on its worker: losing it, asking its supply (worker_supply.hpp) for
// a new one, and taking what the supply brings. The scheduler actor (scheduler_actor.cpp)
// runs these on its own state; they are apart so that the shell stays the step loop.
#pragma once

#include <string>
#include <vector>

#include "actors/replica/scheduler_actor.hpp"

namespace troupe::actors {

using SchedulerSelf = replica_actor::stateful_pointer<SchedulerState>;

// The event to its request actor; each of them.
void deliver(SchedulerSelf self, engine::AddressedEvent& event);
void deliver_all(SchedulerSelf self, std::vector<engine::AddressedEvent>& events);
// Whether the worker runs on nodes (placed by the registry), not in this process.
bool remote(SchedulerSelf self);
void set_ready(SchedulerSelf self, bool ready);
// Whether the router may send it requests: a worker, and no drain.
bool takes_requests(SchedulerSelf self);
// Counts it up (replicas_up, troupe_replica_up) or down as takes_requests() changes.
void count_up(SchedulerSelf self);
// Stops the worker, which is no longer the replica's: whatever else comes of it (its down
// notice, a late answer) is stale.
void retire_worker(SchedulerSelf self);
// Asks for a new worker; its news comes as supplied_atom messages (on_supplied).
void supply_worker(SchedulerSelf self);
// A request this replica cannot run (its worker is gone): another replica takes it,
// unseen by its caller, through the router; alone, it ends with `why`.
void hand_back(SchedulerSelf self, Submission s, const std::string& why);
// The worker is gone. A local one's KV is recomputed on its replacement; a remote one
// took its KV cache and samplers with it (a loss can be told twice: the first counts).
void lose_worker(SchedulerSelf self, const std::string& why);
// The requests a lost (or drained) worker's core gave up: ended ones hear it, the others
// go back to the router (a started one with its tokens, a migration).
void move_off(SchedulerSelf self, engine::EngineCore::LostWorker& lost, const std::string& why);
void on_supplied(SchedulerSelf self, SupplyNews& news);
// An elastic replica whose node went (its requests moved off already): the registry
// frees what it held, the router lets it go (it sends nothing here after its answer),
// and it ends.
void leave(SchedulerSelf self, const std::string& why);

// The scheduler's: plans and sends the next step, unless one is in flight or nothing can run.
void maybe_step(SchedulerSelf self);

}  // namespace troupe::actors
