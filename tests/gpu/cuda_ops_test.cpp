// Every CUDA op against the CPU backend's, on fresh random inputs, with GPU outputs
// poisoned (NaN) before each run so that an unwritten element fails. Weights are
// rounded to the GPU's 16-bit type first, so both sides compute with the same ones.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>

#include "cpu/cpu_backend.hpp"
#include "gguf/half.hpp"
#include "gpu/gpu_test_support.hpp"
#include "gpu/steps.hpp"
#include "model/llama_config.hpp"
#include "model/sampler.hpp"

using namespace troupe;
using gguf::TensorType;
using model::Tensor;
using model::Weight;

namespace {

struct Both {
  explicit Both(gpu::CudaBackendOptions options = {}) : gpu(test::gpu_or_skip(options)) {}

  std::unique_ptr<gpu::CudaBackend> gpu;
  cpu::CpuBackend cpu{2};
  std::vector<std::vector<std::uint16_t>> halves;
  std::vector<std::vector<float>> floats;

  static gguf::GgufTensorInfo info(TensorType type, std::int64_t rows, std::int64_t cols,
                                   const void* data, std::size_t bytes) {
    gguf::GgufTensorInfo i;
    i.type = type;
    i.num_dims = rows == 1 ? 1 : 2;
    i.dims[0] = cols;
    i.dims[1] = rows;
    i.data = static_cast<const std::byte*>(data);
    i.num_bytes = bytes;
    return i;
  }

  // A matrix with the same values on both sides: 16-bit on the GPU, its exact floats on the CPU.
  std::pair<Weight, Weight> matrix(std::int64_t rows, std::int64_t cols, TensorType type,
                                   float scale = 0.1f) {
    const auto values = test::random_floats(static_cast<std::size_t>(rows * cols), scale);
    auto& h = halves.emplace_back(values.size());
    auto& f = floats.emplace_back(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      h[i] = type == TensorType::f16 ? gguf::f32_to_f16(values[i]) : gguf::f32_to_bf16(values[i]);
      f[i] = type == TensorType::f16 ? gguf::f16_to_f32(h[i]) : gguf::bf16_to_f32(h[i]);
    }
    auto g = gpu->load_weight(info(type, rows, cols, h.data(), h.size() * 2));
    auto c = cpu.load_weight(info(TensorType::f32, rows, cols, f.data(), f.size() * 4));
    REQUIRE(g.has_value());
    REQUIRE(c.has_value());
    REQUIRE(g->type == type);
    return {*g, *c};
  }

  std::pair<Weight, Weight> vector(std::int64_t size, float scale, float offset) {
    auto& f = floats.emplace_back(test::random_floats(static_cast<std::size_t>(size), scale));
    for (float& x : f) x += offset;
    auto g = gpu->load_weight(info(TensorType::f32, 1, size, f.data(), f.size() * 4));
    auto c = cpu.load_weight(info(TensorType::f32, 1, size, f.data(), f.size() * 4));
    REQUIRE(g.has_value());
    REQUIRE(c.has_value());
    return {*g, *c};
  }

  std::pair<Tensor, Tensor> tensor(std::int64_t rows, std::int64_t cols,
                                   const std::vector<float>& values = {}) {
    auto g = gpu->allocate(rows, cols);
    auto c = cpu.allocate(rows, cols);
    REQUIRE(g.has_value());
    REQUIRE(c.has_value());
    if (!values.empty()) {
      REQUIRE(gpu->write(*g, values).has_value());
      std::memcpy(c->data, values.data(), values.size() * 4);
    } else {
      gpu->poison(*g);
      std::fill(c->data, c->data + rows * cols, 0.0f);
    }
    return {*g, *c};
  }

  std::pair<Tensor, Tensor> random_tensor(std::int64_t rows, std::int64_t cols, float scale = 1) {
    return tensor(rows, cols, test::random_floats(static_cast<std::size_t>(rows * cols), scale));
  }

  double error(std::pair<Tensor, Tensor> t) {
    std::vector<float> g(static_cast<std::size_t>(t.first.rows * t.first.cols));
    REQUIRE(gpu->end_step().has_value());
    REQUIRE(gpu->read(t.first, g).has_value());
    const std::span<const float> c(t.second.data, g.size());
    return test::relative_error(g, c);
  }

  void begin(const model::StepInput& step) {
    REQUIRE(gpu->begin_step(step).has_value());
    REQUIRE(cpu.begin_step(step).has_value());
  }

  void kv_cache(const model::KvCacheShape& shape) {
    REQUIRE(gpu->allocate_kv_cache(shape).has_value());
    REQUIRE(cpu.allocate_kv_cache(shape).has_value());
  }
};

}  // namespace

TEST_CASE("matmul through cuBLAS equals the CPU backend's", "[gpu][ops]") {
  Both b;
  const auto type = GENERATE(TensorType::f16, TensorType::bf16);
  const std::int64_t n = GENERATE(1, 7, 64);
  const std::int64_t cols = GENERATE(256, 200);
  const auto w = b.matrix(129, cols, type);
  const auto x = b.random_tensor(n, cols);
  const auto out = b.tensor(n, 129);
  b.gpu->matmul(x.first, w.first, out.first);
  b.cpu.matmul(x.second, w.second, out.second);
  // The GPU casts activations to the weight's type: one rounding of each input.
  CHECK(b.error(out) < (type == TensorType::f16 ? 2e-3 : 1.5e-2));
}

TEST_CASE("row ops equal the CPU backend's: norms, residual, SwiGLU, embedding, gather",
          "[gpu][ops]") {
  Both b;
  b.kv_cache({1, 8, 4, 2, 16});
  const auto step =
      test::make_step({9, 3, 6}, {9, 1, 4}, 4, true, {5, 1, 7, 2, 9, 0, 3, 3, 8, 4, 6, 1, 2, 9});
  b.begin(step);
  const std::int64_t n = step.num_tokens(), cols = 96;

  SECTION("rms_norm") {
    const auto x = b.random_tensor(n, cols, 3.0f);
    const auto w = b.vector(cols, 0.5f, 1.0f);
    const auto out = b.tensor(n, cols);
    b.gpu->rms_norm(x.first, w.first, 1e-5f, out.first);
    b.cpu.rms_norm(x.second, w.second, 1e-5f, out.second);
    CHECK(b.error(out) < 1e-5);
  }
  SECTION("add_rms_norm, output over the added input") {
    const auto x = b.random_tensor(n, cols);
    const auto y = b.random_tensor(n, cols);
    const auto w = b.vector(cols, 0.5f, 1.0f);
    b.gpu->add_rms_norm(x.first, y.first, w.first, 1e-6f, y.first);
    b.cpu.add_rms_norm(x.second, y.second, w.second, 1e-6f, y.second);
    CHECK(b.error(y) < 1e-5);
    CHECK(b.error(x) < 1e-6);
  }
  SECTION("swiglu and add") {
    const auto gate = b.random_tensor(n, cols, 2.0f);
    const auto up = b.random_tensor(n, cols);
    const auto out = b.tensor(n, cols);
    b.gpu->swiglu(gate.first, up.first, out.first);
    b.cpu.swiglu(gate.second, up.second, out.second);
    b.gpu->add(out.first, gate.first);
    b.cpu.add(out.second, gate.second);
    CHECK(b.error(out) < 1e-5);
  }
  SECTION("bias add, GELU-tanh gate, scale and softcap") {
    const auto x = b.random_tensor(n, cols, 4.0f);
    const auto up = b.random_tensor(n, cols);
    const auto bias = b.vector(cols, 0.5f, 0.0f);
    const auto out = b.tensor(n, cols);
    b.gpu->add_bias(x.first, bias.first);
    b.cpu.add_bias(x.second, bias.second);
    b.gpu->gelu_tanh_gate(x.first, up.first, out.first);
    b.cpu.gelu_tanh_gate(x.second, up.second, out.second);
    b.gpu->scale(out.first, 8.0f);
    b.cpu.scale(out.second, 8.0f);
    b.gpu->softcap(out.first, 3.0f);
    b.cpu.softcap(out.second, 3.0f);
    CHECK(b.error(out) < 1e-5);
  }
  SECTION("embedding rows of a 16-bit table") {
    const auto table = b.matrix(12, cols, TensorType::f16, 1.0f);
    const auto out = b.tensor(n, cols);
    b.gpu->embed(table.first, out.first);
    b.cpu.embed(table.second, out.second);
    CHECK(b.error(out) == 0.0);
  }
  SECTION("gathering the logit rows") {
    const auto x = b.random_tensor(n, cols);
    const auto out = b.tensor(static_cast<std::int64_t>(step.logit_rows.size()), cols);
    b.gpu->gather_logit_rows(x.first, out.first);
    b.cpu.gather_logit_rows(x.second, out.second);
    CHECK(b.error(out) == 0.0);
  }
}

TEST_CASE("RoPE equals the CPU backend's in both layouts, with and without factors", "[gpu][ops]") {
  Both b;
  b.kv_cache({1, 4096, 4, 2, 64});
  // Positions reach into the thousands, where angle errors grow.
  const auto step = test::make_step({5000, 40}, {30, 40}, 4);
  b.begin(step);
  const auto layout = GENERATE(model::RopeLayout::normal, model::RopeLayout::neox);
  const bool factors = GENERATE(false, true);
  const auto f = b.vector(24, 0.3f, 2.0f);
  model::RopeParams gp{layout, 48, 500000.0f, 0.5f, factors ? &f.first : nullptr};
  model::RopeParams cp{layout, 48, 500000.0f, 0.5f, factors ? &f.second : nullptr};
  const auto x = b.random_tensor(step.num_tokens(), 4 * 64);
  b.gpu->rope(x.first, 64, gp);
  b.cpu.rope(x.second, 64, cp);
  CHECK(b.error(x) < 1e-4);
}

TEST_CASE(
    "paged attention equals the CPU backend's for prefill tiles and split decodes, with "
    "windows and softcaps",
    "[gpu][ops]") {
  gpu::CudaBackendOptions options;
  // Both prefill kernels: half-precision tensor-core products and float FMAs.
  options.prefill_tensor_cores = GENERATE(true, false);
  Both b(options);
  const std::int32_t head_dim = GENERATE(64, 128, 8, 256);
  const std::int32_t kv_heads = 2;
  const std::int32_t group = GENERATE(1, 4);
  const std::int32_t heads = kv_heads * group;
  const std::int32_t block_size = 16;
  b.kv_cache({2, 256, block_size, kv_heads, head_dim});
  model::AttentionParams params{heads, kv_heads, head_dim,
                                1.0f / std::sqrt(static_cast<float>(head_dim))};
  // Plain causal attention; a window inside a decode partition (phi3-like); a window of
  // 300 across partitions and key tiles with a score softcap (gemma2-like).
  const auto limits =
      GENERATE(std::pair<std::int32_t, float>{0, 0.0f}, std::pair<std::int32_t, float>{48, 0.0f},
               std::pair<std::int32_t, float>{300, 5.0f});
  params.window = limits.first;
  params.softcap = limits.second;
  const std::int32_t layer = 1;
  auto run = [&](const model::StepInput& step) {
    b.begin(step);
    const std::int64_t n = step.num_tokens();
    const auto k = b.random_tensor(n, kv_heads * head_dim);
    const auto v = b.random_tensor(n, kv_heads * head_dim);
    const auto q = b.random_tensor(n, heads * head_dim);
    const auto out = b.tensor(n, heads * head_dim);
    b.gpu->store_kv(layer, k.first, v.first);
    b.cpu.store_kv(layer, k.second, v.second);
    b.gpu->attention(layer, q.first, params, out.first);
    b.cpu.attention(layer, q.second, params, out.second);
    // Keys and values are half precision on the GPU.
    CHECK(b.error(out) < 3e-3);
  };
  // A long prompt (many tiles), a short one, a single token; then decodes over 600 keys (five
  // partitions of 128, as three decode rows split) beside a new prompt.
  run(test::make_step({599, 20, 1}, {599, 20, 1}, block_size));
  run(test::make_step({600, 21, 2, 45}, {1, 1, 1, 45}, block_size));
  // Each decode partition size (gpu::decode_partition_for): prompts, then one decode each
  // (no length a multiple of 16, so each keeps its blocks). Two rows split by 64 keys ...
  const auto decode_after = [&](std::vector<std::int32_t> lengths) {
    run(test::make_step(lengths, lengths, block_size));
    for (auto& l : lengths) ++l;
    run(test::make_step(lengths, std::vector<std::int32_t>(lengths.size(), 1), block_size));
  };
  decode_after({599, 129});
  // ... and twelve by 256.
  decode_after({599, 300, 77, 5, 1, 40, 255, 100, 200, 63, 301, 130});
}

TEST_CASE("device sampling: greedy is the argmax, filters keep their sets, seeds repeat",
          "[gpu][sampling]") {
  Both b;
  const std::int32_t vocab = 5000, rows = 64;
  auto logits = test::random_floats(static_cast<std::size_t>(vocab * rows), 3.0f);
  auto t = b.gpu->allocate(rows, vocab);
  REQUIRE(t.has_value());
  REQUIRE(b.gpu->write(*t, logits).has_value());
  auto row = [&](int r) { return std::span<const float>(logits.data() + r * vocab, vocab); };
  auto draw = [&](model::DeviceSamplingRow p, std::uint64_t first_counter) {
    std::vector<model::DeviceSamplingRow> ps(rows, p);
    for (int r = 0; r < rows; ++r) ps[r].counter = first_counter + r;
    std::vector<TokenId> ids(rows, -1);
    REQUIRE(b.gpu->sample(*t, ps, ids).has_value());
    return ids;
  };
  // The tokens of a row whose relative weight (at temperature 1) reaches `cut`, by rank.
  auto ranked = [&](int r) {
    std::vector<std::pair<float, TokenId>> v;
    for (TokenId i = 0; i < vocab; ++i) v.push_back({row(r)[i], i});
    std::sort(v.begin(), v.end(), [](auto a, auto c) { return a.first > c.first; });
    return v;
  };

  SECTION("greedy, and top_k = 1, give the argmax") {
    model::DeviceSamplingRow greedy;
    greedy.temperature = 0.0f;
    model::DeviceSamplingRow top1;
    top1.top_k = 1;
    const auto a = draw(greedy, 0), c = draw(top1, 0);
    for (int r = 0; r < rows; ++r) {
      const auto best = std::max_element(row(r).begin(), row(r).end()) - row(r).begin();
      CHECK(a[r] == best);
      CHECK(c[r] == best);
    }
  }
  SECTION("a grammar's bitmask leaves only its tokens; unmasked rows are untouched") {
    // Even rows allow the ids with id % 7 == row % 7; odd rows have no mask.
    const std::size_t words = (vocab + 63) / 64;
    std::vector<std::vector<std::uint64_t>> masks(rows, std::vector<std::uint64_t>(words, 0));
    auto allowed = [](int r, TokenId id) { return id % 7 == r % 7; };
    for (int r = 0; r < rows; r += 2) {
      for (TokenId id = 0; id < vocab; ++id) {
        if (allowed(r, id)) masks[r][id / 64] |= std::uint64_t{1} << (id % 64);
      }
    }
    std::vector<model::DeviceSamplingRow> ps(rows);
    for (int r = 0; r < rows; ++r) {
      ps[r].temperature = r % 4 < 2 ? 0.0f : 1.0f;  // greedy and drawn rows, masked or not
      ps[r].seed = 99;
      ps[r].counter = static_cast<std::uint64_t>(r);
      if (r % 2 == 0) ps[r].allowed = masks[r].data();
    }
    std::vector<TokenId> ids(rows, -1);
    REQUIRE(b.gpu->sample(*t, ps, ids).has_value());
    for (int r = 0; r < rows; ++r) {
      INFO("row " << r);
      if (r % 2 == 0) CHECK(allowed(r, ids[r]));
      if (ps[r].temperature != 0.0f) continue;
      TokenId best = -1;
      for (TokenId id = 0; id < vocab; ++id) {
        if ((r % 2 == 1 || allowed(r, id)) && (best < 0 || row(r)[id] > row(r)[best])) best = id;
      }
      CHECK(ids[r] == best);
    }
  }
  SECTION("top_k keeps the k most likely") {
    model::DeviceSamplingRow p;
    p.top_k = 5;
    for (std::uint64_t round = 0; round < 20; ++round) {
      const auto ids = draw(p, round * rows);
      for (int r = 0; r < rows; ++r) {
        const auto order = ranked(r);
        const bool in_top = std::any_of(order.begin(), order.begin() + 5,
                                        [&](auto e) { return e.second == ids[r]; });
        CHECK(in_top);
      }
    }
  }
  SECTION("top_p and min_p keep only their sets") {
    model::DeviceSamplingRow p;
    p.top_p = 0.5f;
    p.min_p = 0.02f;
    p.temperature = 0.7f;
    const auto ids = draw(p, 77);
    for (int r = 0; r < rows; ++r) {
      const auto order = ranked(r);
      std::vector<double> w;
      for (auto [l, id] : order) w.push_back(std::exp((l - order[0].first) / 0.7));
      double total = 0.0;
      std::size_t keep = 0;
      while (keep < w.size() && w[keep] >= 0.02) total += w[keep++];
      double cumulative = 0.0;
      std::size_t cut = 0;
      while (cut < keep) {
        cumulative += w[cut++];
        if (cumulative >= 0.5 * total) break;
      }
      // Allow one rank of slack for float rounding at the boundary.
      const std::size_t allowed = std::min(keep, cut + 1);
      const bool inside = std::any_of(order.begin(), order.begin() + allowed,
                                      [&](auto e) { return e.second == ids[r]; });
      CHECK(inside);
    }
  }
  SECTION("ties: exactly k at the k-th and top-p's boundary, the lowest ids, as the CPU") {
    // 4096 draws of one row (by counter) against model::Sampler's kept set: none outside it,
    // and, where it is small and none of it unlikely, every one of it.
    auto check = [&](const std::vector<float>& one, model::DeviceSamplingRow p) {
      constexpr int kDraws = 4096;
      const auto n = static_cast<std::int32_t>(one.size());
      auto s = b.gpu->allocate(kDraws, n);
      REQUIRE(s.has_value());
      std::vector<float> tiled;
      for (int i = 0; i < kDraws; ++i) tiled.insert(tiled.end(), one.begin(), one.end());
      REQUIRE(b.gpu->write(*s, tiled).has_value());
      std::vector<model::DeviceSamplingRow> ps(kDraws, p);
      for (int i = 0; i < kDraws; ++i) ps[i].counter = static_cast<std::uint64_t>(i);
      std::vector<TokenId> ids(kDraws, -1);
      REQUIRE(b.gpu->sample(*s, ps, ids).has_value());
      SamplingParams params;
      params.temperature = p.temperature;
      params.top_k = p.top_k;
      params.top_p = p.top_p;
      params.min_p = p.min_p;
      auto sampler = model::Sampler::create(params, {}, {}, n);
      REQUIRE(sampler.has_value());
      auto kept = sampler->kept_tokens(one);
      std::sort(kept.begin(), kept.end());
      for (const TokenId id : ids) {
        INFO("drawn " << id);
        CHECK(std::binary_search(kept.begin(), kept.end(), id));
      }
      if (kept.size() <= 64) {
        for (const TokenId id : kept) {
          INFO("kept " << id);
          CHECK(std::find(ids.begin(), ids.end(), id) != ids.end());
        }
      }
      return std::pair{kept, ids};
    };
    std::vector<float> one(vocab, -30.0f);
    SECTION("top_k cuts a tie of thirty at the 10th: the three ahead and its 7 lowest ids") {
      for (TokenId id : {4000, 7, 2500}) one[id] = 2.0f;
      for (TokenId j = 0; j < 30; ++j) one[11 + 97 * j] = 1.0f;
      model::DeviceSamplingRow p;
      p.top_k = 10;
      const auto kept = check(one, p).first;
      CHECK(kept == std::vector<TokenId>{7, 11, 108, 205, 302, 399, 496, 593, 2500, 4000});
    }
    SECTION("top_p cuts a tie of sixty after the 25th") {
      for (TokenId id = 200; id < 204; ++id) one[id] = 1.0f;
      for (TokenId j = 0; j < 60; ++j) one[3 * j] = 0.0f;
      model::DeviceSamplingRow p;
      p.top_p = 0.5f;  // 13.04 of 26.07: the four at 1 and 25 at 0 (each e^-1)
      CHECK(check(one, p).first.size() == 29);
    }
    SECTION("top_p over all-equal logits keeps the lowest ids") {
      std::fill(one.begin(), one.end(), 0.5f);
      model::DeviceSamplingRow p;
      p.top_p = 0.25f;  // 1250 of 5000
      const auto [kept, ids] = check(one, p);
      CHECK(kept.size() == 1250);
      CHECK(kept.back() == 1249);
      CHECK(*std::max_element(ids.begin(), ids.end()) >= 1200);
    }
  }
  SECTION("the same seed and counter give the same token; others differ") {
    model::DeviceSamplingRow p;
    p.seed = 1234;
    const auto a = draw(p, 0), c = draw(p, 0);
    CHECK(a == c);
    p.seed = 99;
    CHECK(draw(p, 0) != a);
  }
  SECTION("draws follow the softmax") {
    // One row of 8 tokens, sampled 4096 times by counter.
    const std::vector<float> small = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, -1.0f, 0.25f, 1.5f};
    auto s = b.gpu->allocate(4096, 8);
    REQUIRE(s.has_value());
    std::vector<float> tiled;
    for (int i = 0; i < 4096; ++i) tiled.insert(tiled.end(), small.begin(), small.end());
    REQUIRE(b.gpu->write(*s, tiled).has_value());
    std::vector<model::DeviceSamplingRow> ps(4096);
    for (int i = 0; i < 4096; ++i) {
      ps[i].seed = 5;
      ps[i].counter = static_cast<std::uint64_t>(i);
    }
    std::vector<TokenId> ids(4096);
    REQUIRE(b.gpu->sample(*s, ps, ids).has_value());
    double z = 0.0;
    for (float l : small) z += std::exp(l);
    for (int tok = 0; tok < 8; ++tok) {
      const double expected = std::exp(small[tok]) / z;
      const double seen = static_cast<double>(std::count(ids.begin(), ids.end(), tok)) / ids.size();
      CHECK(std::abs(seen - expected) < 0.03);
    }
  }
}

TEST_CASE("the kernels' limits refuse a model before it runs (no device needed)", "[gpu][limits]") {
  CHECK(gpu::CudaBackend::check_heads(32, 8, 128).has_value());
  CHECK(gpu::CudaBackend::check_heads(8, 8, 8).has_value());
  CHECK(gpu::CudaBackend::check_heads(64, 4, 256).has_value());
  const auto group = gpu::CudaBackend::check_heads(32, 1, 128);
  REQUIRE_FALSE(group.has_value());
  CHECK(group.error().message.find("up to 16 query heads per KV head") != std::string::npos);
  CHECK_FALSE(gpu::CudaBackend::check_heads(30, 8, 128).has_value());
  CHECK_FALSE(gpu::CudaBackend::check_heads(32, 8, 512).has_value());
  CHECK_FALSE(gpu::CudaBackend::check_heads(32, 8, 96).has_value());
  CHECK_FALSE(gpu::CudaBackend::check_heads(32, 8, 4).has_value());
  CHECK_FALSE(gpu::CudaBackend::check_heads(32, 0, 128).has_value());
}

TEST_CASE("the fused RoPE and KV store equals rope, rope and store_kv", "[gpu][ops]") {
  Both b;
  const std::int32_t head_dim = 64, kv_heads = 2, heads = 8, block_size = 16;
  b.kv_cache({1, 64, block_size, kv_heads, head_dim});
  const auto layout = GENERATE(model::RopeLayout::normal, model::RopeLayout::neox);
  const std::int32_t rot_dims = GENERATE(64, 32);  // all dims, or a rotated part and a tail
  const auto step = test::make_step({300, 7, 1}, {40, 1, 1}, block_size);
  b.begin(step);
  const std::int64_t n = step.num_tokens();
  const auto q = b.random_tensor(n, heads * head_dim);
  const auto k = b.random_tensor(n, kv_heads * head_dim);
  const auto v = b.random_tensor(n, kv_heads * head_dim);
  const model::RopeParams rope{layout, rot_dims, 10000.0f, 1.0f, nullptr};
  b.gpu->rope_store_kv(0, q.first, k.first, v.first, head_dim, rope);
  b.cpu.rope_store_kv(0, q.second, k.second, v.second, head_dim, rope);
  CHECK(b.error(q) < 1e-5);
  // The keys and values in the cache, seen through attention (half precision on the GPU).
  const auto out = b.tensor(n, heads * head_dim);
  const model::AttentionParams params{heads, kv_heads, head_dim, 0.125f};
  b.gpu->attention(0, q.first, params, out.first);
  b.cpu.attention(0, q.second, params, out.second);
  CHECK(b.error(out) < 3e-3);
}
