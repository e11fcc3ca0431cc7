// The CPU's paged attention against a double-precision reference at contexts up to
// 8K keys, in F32 and F16 caches, and bit-identical whatever else shares the step:
// other sequences, the query tile a token sits in, and the number of threads.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "cpu/attention.hpp"
#include "cpu/cpu_backend.hpp"
#include "gguf/half.hpp"

using namespace troupe;
using namespace troupe::model;
using troupe::cpu::CpuBackend;

namespace {

std::vector<float> random_floats(std::mt19937& rng, std::size_t n) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

// What the cache holds of a value: itself, or its nearest half.
float stored(float x, KvCacheDtype dtype) {
  return dtype == KvCacheDtype::f32 ? x : gguf::f16_to_f32(gguf::f32_to_f16(x));
}

struct Shape {
  std::int32_t block_size, heads, kv_heads, head_dim;
};

// One sequence's keys and values at every position, and its blocks, scattered.
struct History {
  std::int32_t length = 0;
  std::vector<float> keys, values;  // [length, kv_heads * head_dim]
  std::vector<std::int32_t> table;
};

// A backend whose cache holds every history, written through store_kv as an engine would.
class Fixture {
 public:
  Fixture(const Shape& shape, KvCacheDtype dtype, int threads, std::int32_t num_blocks)
      : shape_(shape), dtype_(dtype), backend_(threads) {
    KvCacheShape kv{1, num_blocks, shape.block_size, shape.kv_heads, shape.head_dim, dtype};
    REQUIRE(backend_.allocate_kv_cache(kv).has_value());
  }

  void store(const History& h) {
    StepInput step;
    append_sequence(step, std::vector<TokenId>(h.length, 0), 0, h.table, false);
    REQUIRE(backend_.begin_step(step).has_value());
    const std::int64_t kv_dim = shape_.kv_heads * shape_.head_dim;
    auto k = *backend_.allocate(h.length, kv_dim);
    auto v = *backend_.allocate(h.length, kv_dim);
    std::copy(h.keys.begin(), h.keys.end(), k.data);
    std::copy(h.values.begin(), h.values.end(), v.data);
    backend_.store_kv(0, k, v);
    backend_.release(k);
    backend_.release(v);
  }

  // Attention of the step's queries (q: [num_tokens, heads * head_dim]).
  std::vector<float> attend(const StepInput& step, const std::vector<float>& q) {
    REQUIRE(backend_.begin_step(step).has_value());
    const std::int64_t q_dim = shape_.heads * shape_.head_dim;
    auto qt = *backend_.allocate(step.num_tokens(), q_dim);
    auto out = *backend_.allocate(step.num_tokens(), q_dim);
    std::copy(q.begin(), q.end(), qt.data);
    std::fill(out.data, out.data + out.rows * out.cols, std::nanf(""));
    backend_.attention(0, qt, params(), out);
    std::vector<float> result(out.data, out.data + out.rows * out.cols);
    backend_.release(qt);
    backend_.release(out);
    return result;
  }

  AttentionParams params() const {
    AttentionParams p{shape_.heads, shape_.kv_heads, shape_.head_dim,
                      1.0f / std::sqrt(static_cast<float>(shape_.head_dim))};
    p.window = window_;
    p.softcap = softcap_;
    return p;
  }
  // Gemma-2 style attention: keys within `window` of the query (0: all), scores capped.
  void limit(std::int32_t window, float softcap) {
    window_ = window;
    softcap_ = softcap;
  }

 private:
  std::int32_t window_ = 0;
  float softcap_ = 0.0f;
  Shape shape_;
  KvCacheDtype dtype_;
  CpuBackend backend_;
};

// Histories of the given lengths over disjoint, shuffled blocks of a pool of num_blocks.
std::vector<History> make_histories(std::mt19937& rng, const Shape& shape,
                                    const std::vector<std::int32_t>& lengths,
                                    std::int32_t num_blocks) {
  std::vector<std::int32_t> free_blocks(num_blocks);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  std::size_t next = 0;
  std::vector<History> out;
  const auto kv_dim = static_cast<std::size_t>(shape.kv_heads * shape.head_dim);
  for (std::int32_t length : lengths) {
    History h;
    h.length = length;
    h.keys = random_floats(rng, length * kv_dim);
    h.values = random_floats(rng, length * kv_dim);
    h.table.resize((length + shape.block_size - 1) / shape.block_size);
    for (auto& b : h.table) b = free_blocks.at(next++);
    out.push_back(std::move(h));
  }
  return out;
}

std::int32_t blocks_for(const Shape& shape, const std::vector<std::int32_t>& lengths) {
  std::int32_t n = 0;
  for (auto l : lengths) n += (l + shape.block_size - 1) / shape.block_size;
  return n;
}

// The step's query rows: the last `queries[s]` positions of each history s.
StepInput make_step(const std::vector<History>& histories,
                    const std::vector<std::int32_t>& queries) {
  StepInput step;
  for (std::size_t s = 0; s < histories.size(); ++s) {
    const auto& h = histories[s];
    append_sequence(step, std::vector<TokenId>(queries[s], 0), h.length - queries[s], h.table,
                    true);
  }
  return step;
}

// Double-precision attention of query `row` (at position `pos` of history h) for one
// head: keys j in (pos - window, pos] (all j <= pos when window is 0), scores scaled and
// then capped.
std::vector<double> reference_head(const Shape& shape, const History& h,
                                   const std::vector<float>& q, std::int32_t row, std::int32_t pos,
                                   std::int32_t head, const AttentionParams& params,
                                   KvCacheDtype dtype) {
  const std::int32_t q_dim = shape.heads * shape.head_dim, kv_dim = shape.kv_heads * shape.head_dim,
                     hd = shape.head_dim;
  const std::int32_t kvh = head / (shape.heads / shape.kv_heads);
  const std::int32_t first = params.window > 0 ? std::max(0, pos - params.window + 1) : 0;
  std::vector<double> p(pos + 1 - first);
  double max = -1e300, sum = 0.0;
  for (std::int32_t j = first; j <= pos; ++j) {
    double dot = 0.0;
    for (std::int32_t d = 0; d < hd; ++d) {
      dot += static_cast<double>(q[row * q_dim + head * hd + d]) *
             stored(h.keys[j * kv_dim + kvh * hd + d], dtype);
    }
    double score = dot * params.scale;
    if (params.softcap > 0.0f) score = params.softcap * std::tanh(score / params.softcap);
    p[j - first] = score;
    max = std::max(max, score);
  }
  for (auto& x : p) sum += (x = std::exp(x - max));
  std::vector<double> out(hd, 0.0);
  for (std::int32_t d = 0; d < hd; ++d) {
    for (std::int32_t j = first; j <= pos; ++j) {
      out[d] += p[j - first] / sum * stored(h.values[j * kv_dim + kvh * hd + d], dtype);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("paged attention matches the reference up to 8K keys, in F32 and F16 caches",
          "[cpu][attention]") {
  std::mt19937 rng(7);
  // Small blocks and heads (the scalar edges of the kernels), grouped query heads, and
  // a head_dim that is not a multiple of the vector.
  for (const Shape shape : {Shape{4, 4, 2, 8}, Shape{16, 8, 2, 64}, Shape{32, 6, 6, 40}}) {
    for (const KvCacheDtype dtype : {KvCacheDtype::f32, KvCacheDtype::f16}) {
      INFO("block " << shape.block_size << " heads " << shape.heads << "/" << shape.kv_heads
                    << " head_dim " << shape.head_dim << " dtype "
                    << (dtype == KvCacheDtype::f32 ? "f32" : "f16"));
      // A fresh prefill, a chunk after 9 cached tokens, a decode after 21, a chunk that
      // crosses a partition boundary, and a decode at 8K keys.
      const std::vector<std::int32_t> lengths = {6, 14, 22, 530, 8192};
      const std::vector<std::int32_t> queries = {6, 5, 1, 40, 1};
      const std::int32_t num_blocks = blocks_for(shape, lengths);
      const auto histories = make_histories(rng, shape, lengths, num_blocks);
      Fixture fixture(shape, dtype, 2, num_blocks);
      for (const auto& h : histories) fixture.store(h);
      const StepInput step = make_step(histories, queries);
      const std::int32_t q_dim = shape.heads * shape.head_dim,
                         kv_dim = shape.kv_heads * shape.head_dim, hd = shape.head_dim;
      const auto q = random_floats(rng, static_cast<std::size_t>(step.num_tokens()) * q_dim);
      const auto got = fixture.attend(step, q);
      const float scale = fixture.params().scale;
      for (std::size_t s = 0; s < histories.size(); ++s) {
        const auto& h = histories[s];
        for (std::int32_t i = 0; i < queries[s]; ++i) {
          const std::int32_t row = step.query_start[s] + i, pos = h.length - queries[s] + i;
          for (std::int32_t head = 0; head < shape.heads; ++head) {
            const std::int32_t kvh = head / (shape.heads / shape.kv_heads);
            std::vector<double> p(pos + 1);
            double max = -1e300, sum = 0.0;
            for (std::int32_t j = 0; j <= pos; ++j) {
              double dot = 0.0;
              for (std::int32_t d = 0; d < hd; ++d) {
                dot += static_cast<double>(q[row * q_dim + head * hd + d]) *
                       stored(h.keys[j * kv_dim + kvh * hd + d], dtype);
              }
              p[j] = dot * scale;
              max = std::max(max, p[j]);
            }
            for (auto& x : p) sum += (x = std::exp(x - max));
            for (std::int32_t d = 0; d < hd; ++d) {
              double want = 0.0, magnitude = 0.0;
              for (std::int32_t j = 0; j <= pos; ++j) {
                const double term = p[j] / sum * stored(h.values[j * kv_dim + kvh * hd + d], dtype);
                want += term;
                magnitude += std::fabs(term);
              }
              const float value = got[row * q_dim + head * hd + d];
              INFO("sequence " << s << " position " << pos << " head " << head << " dim " << d
                               << ": got " << value << ", want " << want);
              REQUIRE(std::isfinite(value));
              REQUIRE(std::fabs(value - want) <= 2e-5 * (magnitude + 1e-3));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("a query's attention is bit-identical alone, in a tile, in a batch and on 1 to 3 threads",
          "[cpu][attention]") {
  std::mt19937 rng(11);
  for (const KvCacheDtype dtype : {KvCacheDtype::f32, KvCacheDtype::f16}) {
    const Shape shape{16, 8, 2, 64};
    // The sequence under test (3000 keys: twelve partitions) and seven others.
    const std::vector<std::int32_t> lengths = {3000, 300, 1200, 17, 2600, 64, 900, 4097};
    const std::int32_t num_blocks = blocks_for(shape, lengths);
    const auto histories = make_histories(rng, shape, lengths, num_blocks);
    const std::int32_t q_dim = shape.heads * shape.head_dim;
    // The last 40 queries of the sequence under test; row 39 is its last position.
    const auto chunk_q = random_floats(rng, 40 * static_cast<std::size_t>(q_dim));
    const std::vector<float> last_q(chunk_q.end() - q_dim, chunk_q.end());

    std::vector<std::vector<float>> results;  // the last position's output, each way
    for (const int threads : {1, 2, 3}) {
      Fixture fixture(shape, dtype, threads, num_blocks);
      for (const auto& h : histories) fixture.store(h);
      const std::vector<History> alone(histories.begin(), histories.begin() + 1);
      // Alone, as a decode.
      results.push_back(fixture.attend(make_step(alone, {1}), last_q));
      // The last of a 40-query chunk (three tiles).
      {
        const auto out = fixture.attend(make_step(alone, {40}), chunk_q);
        results.emplace_back(out.end() - q_dim, out.end());
      }
      // A decode among seven others, placed in the middle of the batch.
      {
        std::vector<History> batch(histories.begin() + 1, histories.end());
        batch.insert(batch.begin() + 3, histories[0]);
        const StepInput step = make_step(batch, std::vector<std::int32_t>(batch.size(), 1));
        auto q = random_floats(rng, batch.size() * static_cast<std::size_t>(q_dim));
        std::copy(last_q.begin(), last_q.end(), q.begin() + 3 * q_dim);
        const auto out = fixture.attend(step, q);
        results.emplace_back(out.begin() + 3 * q_dim, out.begin() + 4 * q_dim);
      }
    }
    for (std::size_t i = 1; i < results.size(); ++i) {
      INFO("way " << i << " (threads " << 1 + i / 3 << ", "
                  << (i % 3 == 0   ? "alone"
                      : i % 3 == 1 ? "in a chunk"
                                   : "in a batch")
                  << ") against alone on one thread, dtype "
                  << (dtype == KvCacheDtype::f32 ? "f32" : "f16"));
      REQUIRE(std::memcmp(results[i].data(), results[0].data(), results[0].size() * 4) == 0);
    }
  }
}

TEST_CASE("folding partitions: an empty partition changes nothing, and the order is fixed",
          "[cpu][attention]") {
  float m = 0.0f, s = 0.0f, o[2] = {0.0f, 0.0f};
  const float o1[2] = {1.0f, 2.0f}, o2[2] = {3.0f, -1.0f};
  cpu::fold_partition(m, s, o, 1.5f, 2.0f, o1, 2);
  CHECK(m == 1.5f);
  CHECK(s == 2.0f);
  CHECK(o[0] == 1.0f);
  cpu::fold_partition(m, s, o, -INFINITY, 0.0f, o2, 2);  // a row that saw no key there
  CHECK(s == 2.0f);
  CHECK(o[1] == 2.0f);
  cpu::fold_partition(m, s, o, 2.5f, 1.0f, o2, 2);
  CHECK(m == 2.5f);
  CHECK(s == Approx(2.0f * std::exp(-1.0f) + 1.0f));
  CHECK(o[0] == Approx(1.0f * std::exp(-1.0f) + 3.0f));
  CHECK(o[1] == Approx(2.0f * std::exp(-1.0f) - 1.0f));
}

TEST_CASE("a key beyond F16's range saturates in the cache: attention stays finite",
          "[cpu][attention]") {
  std::mt19937 rng(3);
  const Shape shape{16, 2, 1, 16};
  auto histories = make_histories(rng, shape, {40}, 3);
  // Key 7 is huge in every dimension (an activation outlier), value 9 too.
  for (std::int32_t d = 0; d < shape.head_dim; ++d) {
    histories[0].keys[7 * shape.head_dim + d] = 1e6f;
    histories[0].values[9 * shape.head_dim + d] = -3e5f;
  }
  Fixture fixture(shape, KvCacheDtype::f16, 2, 3);
  fixture.store(histories[0]);
  // A query that scores key 7 low: the row must still be finite (an infinite key gave NaN).
  std::vector<float> q(2 * shape.head_dim, -1e-3f);
  const auto out = fixture.attend(make_step(histories, {1}), q);
  for (const float x : out) REQUIRE(std::isfinite(x));
}

TEST_CASE("a sliding window and a score softcap match the reference, in F32 and F16 caches",
          "[cpu][attention]") {
  std::mt19937 rng(17);
  for (const Shape shape : {Shape{4, 4, 2, 8}, Shape{16, 4, 2, 32}}) {
    for (const KvCacheDtype dtype : {KvCacheDtype::f32, KvCacheDtype::f16}) {
      // Windows inside a block, of whole blocks, across partitions (the 600-key history
      // skips whole partitions), longer than the history; with and without a cap.
      for (const auto& [window, softcap] : std::vector<std::pair<std::int32_t, float>>{
               {1, 0.0f}, {5, 0.0f}, {32, 50.0f}, {48, 0.0f}, {300, 2.0f}, {5000, 0.0f}}) {
        INFO("block " << shape.block_size << " window " << window << " softcap " << softcap
                      << " dtype " << (dtype == KvCacheDtype::f32 ? "f32" : "f16"));
        const std::vector<std::int32_t> lengths = {6, 40, 77, 600};
        const std::vector<std::int32_t> queries = {6, 20, 1, 40};
        const std::int32_t num_blocks = blocks_for(shape, lengths);
        const auto histories = make_histories(rng, shape, lengths, num_blocks);
        Fixture fixture(shape, dtype, 2, num_blocks);
        fixture.limit(window, softcap);
        for (const auto& h : histories) fixture.store(h);
        const StepInput step = make_step(histories, queries);
        const std::int32_t q_dim = shape.heads * shape.head_dim;
        // Scores large enough that a cap of 2 changes them.
        auto q = random_floats(rng, static_cast<std::size_t>(step.num_tokens()) * q_dim);
        for (auto& x : q) x *= 3.0f;
        const auto got = fixture.attend(step, q);
        for (std::size_t s = 0; s < histories.size(); ++s) {
          for (std::int32_t i = 0; i < queries[s]; ++i) {
            const std::int32_t row = step.query_start[s] + i,
                               pos = histories[s].length - queries[s] + i;
            for (std::int32_t head = 0; head < shape.heads; ++head) {
              const auto want =
                  reference_head(shape, histories[s], q, row, pos, head, fixture.params(), dtype);
              for (std::int32_t d = 0; d < shape.head_dim; ++d) {
                const float value = got[row * q_dim + head * shape.head_dim + d];
                INFO("sequence " << s << " position " << pos << " head " << head << " dim " << d
                                 << ": got " << value << ", want " << want[d]);
                REQUIRE(std::fabs(value - want[d]) <= 1e-4 * (std::fabs(want[d]) + 1.0));
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("windowed attention is bit-identical alone, in a tile, in a batch and on 1 to 3 threads",
          "[cpu][attention]") {
  std::mt19937 rng(23);
  const Shape shape{16, 8, 2, 64};
  // The sequence under test (1000 keys: four partitions, a window of 300 across two of
  // them) and others.
  const std::vector<std::int32_t> lengths = {1000, 300, 17, 700};
  const std::int32_t num_blocks = blocks_for(shape, lengths);
  const auto histories = make_histories(rng, shape, lengths, num_blocks);
  const std::int32_t q_dim = shape.heads * shape.head_dim;
  const auto chunk_q = random_floats(rng, 40 * static_cast<std::size_t>(q_dim));
  const std::vector<float> last_q(chunk_q.end() - q_dim, chunk_q.end());
  std::vector<std::vector<float>> results;
  for (const int threads : {1, 2, 3}) {
    Fixture fixture(shape, KvCacheDtype::f16, threads, num_blocks);
    fixture.limit(300, 30.0f);
    for (const auto& h : histories) fixture.store(h);
    const std::vector<History> alone(histories.begin(), histories.begin() + 1);
    results.push_back(fixture.attend(make_step(alone, {1}), last_q));
    const auto chunk = fixture.attend(make_step(alone, {40}), chunk_q);
    results.emplace_back(chunk.end() - q_dim, chunk.end());
    std::vector<History> batch(histories.begin() + 1, histories.end());
    batch.insert(batch.begin() + 1, histories[0]);
    auto q = random_floats(rng, batch.size() * static_cast<std::size_t>(q_dim));
    std::copy(last_q.begin(), last_q.end(), q.begin() + q_dim);
    const auto out =
        fixture.attend(make_step(batch, std::vector<std::int32_t>(batch.size(), 1)), q);
    results.emplace_back(out.begin() + q_dim, out.begin() + 2 * q_dim);
  }
  for (std::size_t i = 1; i < results.size(); ++i) {
    INFO("way " << i << " against alone on one thread");
    REQUIRE(std::memcmp(results[i].data(), results[0].data(), results[0].size() * 4) == 0);
  }
}
