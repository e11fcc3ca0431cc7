// Pipeline parallelism: a model's layers cut into contiguous stages, each a worker of its
// own. Stage 0 holds the token embedding, the last stage the output norm, the LM head and
// the sampling; every stage holds only its layers' weights and KV cache. A step runs on
// every stage with the same StepInput: stage s > 0 receives the hidden states [tokens, dim]
// from stage s - 1 (Communicator::recv), runs its layers and sends them on
// (Communicator::send). One step is in flight at a time (no micro-batches yet).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/result.hpp"

namespace troupe::model {

// One stage of a pipeline: which of how many, and its layers [layer_begin, layer_end).
// The default is the whole model (layer_end 0: every layer).
struct PipelineStage {
  std::int32_t index = 0;
  std::int32_t count = 1;
  std::int32_t layer_begin = 0;
  std::int32_t layer_end = 0;

  bool is_staged() const { return count > 1; }
  bool is_first() const { return index == 0; }
  bool is_last() const { return index + 1 == count; }
};

struct LayerRange {
  std::int32_t begin = 0;
  std::int32_t end = 0;
  bool operator==(const LayerRange&) const = default;
};

// The layers of each of `num_stages` stages of a model of `num_layers`: `partition` (each
// stage's layer count, in stage order, as vLLM's VLLM_PP_LAYER_PARTITION) when given, else
// balanced (equal counts, one more to each of the first num_layers % num_stages stages).
// Refused: fewer than one stage, more stages than layers, a partition of another length,
// with a stage of no layers, or that does not add up to the layers.
Result<std::vector<LayerRange>> stage_layers(std::int32_t num_layers, std::int32_t num_stages,
                                             std::span<const std::int32_t> partition = {});

// The contiguous split of layers costing `layer_costs` into `num_stages` stages of at least
// one layer each whose costliest stage costs least, the last stage paying `last_stage_cost`
// too (the output norm and the head). Among equal splits, the one whose earlier stages take
// more layers (so equal costs split as stage_layers' balanced default does). The counts, in
// stage order; empty where there are fewer layers than stages.
std::vector<std::int32_t> balance_layers(std::span<const double> layer_costs,
                                         double last_stage_cost, std::int32_t num_stages);

// The stage `index` of `num_stages` of a model of `num_layers` (stage_layers' range).
Result<PipelineStage> pipeline_stage(std::int32_t num_layers, std::int32_t index,
                                     std::int32_t num_stages,
                                     std::span<const std::int32_t> partition = {});

// "6,6" -> {6, 6}: a layer partition as a command line gives it (spaces allowed).
Result<std::vector<std::int32_t>> parse_layer_partition(std::string_view text);

// "[0, 6) [6, 12)", for people (logs, /v1/cluster).
std::string describe_stages(std::span<const LayerRange> stages);

}  // namespace troupe::model
