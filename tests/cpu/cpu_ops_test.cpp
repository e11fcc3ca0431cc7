// Every CPU backend op against a plain reference written here in double
// precision, on fresh random inputs, with outputs poisoned (NaN) beforehand so
// that an element the op forgot to write fails.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "cpu/cpu_backend.hpp"
#include "cpu/kernels.hpp"
#include "cpu/thread_pool.hpp"
#include "gguf/dequantize.hpp"

using namespace troupe;
using namespace troupe::gguf;
using namespace troupe::model;
using troupe::cpu::CpuBackend;

namespace {

constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();

std::mt19937& rng() {
  static std::mt19937 generator(std::random_device{}());
  return generator;
}

std::vector<float> random_floats(std::size_t n, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng());
  return v;
}

// A backend tensor holding `values`, freed with the holder.
struct Held {
  CpuBackend& backend;
  Tensor tensor;
  Held(CpuBackend& b, std::int64_t rows, std::int64_t cols, const std::vector<float>& values = {})
      : backend(b), tensor(*b.allocate(rows, cols)) {
    const auto n = static_cast<std::size_t>(rows * cols);
    if (values.empty())
      std::fill(tensor.data, tensor.data + n, kPoison);
    else
      std::copy(values.begin(), values.end(), tensor.data);
  }
  ~Held() { backend.release(tensor); }
  std::vector<float> values() const {
    return {tensor.data, tensor.data + tensor.rows * tensor.cols};
  }
};

struct HostWeight {
  std::vector<std::byte> bytes;
  std::vector<float> dequantized;  // [rows, cols]
  Weight weight;
};

// The reference copy of w.bytes, decoded by the scalar dequantizer, and the view the ops take.
void finish_weight(HostWeight& w, TensorType type, std::int64_t rows, std::int64_t cols) {
  w.dequantized.resize(static_cast<std::size_t>(rows * cols));
  const std::size_t stride = row_bytes(type, cols);
  for (std::int64_t r = 0; r < rows; ++r) {
    REQUIRE(dequantize_row(type, w.bytes.data() + r * stride, cols, w.dequantized.data() + r * cols)
                .has_value());
  }
  w.weight = Weight{w.bytes.data(), type, rows, cols};
}

HostWeight make_weight(TensorType type, std::int64_t rows, std::int64_t cols) {
  HostWeight w;
  const auto values = random_floats(static_cast<std::size_t>(rows * cols), 0.5f);
  w.bytes = *quantize(type, values, cols);
  finish_weight(w, type, rows, cols);
  return w;
}

// The step every op in these tests runs in: sequences of given lengths, all new.
StepInput make_step(const std::vector<std::int32_t>& lengths, const std::vector<std::int32_t>& done,
                    std::int32_t block_size, std::int32_t num_blocks, std::int32_t vocab) {
  StepInput step;
  std::vector<std::int32_t> free_blocks(num_blocks);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng());  // scattered blocks
  std::size_t next = 0;
  std::uniform_int_distribution<TokenId> any(0, vocab - 1);
  for (std::size_t s = 0; s < lengths.size(); ++s) {
    const std::int32_t total = done[s] + lengths[s];
    std::vector<std::int32_t> table((total + block_size - 1) / block_size);
    for (auto& b : table) b = free_blocks.at(next++);
    std::vector<TokenId> tokens(lengths[s]);
    for (auto& t : tokens) t = any(rng());
    append_sequence(step, tokens, done[s], table, true);
  }
  return step;
}

// x · wᵀ in double, and the sum of |products| each result's rounding scales with.
std::pair<std::vector<double>, std::vector<double>> reference_matmul(const std::vector<float>& x,
                                                                     const std::vector<float>& w,
                                                                     std::int64_t n,
                                                                     std::int64_t rows,
                                                                     std::int64_t cols) {
  std::vector<double> want(static_cast<std::size_t>(n * rows)), scale(want.size());
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int64_t r = 0; r < rows; ++r) {
      double sum = 0.0, magnitude = 0.0;
      for (std::int64_t k = 0; k < cols; ++k) {
        const double p = static_cast<double>(x[t * cols + k]) * w[r * cols + k];
        sum += p;
        magnitude += std::fabs(p);
      }
      want[t * rows + r] = sum;
      scale[t * rows + r] = magnitude + 1e-6;
    }
  return {want, scale};
}

void check_close(const std::vector<float>& got, const std::vector<double>& want, double tolerance,
                 const std::vector<double>& scale = {}) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double bound = tolerance * (scale.empty() ? std::max(1.0, std::fabs(want[i])) : scale[i]);
    INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
    REQUIRE(std::isfinite(got[i]));
    REQUIRE(std::fabs(got[i] - want[i]) <= bound);
  }
}

}  // namespace

TEST_CASE("the thread pool runs every task exactly once", "[cpu]") {
  cpu::ThreadPool pool(4);
  for (std::int64_t n : {0, 1, 3, 1000}) {
    std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
    pool.parallel_for(n, [&](std::int64_t i) { hits[i].fetch_add(1); });
    for (auto& h : hits) REQUIRE(h.load() == 1);
  }
}

TEST_CASE("matmul matches the reference for every weight type", "[cpu][ops]") {
  CpuBackend backend(2);
  // Odd shapes exercise every tile edge; quantized types need columns in blocks of 32.
  for (const TensorType type :
       {TensorType::f32, TensorType::f16, TensorType::bf16, TensorType::q8_0, TensorType::q4_0,
        TensorType::q4_1, TensorType::q5_0, TensorType::q5_1, TensorType::iq4_nl,
        TensorType::mxfp4}) {
    const bool quantized =
        type != TensorType::f32 && type != TensorType::f16 && type != TensorType::bf16;
    for (const auto& [n, rows, cols] :
         {std::tuple{1, 7, 96}, std::tuple{5, 33, 160}, std::tuple{9, 64, quantized ? 64 : 67}}) {
      INFO(tensor_type_name(type) << " n=" << n << " rows=" << rows << " cols=" << cols);
      const auto w = make_weight(type, rows, cols);
      const auto xs = random_floats(static_cast<std::size_t>(n * cols));
      Held x(backend, n, cols, xs), out(backend, n, rows);
      backend.matmul(x.tensor, w.weight, out.tensor);
      // Reference: weights as decoded; quantized types also quantize the activations
      // (as llama.cpp does), so the reference does the same and the match is tight.
      std::vector<float> xr = xs;
      if (quantized) {
        std::vector<std::int8_t> q(cols);
        std::vector<float> d(cols / 32);
        for (int t = 0; t < n; ++t) {
          cpu::quantize_row_q8(xs.data() + t * cols, cols, q.data(), d.data());
          for (int k = 0; k < cols; ++k) xr[t * cols + k] = q[k] * d[k / 32];
        }
      }
      const auto [want, scale] = reference_matmul(xr, w.dequantized, n, rows, cols);
      check_close(out.values(), want, 1e-5, scale);
    }
  }
}

TEST_CASE("a row's matmul result is bit-identical alone or in a batch of 32", "[cpu][ops]") {
  CpuBackend backend(2);
  for (const TensorType type :
       {TensorType::f32, TensorType::f16, TensorType::q8_0, TensorType::q4_0, TensorType::q5_0,
        TensorType::q5_1, TensorType::iq4_nl, TensorType::mxfp4}) {
    INFO(tensor_type_name(type));
    const std::int64_t rows = 70, cols = 128;
    const auto w = make_weight(type, rows, cols);
    const auto xs = random_floats(static_cast<std::size_t>(32 * cols));
    Held batch(backend, 32, cols, xs), batch_out(backend, 32, rows);
    backend.matmul(batch.tensor, w.weight, batch_out.tensor);
    for (int t : {0, 3, 17, 31}) {
      Held one(backend, 1, cols,
               std::vector<float>(xs.begin() + t * cols, xs.begin() + (t + 1) * cols));
      Held one_out(backend, 1, rows);
      backend.matmul(one.tensor, w.weight, one_out.tensor);
      for (int r = 0; r < rows; ++r)
        REQUIRE(one_out.tensor.data[r] == batch_out.tensor.data[t * rows + r]);
    }
  }
}

TEST_CASE("rms_norm, swiglu and add match the reference", "[cpu][ops]") {
  CpuBackend backend(2);
  const int n = 5, cols = 77;
  const auto xs = random_floats(n * cols), ws = random_floats(cols), ys = random_floats(n * cols);
  const Weight norm{ws.data(), TensorType::f32, 1, cols};
  SECTION("rms_norm") {
    Held x(backend, n, cols, xs), out(backend, n, cols);
    backend.rms_norm(x.tensor, norm, 1e-5f, out.tensor);
    std::vector<double> want(n * cols);
    for (int t = 0; t < n; ++t) {
      double ss = 0.0;
      for (int i = 0; i < cols; ++i) ss += static_cast<double>(xs[t * cols + i]) * xs[t * cols + i];
      const double scale = 1.0 / std::sqrt(ss / cols + 1e-5);
      for (int i = 0; i < cols; ++i) want[t * cols + i] = xs[t * cols + i] * scale * ws[i];
    }
    check_close(out.values(), want, 1e-5);
  }
  SECTION("swiglu") {
    Held g(backend, n, cols, xs), u(backend, n, cols, ys), out(backend, n, cols);
    backend.swiglu(g.tensor, u.tensor, out.tensor);
    std::vector<double> want(n * cols);
    for (int i = 0; i < n * cols; ++i)
      want[i] = xs[i] / (1.0 + std::exp(-static_cast<double>(xs[i]))) * ys[i];
    check_close(out.values(), want, 1e-5);
  }
  SECTION("add") {
    Held x(backend, n, cols, xs), y(backend, n, cols, ys);
    backend.add(x.tensor, y.tensor);
    std::vector<double> want(n * cols);
    for (int i = 0; i < n * cols; ++i) want[i] = static_cast<double>(xs[i]) + ys[i];
    check_close(x.values(), want, 1e-6);
  }
}

TEST_CASE("bias add, GELU-tanh gate, scale and softcap match the reference", "[cpu][ops]") {
  CpuBackend backend(2);
  const int n = 5, cols = 77;
  // Values out to +-12, where tanh saturates and a cap of 3 bites.
  const auto xs = random_floats(n * cols, 4.0f), ys = random_floats(n * cols),
             bs = random_floats(cols);
  SECTION("add_bias adds the same vector to every row") {
    Held x(backend, n, cols, xs);
    backend.add_bias(x.tensor, Weight{bs.data(), TensorType::f32, 1, cols});
    std::vector<double> want(n * cols);
    for (int i = 0; i < n * cols; ++i) want[i] = static_cast<double>(xs[i]) + bs[i % cols];
    check_close(x.values(), want, 1e-6);
  }
  SECTION("gelu_tanh_gate is 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * up") {
    Held g(backend, n, cols, xs), u(backend, n, cols, ys), out(backend, n, cols);
    backend.gelu_tanh_gate(g.tensor, u.tensor, out.tensor);
    std::vector<double> want(n * cols);
    for (int i = 0; i < n * cols; ++i) {
      const double x = xs[i];
      want[i] =
          0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))) * ys[i];
    }
    check_close(out.values(), want, 1e-5);
  }
  SECTION("scale multiplies every element") {
    Held x(backend, n, cols, xs);
    backend.scale(x.tensor, 8.0f);
    std::vector<double> want(n * cols);
    for (int i = 0; i < n * cols; ++i) want[i] = 8.0 * xs[i];
    check_close(x.values(), want, 1e-6);
  }
  SECTION("softcap is cap * tanh(x / cap)") {
    Held x(backend, n, cols, xs);
    backend.softcap(x.tensor, 3.0f);
    std::vector<double> want(n * cols);
    for (int i = 0; i < n * cols; ++i) want[i] = 3.0 * std::tanh(xs[i] / 3.0);
    check_close(x.values(), want, 1e-5);
    for (const float v : x.values()) CHECK(std::fabs(v) <= 3.0f);
  }
}

TEST_CASE("embed decodes each token's row for every table type", "[cpu][ops]") {
  CpuBackend backend(2);
  REQUIRE(backend.allocate_kv_cache(KvCacheShape{1, 4, 16, 1, 2}).has_value());
  const std::int32_t vocab = 50, dim = 64;
  const StepInput step = make_step({3, 2}, {0, 0}, 16, 4, vocab);
  REQUIRE(backend.begin_step(step).has_value());
  for (const TensorType type :
       {TensorType::f32, TensorType::f16, TensorType::bf16, TensorType::q8_0, TensorType::q4_0,
        TensorType::q5_0, TensorType::iq4_nl, TensorType::mxfp4}) {
    const auto table = make_weight(type, vocab, dim);
    Held out(backend, step.num_tokens(), dim);
    backend.embed(table.weight, out.tensor);
    std::vector<double> want;
    for (TokenId t : step.tokens)
      for (int i = 0; i < dim; ++i) want.push_back(table.dequantized[t * dim + i]);
    check_close(out.values(), want, 0.0);
  }
}

TEST_CASE("rope rotates by position in both layouts", "[cpu][ops]") {
  CpuBackend backend(2);
  REQUIRE(backend.allocate_kv_cache(KvCacheShape{1, 64, 16, 1, 2}).has_value());
  const StepInput step = make_step({4, 1}, {0, 300}, 16, 64, 10);
  REQUIRE(backend.begin_step(step).has_value());
  const std::int32_t heads = 3, head_dim = 16;
  const std::vector<float> factors = {1.0f, 2.0f, 4.0f, 8.0f, 1.0f, 1.0f};
  const Weight factor_weight{factors.data(), TensorType::f32, 1, 6};
  for (const auto layout : {RopeLayout::normal, RopeLayout::neox}) {
    for (const bool partial : {false, true}) {
      RopeParams params{layout, partial ? 12 : head_dim, 10000.0f, partial ? 0.5f : 1.0f,
                        partial ? &factor_weight : nullptr};
      const auto xs = random_floats(static_cast<std::size_t>(step.num_tokens() * heads * head_dim));
      Held x(backend, step.num_tokens(), heads * head_dim, xs);
      backend.rope(x.tensor, head_dim, params);
      std::vector<double> want(xs.begin(), xs.end());
      const int half = params.rot_dims / 2;
      for (int t = 0; t < step.num_tokens(); ++t)
        for (int h = 0; h < heads; ++h)
          for (int i = 0; i < half; ++i) {
            const double freq = std::pow(10000.0, -2.0 * i / params.rot_dims);
            const double angle = params.freq_scale * step.positions[t] * freq /
                                 (params.freq_factors ? factors[i] : 1.0);
            const int a = layout == RopeLayout::normal ? 2 * i : i;
            const int b = layout == RopeLayout::normal ? 2 * i + 1 : i + half;
            const std::size_t base = static_cast<std::size_t>((t * heads + h) * head_dim);
            const double x0 = xs[base + a], x1 = xs[base + b];
            want[base + a] = x0 * std::cos(angle) - x1 * std::sin(angle);
            want[base + b] = x0 * std::sin(angle) + x1 * std::cos(angle);
          }
      // Position 300: the float angle itself carries ~300 * 2^-24 of rounding.
      check_close(x.values(), want, 2e-4);
    }
  }
}

TEST_CASE("gather_logit_rows picks the asked rows", "[cpu][ops]") {
  CpuBackend backend(1);
  REQUIRE(backend.allocate_kv_cache(KvCacheShape{1, 8, 4, 1, 2}).has_value());
  const StepInput step = make_step({3, 2}, {0, 0}, 4, 8, 10);  // logit rows 2 and 4
  REQUIRE(backend.begin_step(step).has_value());
  const auto xs = random_floats(5 * 6);
  Held x(backend, 5, 6, xs), out(backend, 2, 6);
  backend.gather_logit_rows(x.tensor, out.tensor);
  std::vector<double> want;
  for (int r : {2, 4})
    for (int i = 0; i < 6; ++i) want.push_back(xs[r * 6 + i]);
  check_close(out.values(), want, 0.0);
}

TEST_CASE("moe_ffn routes each row as its family does and sums its experts", "[cpu][ops][moe]") {
  // Six experts, two a row, over 1, 3 and 40 rows (40 rows load some experts far more than
  // others); float experts (one expert at a time) and Q8_0 ones (the grouped int8 path).
  constexpr std::int64_t kDim = 64, kFfn = 96;
  constexpr std::int32_t kExperts = 6, kUsed = 2;
  CpuBackend backend(3);
  for (const TensorType type : {TensorType::f32, TensorType::q8_0}) {
    for (const ExpertRouting routing : {ExpertRouting::softmax_top_k, ExpertRouting::top_k_softmax,
                                        ExpertRouting::softmax_top_k_unnormalised}) {
      for (const ExpertActivation activation :
           {ExpertActivation::silu, ExpertActivation::swiglu_oai}) {
        const bool biased = activation == ExpertActivation::swiglu_oai;  // as gpt-oss
        INFO("type " << tensor_type_name(type) << ", routing " << static_cast<int>(routing)
                     << ", activation " << static_cast<int>(activation));
        HostWeight router = make_weight(TensorType::f32, kExperts, kDim);
        std::vector<HostWeight> gate, up, down, gate_b, up_b, down_b;
        MoeLayer layer;
        layer.router = router.weight;
        layer.num_used = kUsed;
        layer.routing = routing;
        layer.activation = activation;
        const auto router_bias = random_floats(kExperts, 0.5f);
        if (biased) layer.router_bias = Weight{router_bias.data(), TensorType::f32, 1, kExperts};
        std::vector<std::vector<float>> biases;
        for (std::int32_t e = 0; e < kExperts; ++e) {
          gate.push_back(make_weight(type, kFfn, kDim));
          up.push_back(make_weight(type, kFfn, kDim));
          down.push_back(make_weight(type, kDim, kFfn));
          biases.push_back(random_floats(kFfn, 0.5f));
          biases.push_back(random_floats(kFfn, 0.5f));
          biases.push_back(random_floats(kDim, 0.5f));
        }
        for (std::int32_t e = 0; e < kExperts; ++e) {
          ExpertWeights w{gate[e].weight, up[e].weight, down[e].weight, {}, {}, {}};
          if (biased) {
            w.gate_bias = Weight{biases[3 * e].data(), TensorType::f32, 1, kFfn};
            w.up_bias = Weight{biases[3 * e + 1].data(), TensorType::f32, 1, kFfn};
            w.down_bias = Weight{biases[3 * e + 2].data(), TensorType::f32, 1, kDim};
          }
          layer.experts.push_back(w);
        }
        // The same layer with a seventh, F32 expert the router never picks (a bias of -1e4):
        // one expert without an int8 kernel sends the layer down the one-expert-at-a-time
        // path, which must give the grouped path's bits exactly.
        MoeLayer each = layer;
        std::vector<float> each_router(router.dequantized);
        each_router.resize(static_cast<std::size_t>((kExperts + 1) * kDim), 0.0f);
        each.router = Weight{each_router.data(), TensorType::f32, kExperts + 1, kDim};
        std::vector<float> each_bias(static_cast<std::size_t>(kExperts + 1), 0.0f);
        if (biased) std::copy(router_bias.begin(), router_bias.end(), each_bias.begin());
        each_bias.back() = -1e4f;
        each.router_bias = Weight{each_bias.data(), TensorType::f32, 1, kExperts + 1};
        HostWeight idle_gate = make_weight(TensorType::f32, kFfn, kDim);
        HostWeight idle_up = make_weight(TensorType::f32, kFfn, kDim);
        HostWeight idle_down = make_weight(TensorType::f32, kDim, kFfn);
        each.experts.push_back(
            ExpertWeights{idle_gate.weight, idle_up.weight, idle_down.weight, {}, {}, {}});
        if (biased) {
          each.experts.back().gate_bias = layer.experts.front().gate_bias;
          each.experts.back().up_bias = layer.experts.front().up_bias;
          each.experts.back().down_bias = layer.experts.front().down_bias;
        }
        for (const std::int64_t n : {1, 3, 40}) {
          const auto xs = random_floats(static_cast<std::size_t>(n * kDim));
          Held x(backend, n, kDim, xs), out(backend, n, kDim), out_each(backend, n, kDim);
          backend.moe_ffn(x.tensor, layer, out.tensor);
          backend.moe_ffn(x.tensor, each, out_each.tensor);
          if (type != TensorType::f32) {
            const auto grouped = out.values(), one_by_one = out_each.values();
            CHECK(std::memcmp(grouped.data(), one_by_one.data(), grouped.size() * sizeof(float)) ==
                  0);
          }
          std::vector<double> want(static_cast<std::size_t>(n * kDim), 0.0);
          std::vector<std::int64_t> skipped_rows;
          for (std::int64_t r = 0; r < n; ++r) {
            const float* xr = xs.data() + r * kDim;
            const auto dot = [&](const std::vector<float>& m, std::int64_t row, const float* v,
                                 std::int64_t cols) {
              double sum = 0.0;
              for (std::int64_t i = 0; i < cols; ++i) sum += double{m[row * cols + i]} * v[i];
              return sum;
            };
            std::vector<double> logits(kExperts);
            for (std::int32_t e = 0; e < kExperts; ++e) {
              logits[e] = dot(router.dequantized, e, xr, kDim) + (biased ? router_bias[e] : 0.0);
            }
            std::vector<double> p = logits;
            if (routing != ExpertRouting::top_k_softmax) {
              const double max = *std::max_element(p.begin(), p.end());
              double total = 0.0;
              for (double& v : p) total += v = std::exp(v - max);
              for (double& v : p) v /= total;
            }
            std::vector<std::int32_t> order(kExperts);
            std::iota(order.begin(), order.end(), 0);
            std::stable_sort(order.begin(), order.end(),
                             [&](std::int32_t a, std::int32_t b) { return p[a] > p[b]; });
            // A near tie at the k-th place may fall either way in float: such a row (rare,
            // the inputs being random) is left to the exact comparison above.
            if (p[order[kUsed - 1]] - p[order[kUsed]] < 1e-4) {
              skipped_rows.push_back(r);
              continue;
            }
            std::vector<double> weight(kUsed);
            double total = 0.0;
            for (std::int32_t j = 0; j < kUsed; ++j) {
              weight[j] = routing == ExpertRouting::top_k_softmax
                              ? std::exp(p[order[j]] - p[order[0]])
                              : p[order[j]];
              total += weight[j];
            }
            if (routing != ExpertRouting::softmax_top_k_unnormalised) {
              for (double& w : weight) w /= total;
            }
            for (std::int32_t j = 0; j < kUsed; ++j) {
              const std::int32_t e = order[j];
              std::vector<float> act(kFfn);
              for (std::int64_t i = 0; i < kFfn; ++i) {
                double g = dot(gate[e].dequantized, i, xr, kDim);
                double u = dot(up[e].dequantized, i, xr, kDim);
                if (biased) {
                  g += biases[3 * e][i];
                  u += biases[3 * e + 1][i];
                }
                if (activation == ExpertActivation::silu) {
                  act[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * u);
                } else {
                  g = std::min(g, 7.0);
                  u = std::clamp(u, -7.0, 7.0);
                  act[i] = static_cast<float>(g / (1.0 + std::exp(-1.702 * g)) * (u + 1.0));
                }
              }
              for (std::int64_t i = 0; i < kDim; ++i) {
                const double y = dot(down[e].dequantized, i, act.data(), kFfn) +
                                 (biased ? biases[3 * e + 2][i] : 0.0);
                want[r * kDim + i] += weight[j] * y;
              }
            }
          }
          // F32: float rounding only. Q8_0: the activations quantized to 8 bits a block.
          double scale = 0.0;
          for (const double v : want) scale = std::max(scale, std::fabs(v));
          auto got = out.values();
          for (const std::int64_t r : skipped_rows) {  // compared as equal: left out
            for (std::int64_t i = 0; i < kDim; ++i)
              got[r * kDim + i] = static_cast<float>(want[r * kDim + i]);
          }
          check_close(got, want, type == TensorType::f32 ? 1e-4 : 3e-2,
                      std::vector<double>(want.size(), std::max(scale, 1.0)));
        }
      }
    }
  }
}
