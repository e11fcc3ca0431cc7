// The cluster as JSON: GET /v1/cluster (nodes and replicas) and /health's body.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/engine.hpp"

namespace troupe::net {

// {"status":"ok"|"unavailable","replicas_up":N,"replicas":M}
std::string health_json(std::int32_t replicas_up, std::int32_t replicas);

// {"nodes":[...],"replicas":[...]}: each node's resources and the replica it runs; each
// replica's node, state, load, KV usage, prefix-cache size and what the router sent it.
std::string cluster_json(const std::vector<NodeStatus>& nodes,
                         const std::vector<ReplicaStats>& replicas);

}  // namespace troupe::net
