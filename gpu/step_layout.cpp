#include "gpu/step_layout.hpp"

#include <algorithm>

namespace troupe::gpu {

namespace {

// Every sequence brings one token and wants its logits, in order.
bool is_decode_only(const model::StepInput& step) {
  if (step.num_seqs() == 0 || step.num_tokens() != step.num_seqs()) return false;
  if (step.logit_rows.size() != static_cast<std::size_t>(step.num_tokens())) return false;
  for (std::int32_t i = 0; i < step.num_tokens(); ++i) {
    if (step.logit_rows[i] != i) return false;
  }
  return true;
}

std::int32_t blocks_for(std::int32_t tokens, std::int32_t block_size) {
  return (tokens + block_size - 1) / block_size;
}

bool uses_adapters(const model::StepInput& step) {
  return std::any_of(step.adapters.begin(), step.adapters.end(), [](auto a) { return a != 0; });
}

// The graph batch a step would replay, or 0. A step with LoRA adapters runs eagerly: a
// graph would fix which rows take which adapter.
std::int32_t graph_rows(const model::StepInput& step, const GraphPolicy& policy) {
  if (!policy.enabled || policy.max_model_len <= 0 || !is_decode_only(step)) return 0;
  if (uses_adapters(step)) return 0;
  for (const std::int32_t length : step.context_lens) {
    if (length > policy.max_model_len) return 0;
  }
  return graph_batch_for(step.num_seqs(), policy.max_batch);
}

}  // namespace

std::vector<std::int32_t> graph_batch_sizes(std::int32_t max_batch) {
  std::vector<std::int32_t> sizes;
  for (std::int32_t b : {1, 2, 4}) {
    if (b <= max_batch) sizes.push_back(b);
  }
  for (std::int32_t b = 8; b <= max_batch; b += b < 64 ? 8 : (b < 128 ? 16 : 32)) {
    sizes.push_back(b);
  }
  // The largest batch always has a graph of its own size.
  if (max_batch > 0 && (sizes.empty() || sizes.back() < max_batch)) sizes.push_back(max_batch);
  return sizes;
}

std::int32_t graph_batch_for(std::int32_t n, std::int32_t max_batch) {
  if (n <= 0) return 0;
  for (const std::int32_t b : graph_batch_sizes(max_batch)) {
    if (b >= n) return b;
  }
  return 0;
}

std::int32_t graph_splits_for(std::int32_t needed) {
  std::int32_t splits = 1;
  while (splits < needed) splits *= 2;
  return splits;
}

std::int32_t decode_partition_for(std::int32_t decode_rows) {
  // Batch 1 at 512 keys in partitions of 256 was 16 blocks for an H200's 132 multiprocessors
  // (Llama-3-8B's 8 KV heads): each block latency-bound, 42 us a layer (ncu). In partitions
  // of 64 it is 64 blocks of a quarter of the keys each.
  if (decode_rows <= 2) return 64;
  if (decode_rows <= 8) return 128;
  return kernels::kDecodePartition;
}

std::int64_t decode_partial_floats(std::int64_t rows, std::int32_t num_heads,
                                   std::int32_t num_splits, std::int32_t head_dim) {
  if (num_splits <= 1) return 0;
  return rows * num_heads * num_splits * (std::int64_t{head_dim} + 2);
}

std::int32_t decode_rows_per_launch(std::int64_t capacity_floats, std::int32_t num_decode_rows,
                                    std::int32_t num_heads, std::int32_t num_splits,
                                    std::int32_t head_dim) {
  const std::int64_t per_row = decode_partial_floats(1, num_heads, num_splits, head_dim);
  if (per_row == 0 || num_decode_rows <= 0) return std::max(1, num_decode_rows);
  const std::int64_t fit = std::max<std::int64_t>(1, capacity_floats / per_row);
  return static_cast<std::int32_t>(std::min<std::int64_t>(fit, num_decode_rows));
}

std::int64_t reserved_decode_floats(const GraphPolicy& policy, std::int32_t num_heads,
                                    std::int32_t head_dim) {
  const std::int32_t reach =
      policy.enabled && policy.max_model_len > 0 ? policy.max_model_len : kGraphMaxContext;
  // Each graph batch at its own partition; the largest batch is the most, unless it is small.
  std::int64_t most = 0;
  for (const std::int32_t rows : graph_batch_sizes(std::max(1, policy.max_batch))) {
    const std::int32_t splits =
        graph_splits_for(blocks_for(std::min(reach, kGraphMaxContext), decode_partition_for(rows)));
    most = std::max(most, decode_partial_floats(rows, num_heads, splits, head_dim));
  }
  return most;
}

std::int32_t planned_rows(const model::StepInput& step, const GraphPolicy& policy) {
  const std::int32_t padded = graph_rows(step, policy);
  return padded > 0 ? padded : step.num_tokens();
}

StepLayout plan_step(const model::StepInput& step, std::int32_t block_size,
                     const GraphPolicy& policy) {
  StepLayout l;
  const std::int32_t n = step.num_tokens();
  const std::int32_t padded = graph_rows(step, policy);
  l.graph = padded > 0;
  l.real_rows = n;
  l.rows = l.graph ? padded : n;
  l.logit_rows = l.graph ? padded : static_cast<std::int32_t>(step.logit_rows.size());

  // Decode attention splits by the longest context among the decode rows (a long prefill
  // beside them has tiles of its own). A graph's split count is that rounded up to a power
  // of two, and its block tables reach as far: both are fixed in what it recorded, so
  // they are part of its key.
  std::int32_t longest = 0, longest_decode = 0, num_decode = 0;
  for (std::int32_t s = 0; s < step.num_seqs(); ++s) {
    longest = std::max(longest, step.context_lens[s]);
    if (step.query_start[s + 1] - step.query_start[s] == 1) {
      longest_decode = std::max(longest_decode, step.context_lens[s]);
      ++num_decode;
    }
  }
  // A graph's partition follows from its padded batch, so the batch in its key fixes it.
  l.partition = decode_partition_for(l.graph ? l.rows : num_decode);
  const std::int32_t needed = std::max(1, blocks_for(longest_decode, l.partition));
  if (l.graph) {
    l.num_splits = graph_splits_for(needed);
    const std::int32_t reach = std::min(l.num_splits * l.partition, policy.max_model_len);
    l.block_stride = std::max({1, step.max_blocks_per_seq, blocks_for(reach, block_size)});
    l.graph_key = (std::int64_t{l.rows} << 32) | (std::int64_t{l.num_splits} << 16) |
                  std::min<std::int64_t>(l.block_stride, 0xffff);
  } else {
    l.num_splits = needed;
    l.block_stride = std::max({1, step.max_blocks_per_seq, blocks_for(longest, block_size)});
  }

  l.tokens.assign(l.rows, 0);
  l.positions.assign(l.rows, 0);
  l.token_seq.assign(l.rows, -1);
  l.slots.assign(l.rows, -1);
  l.block_tables.assign(static_cast<std::size_t>(step.num_seqs()) * l.block_stride, 0);
  for (std::int32_t s = 0; s < step.num_seqs(); ++s) {
    const auto table = step.block_table(s);
    std::copy(table.begin(), table.end(),
              l.block_tables.begin() + static_cast<std::ptrdiff_t>(s) * l.block_stride);
    const std::int32_t first = step.query_start[s], last = step.query_start[s + 1];
    for (std::int32_t t = first; t < last; ++t) {
      const std::int32_t position = step.positions[t];
      l.tokens[t] = step.tokens[t];
      l.positions[t] = position;
      l.token_seq[t] = s;
      l.slots[t] = table[position / block_size] * block_size + position % block_size;
    }
    if (last - first == 1) {
      l.decode_rows.push_back(first);
    } else {
      for (std::int32_t t = first; t < last; t += kernels::kPrefillTile) {
        l.tiles.push_back({t, std::min(kernels::kPrefillTile, last - t)});
      }
    }
  }
  if (uses_adapters(step)) {
    l.lora_slots.assign(l.rows, 0);
    for (std::int32_t s = 0; s < step.num_seqs(); ++s) {
      std::fill(l.lora_slots.begin() + step.query_start[s],
                l.lora_slots.begin() + step.query_start[s + 1], step.adapters[s]);
    }
  }
  l.logit_row_index.assign(l.logit_rows, 0);
  for (std::size_t i = 0; i < step.logit_rows.size(); ++i)
    l.logit_row_index[i] = step.logit_rows[i];
  // Padding rows: decoded (to zeros) like the rest, their logits computed and ignored.
  for (std::int32_t t = n; t < l.rows; ++t) {
    l.decode_rows.push_back(t);
    l.logit_row_index[t] = t;
  }
  return l;
}

}  // namespace troupe::gpu
