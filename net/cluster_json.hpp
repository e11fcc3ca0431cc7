// The cluster as JSON: GET /v1/cluster (nodes and replicas) and /health's body.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/engine.hpp"

namespace troupe::net {

// {"status":"ok"|"unavailable","replicas_up":N,"replicas":M,"replicas_min":A,
// "replicas_max":B}: replicas up, there now, and the range they move in (B null: no cap).
std::string health_json(const ReplicaCount& count);

// {"nodes":[...],"replicas":[...],"replica_count":{...}}: each node's resources and the
// replica it runs; each replica's node, state, load, KV usage, prefix-cache size and what
// the router sent it; how many replicas are up and there, their range, whether elastic.
std::string cluster_json(const std::vector<NodeStatus>& nodes,
                         const std::vector<ReplicaStats>& replicas, const ReplicaCount& count);

}  // namespace troupe::net
