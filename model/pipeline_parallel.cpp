#include "model/pipeline_parallel.hpp"

#include <algorithm>
#include <charconv>
#include <limits>

namespace troupe::model {

Result<std::vector<LayerRange>> stage_layers(std::int32_t num_layers, std::int32_t num_stages,
                                             std::span<const std::int32_t> partition) {
  auto refuse = [](const std::string& why) {
    return make_error(ErrorCode::invalid_argument, "pipeline stages: " + why);
  };
  if (num_stages < 1) {
    return refuse("a pipeline needs at least one stage, not " + std::to_string(num_stages));
  }
  if (num_stages > num_layers) {
    return refuse("a model of " + std::to_string(num_layers) + " layers cannot be cut into " +
                  std::to_string(num_stages) + " stages (at most one stage a layer)");
  }
  std::vector<std::int32_t> counts;
  if (partition.empty()) {
    for (std::int32_t s = 0; s < num_stages; ++s) {
      counts.push_back(num_layers / num_stages + (s < num_layers % num_stages ? 1 : 0));
    }
  } else {
    if (static_cast<std::int32_t>(partition.size()) != num_stages) {
      return refuse("the layer partition has " + std::to_string(partition.size()) +
                    " stages, the pipeline " + std::to_string(num_stages));
    }
    std::int64_t sum = 0;
    for (const std::int32_t n : partition) {
      if (n < 1) return refuse("every stage of the layer partition needs at least one layer");
      sum += n;
    }
    if (sum != num_layers) {
      return refuse("the layer partition adds up to " + std::to_string(sum) +
                    " layers, the model has " + std::to_string(num_layers));
    }
    counts.assign(partition.begin(), partition.end());
  }
  std::vector<LayerRange> stages;
  std::int32_t begin = 0;
  for (const std::int32_t n : counts) {
    stages.push_back({begin, begin + n});
    begin += n;
  }
  return stages;
}

std::vector<std::int32_t> balance_layers(std::span<const double> layer_costs,
                                         double last_stage_cost, std::int32_t num_stages) {
  const auto n = static_cast<std::int32_t>(layer_costs.size());
  if (num_stages < 1 || num_stages > n) return {};
  std::vector<double> prefix(static_cast<std::size_t>(n) + 1, 0.0);
  for (std::int32_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + layer_costs[i];
  const double unreachable = std::numeric_limits<double>::infinity();
  const auto at = [n](std::int32_t s, std::int32_t i) {
    return static_cast<std::size_t>(s) * static_cast<std::size_t>(n + 1) +
           static_cast<std::size_t>(i);
  };
  // best[s][i]: the least costliest stage of the first i layers in s stages; cut[s][i]:
  // where the last of those s stages begins.
  std::vector<double> best(static_cast<std::size_t>(num_stages + 1) * (n + 1), unreachable);
  std::vector<std::int32_t> cut(best.size(), 0);
  best[at(0, 0)] = 0.0;
  for (std::int32_t s = 1; s <= num_stages; ++s) {
    for (std::int32_t i = s; i <= n; ++i) {
      const double extra = s == num_stages && i == n ? last_stage_cost : 0.0;
      // The latest start first: among equals, the earlier stages keep more layers.
      for (std::int32_t j = i - 1; j >= s - 1; --j) {
        const double cost = std::max(best[at(s - 1, j)], prefix[i] - prefix[j] + extra);
        if (cost < best[at(s, i)]) {
          best[at(s, i)] = cost;
          cut[at(s, i)] = j;
        }
      }
    }
  }
  std::vector<std::int32_t> counts(static_cast<std::size_t>(num_stages));
  for (std::int32_t s = num_stages, i = n; s >= 1; --s) {
    const std::int32_t j = cut[at(s, i)];
    counts[static_cast<std::size_t>(s - 1)] = i - j;
    i = j;
  }
  return counts;
}

Result<PipelineStage> pipeline_stage(std::int32_t num_layers, std::int32_t index,
                                     std::int32_t num_stages,
                                     std::span<const std::int32_t> partition) {
  TROUPE_TRY(const auto stages, stage_layers(num_layers, num_stages, partition));
  if (index < 0 || index >= num_stages) {
    return make_error(ErrorCode::invalid_argument, "pipeline stage " + std::to_string(index) +
                                                       " of " + std::to_string(num_stages));
  }
  const LayerRange& r = stages[static_cast<std::size_t>(index)];
  return PipelineStage{index, num_stages, r.begin, r.end};
}

Result<std::vector<std::int32_t>> parse_layer_partition(std::string_view text) {
  std::vector<std::int32_t> counts;
  auto refuse = [&] {
    return make_error(ErrorCode::invalid_argument,
                      "a layer partition is layer counts separated by commas (\"6,6\"), not \"" +
                          std::string(text) + "\"");
  };
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    std::string_view part = text.substr(at, comma - at);
    while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
    while (!part.empty() && part.back() == ' ') part.remove_suffix(1);
    std::int32_t n = 0;
    const auto [end, error] = std::from_chars(part.data(), part.data() + part.size(), n);
    if (part.empty() || error != std::errc{} || end != part.data() + part.size()) return refuse();
    counts.push_back(n);
    at = comma + 1;
  }
  return counts;
}

std::string describe_stages(std::span<const LayerRange> stages) {
  std::string text;
  for (const LayerRange& r : stages) {
    if (!text.empty()) text += ' ';
    text += "[" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ")";
  }
  return text;
}

}  // namespace troupe::model
