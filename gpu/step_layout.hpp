// How a step lies in the GPU backend's device buffers: the host-side plan made at
// begin_step, with no CUDA in it (so it is tested on any machine). Decode-only
// steps are padded to a CUDA-graph batch size; padding rows have no sequence
// (attention writes zeros) and no KV slot (nothing is stored).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "gpu/kernel_types.hpp"
#include "model/step_input.hpp"

namespace troupe::gpu {

// The longest context a decode graph serves (vLLM's max_seq_len_to_capture): longer steps
// run eagerly, so that no graph's grid or scratch is sized by a 128K-token model.
inline constexpr std::int32_t kGraphMaxContext = 8192;

struct GraphPolicy {
  bool enabled = true;
  std::int32_t max_batch = 256;    // largest decode batch replayed from a graph
  std::int32_t max_model_len = 0;  // the longest sequence a graph serves (0: no graphs)
};

// The decode partitions a graph launches for steps whose longest context needs `needed`:
// the next power of two, so that a step's grid is at most twice its work and a few graphs
// per batch size cover every length up to the graphs' reach.
std::int32_t graph_splits_for(std::int32_t needed);

// Keys a decode partition covers in a step of `decode_rows` single-query rows: small
// batches split finer so that their few rows still spread over the device's multiprocessors,
// larger ones take kernels::kDecodePartition.
std::int32_t decode_partition_for(std::int32_t decode_rows);

// Floats of decode scratch ("partials") for `rows` decode rows of `num_heads` heads over
// `num_splits` partitions: rows x heads x splits x (head_dim + 2). None for one split.
std::int64_t decode_partial_floats(std::int64_t rows, std::int32_t num_heads,
                                   std::int32_t num_splits, std::int32_t head_dim);
// The decode rows one attention launch may take so that its partials fit in
// `capacity_floats` (at least one, all when they fit): longer steps launch in chunks.
std::int32_t decode_rows_per_launch(std::int64_t capacity_floats, std::int32_t num_decode_rows,
                                    std::int32_t num_heads, std::int32_t num_splits,
                                    std::int32_t head_dim);
// The scratch reserved before the KV pool is sized: a whole graph batch at the graphs'
// reach in one launch. Eager steps beyond it launch in chunks within it.
std::int64_t reserved_decode_floats(const GraphPolicy& policy, std::int32_t num_heads,
                                    std::int32_t head_dim);

// The batch sizes graphs are recorded for: 1, 2, 4, 8, then steps of 8 up to 64, of 16
// up to 128 and of 32 beyond, as vLLM does, and max_batch itself.
std::vector<std::int32_t> graph_batch_sizes(std::int32_t max_batch);
// The smallest graph batch size holding n sequences, or 0 when none does.
std::int32_t graph_batch_for(std::int32_t n, std::int32_t max_batch);

struct StepLayout {
  std::int32_t rows = 0;          // >= num_tokens
  std::int32_t logit_rows = 0;    // >= the step's logit rows
  std::int32_t real_rows = 0;     // the step's own tokens
  bool graph = false;             // a decode-only step padded to a graph batch size
  std::int64_t graph_key = 0;     // the graph it replays: its batch and its split count
                                  // (the partition follows from the batch)
  std::int32_t block_stride = 0;  // ints per block-table row
  std::int32_t num_splits = 1;    // decode attention partitions: by the longest decode row
  std::int32_t partition = kernels::kDecodePartition;             // keys each of them covers
  std::vector<std::int32_t> tokens, positions, token_seq, slots;  // [rows]
  std::vector<std::int32_t> logit_row_index;                      // [logit_rows]
  std::vector<std::int32_t> decode_rows;                          // single-query rows
  std::vector<kernels::PrefillTile> tiles;                        // the other rows, in tiles
  std::vector<std::int32_t> block_tables;                         // [num_seqs, block_stride]
  std::vector<std::int32_t> lora_slots;  // [rows] each row's adapter slot; empty: none used
};

// The rows a step runs on (what step_shape reports): padded for graph-eligible steps.
std::int32_t planned_rows(const model::StepInput& step, const GraphPolicy& policy);

// Lays the step out. `block_size` is the cache's; the step must have passed validate_step.
StepLayout plan_step(const model::StepInput& step, std::int32_t block_size,
                     const GraphPolicy& policy);

}  // namespace troupe::gpu
