// The CPU's paged attention: Highway kernels for one partition of keys (compiled once
// per SIMD target by foreach_target.h), and the plan that spreads a step's
// partitions over the thread pool.
#include "cpu/attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/thread_pool.hpp"
#include "gguf/half.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/attention.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
//
#include <hwy/contrib/math/math-inl.h>

HWY_BEFORE_NAMESPACE();
namespace troupe::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::CappedTag<float, 16>;

// A key or value element: float, or half (hwy::float16_t) promoted on load.
template <typename T>
HWY_INLINE hn::Vec<DF> load_kv(DF d, const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(d, p);
  } else {
    const hn::Rebind<hwy::float16_t, DF> dh;
    return hn::PromoteTo(d, hn::LoadU(dh, p));
  }
}

template <typename T>
HWY_INLINE float kv_scalar(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return *p;
  } else {
    std::uint16_t bits;
    std::memcpy(&bits, p, 2);
    return gguf::f16_to_f32(bits);
  }
}

constexpr int kMaxRows = 8;  // query rows that share each key or value load

// score_rows[r][slot] = scale * q_rows[r] . key[slot] for NB consecutive blocks (NB of
// block_size slots, the second's scores right after the first's), for up to kMaxRows rows
// at a time. Keys are stored transposed ([head_dim][block_size]) so that one vector holds
// a dimension of many slots and no dot product needs a horizontal sum; each broadcast of a
// query's dimension serves NB key vectors. Each score is one accumulator chain over the
// dimensions in order, whichever rows or blocks share the call.
template <typename T, int NB>
HWY_INLINE void block_scores(const float* const* q_rows, int num_rows, const T* const* k_blocks,
                             int head_dim, int block_size, float scale, float* const* score_rows) {
  const DF d;
  const int lanes = static_cast<int>(hn::Lanes(d));
  for (int r0 = 0; r0 < num_rows; r0 += kMaxRows) {
    const int rows = std::min(kMaxRows, num_rows - r0);
    const float* const* q = q_rows + r0;
    float* const* out = score_rows + r0;
    int slot = 0;
    for (; slot + lanes <= block_size; slot += lanes) {
      hn::Vec<DF> acc[kMaxRows][NB];
      for (int r = 0; r < rows; ++r)
        for (int b = 0; b < NB; ++b) acc[r][b] = hn::Zero(d);
      for (int dim = 0; dim < head_dim; ++dim) {
        hn::Vec<DF> k[NB];
        for (int b = 0; b < NB; ++b) k[b] = load_kv(d, k_blocks[b] + dim * block_size + slot);
        for (int r = 0; r < rows; ++r) {
          const auto qv = hn::Set(d, q[r][dim]);
          for (int b = 0; b < NB; ++b) acc[r][b] = hn::MulAdd(qv, k[b], acc[r][b]);
        }
      }
      for (int r = 0; r < rows; ++r)
        for (int b = 0; b < NB; ++b)
          hn::StoreU(hn::Mul(acc[r][b], hn::Set(d, scale)), d, out[r] + b * block_size + slot);
    }
    for (; slot < block_size; ++slot) {  // a block size that is not a multiple of the lanes
      for (int b = 0; b < NB; ++b) {
        for (int r = 0; r < rows; ++r) {
          float sum = 0.0f;
          for (int dim = 0; dim < head_dim; ++dim) {
            sum += q[r][dim] * kv_scalar(k_blocks[b] + dim * block_size + slot);
          }
          out[r][b * block_size + slot] = sum * scale;
        }
      }
    }
  }
}

// out_rows[r] += sum over slots < num_slots of p_rows[r][slot] * value[slot], in slot
// order, for up to kMaxRows rows at a time.
template <typename T>
HWY_INLINE void block_values(const float* const* p_rows, int num_rows, const T* v_block,
                             int head_dim, int num_slots, float* const* out_rows) {
  const DF d;
  const int lanes = static_cast<int>(hn::Lanes(d));
  for (int r0 = 0; r0 < num_rows; r0 += kMaxRows) {
    const int rows = std::min(kMaxRows, num_rows - r0);
    const float* const* p = p_rows + r0;
    float* const* out = out_rows + r0;
    int dim = 0;
    for (; dim + lanes <= head_dim; dim += lanes) {
      hn::Vec<DF> acc[kMaxRows];
      for (int r = 0; r < rows; ++r) acc[r] = hn::LoadU(d, out[r] + dim);
      for (int slot = 0; slot < num_slots; ++slot) {
        const auto v = load_kv(d, v_block + slot * head_dim + dim);
        for (int r = 0; r < rows; ++r) acc[r] = hn::MulAdd(hn::Set(d, p[r][slot]), v, acc[r]);
      }
      for (int r = 0; r < rows; ++r) hn::StoreU(acc[r], d, out[r] + dim);
    }
    for (; dim < head_dim; ++dim) {
      for (int r = 0; r < rows; ++r) {
        float acc = out[r][dim];
        for (int slot = 0; slot < num_slots; ++slot) {
          acc += p[r][slot] * kv_scalar(v_block + slot * head_dim + dim);
        }
        out[r][dim] = acc;
      }
    }
  }
}

// In place over the first n scores of a row: p = exp(score - m). Returns m and the sum
// of p, each by one fixed sequence of vector operations for a given n.
HWY_INLINE void softmax_row(float* row, int n, float& m_out, float& s_out) {
  const DF d;
  const int lanes = static_cast<int>(hn::Lanes(d));
  const auto lowest = hn::Set(d, -std::numeric_limits<float>::infinity());
  auto max = lowest;
  int i = 0;
  for (; i + lanes <= n; i += lanes) max = hn::Max(max, hn::LoadU(d, row + i));
  if (i < n)
    max = hn::Max(max, hn::IfThenElse(hn::FirstN(d, n - i), hn::LoadU(d, row + i), lowest));
  const float m = hn::GetLane(hn::MaxOfLanes(d, max));
  const auto mv = hn::Set(d, m);
  auto sum = hn::Zero(d);
  for (i = 0; i + lanes <= n; i += lanes) {
    const auto p = hn::CallExp(d, hn::Sub(hn::LoadU(d, row + i), mv));
    hn::StoreU(p, d, row + i);
    sum = hn::Add(sum, p);
  }
  if (i < n) {
    // Lanes past the row hold stale scratch: never let them into the arithmetic.
    const auto valid = hn::FirstN(d, n - i);
    const auto x = hn::IfThenElseZero(valid, hn::Sub(hn::LoadU(d, row + i), mv));
    const auto p = hn::IfThenElseZero(valid, hn::CallExp(d, x));
    hn::StoreU(p, d, row + i);
    sum = hn::Add(sum, p);
  }
  m_out = m;
  s_out = hn::GetLane(hn::SumOfLanes(d, sum));
}

// In place over the first n scores of a row: score = cap * tanh(score / cap).
HWY_INLINE void softcap_row(float* row, int n, float cap) {
  const DF d;
  const int lanes = static_cast<int>(hn::Lanes(d));
  const auto cap_v = hn::Set(d, cap);
  const auto inverse = hn::Set(d, 1.0f / cap);
  int i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto x = hn::Mul(hn::LoadU(d, row + i), inverse);
    hn::StoreU(hn::Mul(cap_v, hn::CallTanh(d, x)), d, row + i);
  }
  if (i < n) {
    const auto valid = hn::FirstN(d, n - i);
    const auto x = hn::IfThenElseZero(valid, hn::Mul(hn::LoadU(d, row + i), inverse));
    hn::BlendedStore(hn::Mul(cap_v, hn::CallTanh(d, x)), valid, d, row + i);
  }
}

template <typename T>
void partition(const PartitionJob& j) {
  const int hd = j.head_dim, bs = j.block_size;
  const int num_rows = j.num_queries * j.group;  // row r = query r / group, head r % group
  // The keys query i sees here: [key_begin, key_begin + visible(i)).
  const auto visible = [&](int i) {
    return std::clamp(j.positions[i] + 1 - j.key_begin, 0, j.num_blocks * bs);
  };
  // With a window, query i sees none of the keys before key_begin + window_start(i). Both
  // bounds ascend with i (the queries are in position order).
  const auto window_start = [&](int i) {
    if (j.window <= 0) return 0;
    return std::clamp(j.positions[i] + 1 - j.window - j.key_begin, 0, j.num_blocks * bs);
  };
  thread_local std::vector<const float*> in_rows;
  thread_local std::vector<float*> out_rows;
  in_rows.resize(static_cast<std::size_t>(num_rows));
  out_rows.resize(static_cast<std::size_t>(num_rows));
  // Scores, two key blocks at a time, each loaded once for all the rows that see any of
  // them (the queries are in position order, so those are the tile's last ones). A row
  // that sees only the first gets scores for the second too, past what it sees: never
  // read.
  // (Two only with 32 registers: on 16, the tile's 16 accumulators would spill.)
  constexpr int kBlocks = hn::MaxLanes(DF()) >= 16 ? 2 : 1;
  for (int b = 0; b < j.num_blocks; b += kBlocks) {
    const int nb = std::min(kBlocks, j.num_blocks - b);
    int first = 0;
    while (first < j.num_queries && visible(first) <= b * bs) ++first;
    int last = j.num_queries;  // the queries whose window starts past these blocks skip them
    while (last > first && window_start(last - 1) >= (b + nb) * bs) --last;
    int n = 0;
    for (int i = first; i < last; ++i) {
      for (int h = 0; h < j.group; ++h, ++n) {
        in_rows[n] = j.q + i * j.q_stride + h * hd;
        out_rows[n] = j.scores + (i * j.group + h) * j.score_stride + b * bs;
      }
    }
    const T* keys[2] = {reinterpret_cast<const T*>(j.k_blocks[b]),
                        reinterpret_cast<const T*>(j.k_blocks[b + nb - 1])};
    if (nb == 2) {
      block_scores<T, 2>(in_rows.data(), n, keys, hd, bs, j.scale, out_rows.data());
    } else {
      block_scores<T, 1>(in_rows.data(), n, keys, hd, bs, j.scale, out_rows.data());
    }
  }
  for (int i = 0; i < j.num_queries; ++i) {
    const int begin = window_start(i), end = visible(i);
    for (int h = 0; h < j.group; ++h) {
      const int r = i * j.group + h;
      std::fill(j.o + r * hd, j.o + (r + 1) * hd, 0.0f);
      if (end <= begin) {
        j.m[r] = -std::numeric_limits<float>::infinity();
        j.s[r] = 0.0f;
        continue;
      }
      float* row = j.scores + r * j.score_stride;
      if (j.softcap > 0.0f) softcap_row(row + begin, end - begin, j.softcap);
      softmax_row(row + begin, end - begin, j.m[r], j.s[r]);
      // The keys of its first block before its window weigh nothing (the blocks before
      // that one it skips).
      std::fill(row + begin / bs * bs, row + begin, 0.0f);
    }
  }
  // Values, each block loaded once for the rows that see all of it; the rows that see
  // part of it (the block holding their own position) each with their own count.
  for (int b = 0; b < j.num_blocks; ++b) {
    const T* values = reinterpret_cast<const T*>(j.v_blocks[b]);
    const auto add = [&](int first, int last, int slots) {  // queries [first, last)
      int n = 0;
      for (int i = first; i < last; ++i) {
        for (int h = 0; h < j.group; ++h, ++n) {
          const int r = i * j.group + h;
          in_rows[n] = j.scores + r * j.score_stride + b * bs;
          out_rows[n] = j.o + r * hd;
        }
      }
      block_values(in_rows.data(), n, values, hd, slots, out_rows.data());
    };
    // The slots of this block query i adds: none when its window starts past the block.
    const auto slots_of = [&](int i) {
      if (window_start(i) >= (b + 1) * bs) return 0;
      return std::min(bs, visible(i) - b * bs);
    };
    int i = 0;
    while (i < j.num_queries) {
      const int slots = slots_of(i);
      int end = i + 1;
      while (end < j.num_queries && slots_of(end) == slots) ++end;
      if (slots > 0) add(i, end, slots);
      i = end;
    }
  }
}

void AttentionPartition(const PartitionJob& job) {
  if (job.dtype == KvCacheDtype::f32) {
    partition<float>(job);
  } else {
    partition<hwy::float16_t>(job);
  }
}

}  // namespace troupe::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace troupe::cpu {

HWY_EXPORT(AttentionPartition);

void attention_partition(const PartitionJob& job) {
  HWY_DYNAMIC_DISPATCH(AttentionPartition)(job);
}

void fold_partition(float& run_m, float& run_s, float* run_o, float m, float s, const float* o,
                    std::int32_t head_dim) {
  if (s == 0.0f) return;  // the row saw no key in this partition
  if (run_s == 0.0f) {
    run_m = m;
    run_s = s;
    std::copy_n(o, head_dim, run_o);
    return;
  }
  const float new_m = std::max(run_m, m);
  const float a = std::exp(run_m - new_m), b = std::exp(m - new_m);
  run_m = new_m;
  run_s = run_s * a + s * b;
  for (std::int32_t d = 0; d < head_dim; ++d) run_o[d] = run_o[d] * a + o[d] * b;
}

namespace {

// One sequence's tile of queries with one KV head: the unit the plan hands out.
struct Item {
  std::int32_t seq = 0;
  std::int32_t first_row = 0;  // in the flat batch
  std::int32_t num_rows = 0;
  std::int32_t kv_head = 0;
  std::int32_t first_partition = 0;  // the earlier ones are all outside its queries' windows
  std::int32_t num_partitions = 0;   // from first_partition on
  std::int64_t partials = 0;         // offset of its partials when split over threads
};

// A partition's results for `rows` rows: [m: rows][s: rows][o: rows * head_dim].
std::int64_t partial_floats(std::int64_t rows, std::int32_t head_dim) {
  return rows * (2 + head_dim);
}

std::int64_t round_up(std::int64_t n, std::int64_t to) {
  return (n + to - 1) / to * to;
}

class Plan {
 public:
  Plan(const model::StepInput& step, const KvLayerView& kv, model::Tensor q,
       const model::AttentionParams& params, model::Tensor out)
      : step_(step), kv_(kv), q_(q), params_(params), out_(out) {
    group_ = params.num_heads / params.num_kv_heads;
    part_blocks_ = std::max<std::int32_t>(1, (kPartitionKeys + kv.block_size - 1) / kv.block_size);
    score_stride_ = round_up(static_cast<std::int64_t>(part_blocks_) * kv.block_size, 16);
    head_bytes_ =
        static_cast<std::int64_t>(kv.head_dim) * kv.block_size * model::kv_element_bytes(kv.dtype);
    const std::int32_t part_keys = part_blocks_ * kv.block_size;
    for (std::int32_t seq = 0; seq < step.num_seqs(); ++seq) {
      const std::int32_t begin = step.query_start[seq], end = step.query_start[seq + 1];
      // The last tiles first: they see the most keys, and the pool takes tasks in order.
      for (std::int32_t tile_end = end; tile_end > begin; tile_end -= kQueryTile) {
        const std::int32_t first = std::max(begin, tile_end - kQueryTile);
        const std::int32_t last_position = step.positions[tile_end - 1];
        // The first query's window starts first: partitions ending before it are skipped
        // (they would fold as no-ops).
        const std::int32_t window_start =
            params.window > 0 ? std::max(0, step.positions[first] + 1 - params.window) : 0;
        const std::int32_t first_partition = window_start / part_keys;
        for (std::int32_t h = 0; h < params.num_kv_heads; ++h) {
          items_.push_back({seq, first, tile_end - first, h, first_partition,
                            last_position / part_keys + 1 - first_partition, 0});
        }
      }
    }
  }

  void run(ThreadPool& pool) {
    // Few tiles for the threads (a decode batch of a few long sequences): one task per
    // partition, folded afterwards. Otherwise one task per tile, folding as it goes.
    std::int64_t split_floats = 0, split_tasks = 0;
    for (auto& item : items_) {
      item.partials = split_floats;
      split_floats +=
          item.num_partitions * partial_floats(item.num_rows * group_, params_.head_dim);
      split_tasks += item.num_partitions;
    }
    const auto num_items = static_cast<std::int64_t>(items_.size());
    const bool split = num_items < 4 * pool.num_threads() && split_tasks > num_items &&
                       split_floats <= (std::int64_t{16} << 20);
    if (!split) {
      pool.parallel_for(num_items, [&](std::int64_t i) { run_whole(items_[i]); });
      return;
    }
    // Kept across calls (the caller's thread runs every layer's plan): no allocation, and
    // no zeroing, per layer; every float is written before it is read.
    thread_local std::vector<float> partials;
    if (partials.size() < static_cast<std::size_t>(split_floats)) {
      partials.resize(static_cast<std::size_t>(split_floats));
    }
    partials_ = partials.data();
    std::vector<std::pair<std::int32_t, std::int32_t>> tasks;  // (item, partition)
    for (std::int32_t i = 0; i < num_items; ++i) {
      for (std::int32_t p = 0; p < items_[i].num_partitions; ++p) tasks.emplace_back(i, p);
    }
    pool.parallel_for(static_cast<std::int64_t>(tasks.size()), [&](std::int64_t t) {
      const Item& item = items_[tasks[t].first];
      const std::int64_t rows = item.num_rows * group_;
      float* at =
          partials_ + item.partials + tasks[t].second * partial_floats(rows, params_.head_dim);
      compute(item, item.first_partition + tasks[t].second, at);
    });
    pool.parallel_for(num_items, [&](std::int64_t i) {
      const Item& item = items_[i];
      const std::int64_t stride = partial_floats(item.num_rows * group_, params_.head_dim);
      fold_and_write(item, [&](std::int32_t p) { return partials_ + item.partials + p * stride; });
    });
  }

 private:
  // One partition of an item into `at` ([m][s][o] for its rows).
  void compute(const Item& item, std::int32_t partition, float* at) const {
    thread_local std::vector<float> scores;
    thread_local std::vector<const std::byte*> k_blocks, v_blocks;
    const std::int64_t rows = item.num_rows * group_;
    const auto table = step_.block_table(item.seq);
    const std::int32_t first_block = partition * part_blocks_;
    const std::int32_t needed =
        (step_.positions[item.first_row + item.num_rows - 1] + kv_.block_size) / kv_.block_size;
    const std::int32_t num_blocks = std::min(part_blocks_, needed - first_block);
    k_blocks.resize(static_cast<std::size_t>(num_blocks));
    v_blocks.resize(static_cast<std::size_t>(num_blocks));
    for (std::int32_t b = 0; b < num_blocks; ++b) {
      const std::int64_t offset =
          (static_cast<std::int64_t>(table[first_block + b]) * kv_.num_kv_heads + item.kv_head) *
          head_bytes_;
      k_blocks[b] = kv_.keys + offset;
      v_blocks[b] = kv_.values + offset;
    }
    // A windowed row's softmax starts mid-row: its last vector load may reach 16 floats
    // past the last row (the lanes are masked out, the memory must exist).
    scores.resize(static_cast<std::size_t>(rows * score_stride_ + 16));
    PartitionJob job;
    job.q = q_.data + item.first_row * q_.cols + item.kv_head * group_ * params_.head_dim;
    job.q_stride = q_.cols;
    job.num_queries = item.num_rows;
    job.positions = step_.positions.data() + item.first_row;
    job.group = group_;
    job.head_dim = params_.head_dim;
    job.scale = params_.scale;
    job.softcap = params_.softcap;
    job.window = params_.window;
    job.dtype = kv_.dtype;
    job.k_blocks = k_blocks.data();
    job.v_blocks = v_blocks.data();
    job.num_blocks = num_blocks;
    job.block_size = kv_.block_size;
    job.key_begin = first_block * kv_.block_size;
    job.scores = scores.data();
    job.score_stride = score_stride_;
    job.m = at;
    job.s = at + rows;
    job.o = at + 2 * rows;
    attention_partition(job);
  }

  void run_whole(const Item& item) const {
    thread_local std::vector<float> partial;
    partial.resize(
        static_cast<std::size_t>(partial_floats(item.num_rows * group_, params_.head_dim)));
    fold_and_write(item, [&](std::int32_t p) {
      compute(item, item.first_partition + p, partial.data());
      return partial.data();
    });
  }

  // Folds the item's partitions in ascending order (partition_at(p) gives the results of
  // its p-th from first_partition) and writes o / s to the output rows.
  template <typename PartitionAt>
  void fold_and_write(const Item& item, PartitionAt&& partition_at) const {
    thread_local std::vector<float> run;
    const std::int32_t hd = params_.head_dim;
    const std::int64_t rows = item.num_rows * group_;
    run.assign(static_cast<std::size_t>(partial_floats(rows, hd)), 0.0f);
    float* run_m = run.data();
    float* run_s = run_m + rows;
    float* run_o = run_s + rows;
    for (std::int32_t p = 0; p < item.num_partitions; ++p) {
      const float* at = partition_at(p);
      for (std::int64_t r = 0; r < rows; ++r) {
        fold_partition(run_m[r], run_s[r], run_o + r * hd, at[r], at[rows + r],
                       at + 2 * rows + r * hd, hd);
      }
    }
    if (params_.sinks != nullptr) {
      // A head's sink is one more key, last: its score the sink, its value nothing.
      thread_local std::vector<float> nothing;
      nothing.assign(static_cast<std::size_t>(hd), 0.0f);
      for (std::int64_t r = 0; r < rows; ++r) {
        const float sink = params_.sinks[item.kv_head * group_ + r % group_];
        fold_partition(run_m[r], run_s[r], run_o + r * hd, sink, 1.0f, nothing.data(), hd);
      }
    }
    for (std::int32_t i = 0; i < item.num_rows; ++i) {
      float* o = out_.data + (item.first_row + i) * out_.cols + item.kv_head * group_ * hd;
      for (std::int32_t h = 0; h < group_; ++h) {
        const std::int64_t r = i * group_ + h;
        const float inverse = 1.0f / run_s[r];
        for (std::int32_t d = 0; d < hd; ++d) o[h * hd + d] = run_o[r * hd + d] * inverse;
      }
    }
  }

  const model::StepInput& step_;
  const KvLayerView& kv_;
  model::Tensor q_;
  const model::AttentionParams& params_;
  model::Tensor out_;
  std::int32_t group_ = 1;
  std::int32_t part_blocks_ = 1;
  std::int64_t score_stride_ = 0;
  std::int64_t head_bytes_ = 0;  // one KV head's part of a block, keys or values
  std::vector<Item> items_;
  float* partials_ = nullptr;  // [items' partitions][m, s, o] when split
};

}  // namespace

void paged_attention(ThreadPool& pool, const model::StepInput& step, const KvLayerView& kv,
                     model::Tensor q, const model::AttentionParams& params, model::Tensor out) {
  Plan plan(step, kv, q, params, out);
  plan.run(pool);
}

}  // namespace troupe::cpu
#endif  // HWY_ONCE
