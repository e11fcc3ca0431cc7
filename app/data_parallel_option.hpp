// --data-parallel-size (--dp): a fixed number of replicas (a spare node stays a standby),
// a range MIN:MAX, or auto (1 up to as many as nodes join). With a range or auto the
// replicas are elastic: each node that joins with room while serving gets one, up to the
// maximum, and a node that leaves takes its replica with it (docs/cluster.md).
#pragma once

#include <cstdint>
#include <string_view>

#include "troupe/result.hpp"

namespace troupe::app {

struct DataParallelSize {
  std::int32_t min = 1;  // fixed: the count; elastic: the least the head waits for at start
  std::int32_t max = 0;  // 0: fixed; EngineConfig::kUnboundedReplicas: auto
};

// The most replicas a number may name.
inline constexpr std::int32_t kMostReplicas = 1024;

// Reads "N", "MIN:MAX" or "auto"; an error says what is wrong with the value.
Result<DataParallelSize> parse_data_parallel_size(std::string_view text);

}  // namespace troupe::app
