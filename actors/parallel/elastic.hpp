// Elastic data parallelism, the router's side (EngineConfig::elastic): while there are
// fewer replicas than the maximum, one replica's first worker always waits for a node
// (the registry places it on the next node with room). Once it is placed, the next one is
// asked for at once, so that a node joining while another's worker loads is placed too;
// once a worker has loaded, its replica joins the router at its index and takes requests.
// A replica whose node goes (lost, drained) leaves once its requests have moved, and its
// index is free again. The count is told to the engine (Engine::replica_count), the
// metrics and the registry (which reaches each index's replica when a node drains).
#pragma once

#include <cstdint>
#include <string>

#include "actors/parallel/router_actor.hpp"

namespace troupe::actors::parallel {

// The replicas there now (an index may be empty).
std::int32_t num_present(const RouterState& state);
// Tells the count to the engine and the metrics, and the replicas by index to the registry.
void publish_replicas(RouterSelf self);
// Asks for the next replica's first worker, unless one waits for a node already or the
// replicas there and loading make the maximum. Nothing for a fixed count.
void grow(RouterSelf self);
// News of replica `index`'s first worker: placed (the next is asked for), loaded (the
// replica starts and joins), or its supply failed (another is asked for in a moment).
void on_grown(RouterSelf self, std::int32_t index, SupplyNews& news);
// Replica `index` leaves with its node: nothing is sent to it from now on.
bool on_leave(RouterSelf self, std::int32_t index);
// A run-time LoRA adapter set in a slot (an empty path: emptied), for replicas that join later.
void remember_lora(RouterSelf self, std::int32_t slot, const std::string& path);

}  // namespace troupe::actors::parallel
