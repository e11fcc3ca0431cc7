// A replica's part in a node's drain (docs/cluster.md, "Draining a node"): the registry
// tells each replica on a draining node to drain. The replica then takes no new requests
// (the router skips it, and one routed here before it knew moves on), hands its queued
// requests back to the router, and lets the running ones finish; at the drain's timeout
// what still runs moves to another replica with the tokens it sent, as after a loss. Then
// its worker ends, the registry hears `drained` (and releases the node once all its
// replicas have), and the replica asks for a worker elsewhere.
#pragma once

#include <cstdint>
#include <string>

#include "actors/replica/worker_keeping.hpp"

namespace troupe::actors {

// Starts the drain off `node` (no-op where the replica's worker is not there).
void start_drain(SchedulerSelf self, const std::string& node, std::int64_t timeout_ms);
// Ends the drain once nothing runs here any more, or its time is up, and no step is in
// flight (before each step is planned, and after a cancel); true when it ended it.
bool check_drained(SchedulerSelf self);
// The drain numbered `number` ran out of time: what still runs moves now.
void drain_timed_out(SchedulerSelf self, std::uint64_t number);

}  // namespace troupe::actors
