// Elastic data parallelism, the router's side (EngineConfig::elastic): while there are
// fewer replicas than the maximum, one replica's first worker is always asked for (the
// registry places it on the next node with room); once it has loaded, the replica joins
// the router at the lowest free index and takes requests. A replica whose node goes
// (lost, drained) leaves once its requests have moved, and its index is free again. The
// count is told to the engine (Engine::replica_count), the metrics and the registry
// (which reaches each index's replica when a node drains).
#pragma once

#include <cstdint>
#include <string>

#include "actors/parallel/router_actor.hpp"

namespace troupe::actors::parallel {

// The replicas there now (an index may be empty).
std::int32_t num_present(const RouterState& state);
// Tells the count to the engine and the metrics, and the replicas by index to the registry.
void publish_replicas(RouterSelf self);
// Asks for the next replica's first worker, unless one is asked for already or the
// maximum is there. Nothing for a fixed count.
void grow(RouterSelf self);
// The first worker of replica `index` loaded: the replica starts and joins (or, its supply
// failed, another is asked for in a moment).
void on_grown(RouterSelf self, std::int32_t index, SupplyNews& news);
// Replica `index` leaves with its node: nothing is sent to it from now on.
bool on_leave(RouterSelf self, std::int32_t index);
// A run-time LoRA adapter set in a slot (an empty path: emptied), for replicas that join later.
void remember_lora(RouterSelf self, std::int32_t slot, const std::string& path);

}  // namespace troupe::actors::parallel
