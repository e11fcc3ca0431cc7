// The CPU backend's mixture-of-experts FFN: route each row to its experts, then run each
// expert once over all the rows routed to it (its weights read once per step, not once
// per token), and add each row's expert outputs weighted, in the order they were chosen.
//
// A row's numbers never depend on the batch: each expert's matmul computes every row with
// the same accumulation order whatever rows share its tile (the kernels' rule), and a
// row's sum over its experts runs in its own chosen order.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "cpu/cpu_backend.hpp"

namespace troupe::cpu {

using model::ExpertActivation;
using model::ExpertRouting;
using model::Tensor;

namespace {

// Row r of a tensor.
float* row_of(Tensor t, std::int64_t r) {
  return t.data + r * t.cols;
}

// The k experts of one row from its router logits [num], largest first (ties: the lower
// id, as a stable sort does), with their weights.
void route(const float* logits, std::int32_t num, std::int32_t k, ExpertRouting routing,
           std::int32_t* experts, float* weights, std::vector<float>& scratch) {
  scratch.assign(logits, logits + num);
  if (routing == ExpertRouting::softmax_top_k) {
    // p = softmax(l), as ggml's soft_max (the sum in double, one scale after).
    const float max = *std::max_element(scratch.begin(), scratch.end());
    double sum = 0.0;
    for (float& v : scratch) {
      v = std::exp(v - max);
      sum += v;
    }
    const auto inverse = static_cast<float>(1.0 / sum);
    for (float& v : scratch) v *= inverse;
  }
  std::vector<std::int32_t> order(static_cast<std::size_t>(num));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](std::int32_t a, std::int32_t b) {
                      return scratch[a] > scratch[b] || (scratch[a] == scratch[b] && a < b);
                    });
  for (std::int32_t j = 0; j < k; ++j) experts[j] = order[j];
  if (routing == ExpertRouting::softmax_top_k) {
    // The chosen probabilities, renormalised to sum 1.
    float total = 0.0f;
    for (std::int32_t j = 0; j < k; ++j) total += scratch[experts[j]];
    for (std::int32_t j = 0; j < k; ++j) weights[j] = scratch[experts[j]] / total;
  } else {
    // softmax over the chosen logits.
    const float max = scratch[experts[0]];
    float total = 0.0f;
    for (std::int32_t j = 0; j < k; ++j) {
      weights[j] = std::exp(scratch[experts[j]] - max);
      total += weights[j];
    }
    for (std::int32_t j = 0; j < k; ++j) weights[j] /= total;
  }
}

// gate <- act(gate, up) for gpt-oss's clamped SwiGLU.
void swiglu_oai(float* gate, const float* up, std::int64_t n) {
  constexpr float kLimit = 7.0f, kAlpha = 1.702f;
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = std::min(gate[i], kLimit);
    const float u = std::clamp(up[i], -kLimit, kLimit);
    gate[i] = g / (1.0f + std::exp(-kAlpha * g)) * (u + 1.0f);
  }
}

}  // namespace

void CpuBackend::moe_ffn(Tensor x, const model::MoeLayer& layer, Tensor out) {
  const std::int64_t n = x.rows, dim = x.cols;
  const auto num = static_cast<std::int32_t>(layer.experts.size());
  const std::int32_t k = layer.num_used;
  const std::int64_t ffn = layer.experts.front().gate.rows;
  TROUPE_ASSERT(out.rows == n && out.cols == dim && k > 0 && k <= num, "moe_ffn shapes disagree");
  if (n == 0) return;
  // First, the router's logits and each row's experts.
  moe_.logits.resize(static_cast<std::size_t>(n * num));
  const Tensor logits{moe_.logits.data(), n, num};
  matmul(x, layer.router, logits);
  if (layer.router_bias.data != nullptr) add_bias(logits, layer.router_bias);
  moe_.experts.resize(static_cast<std::size_t>(n * k));
  moe_.weights.resize(static_cast<std::size_t>(n * k));
  pool_.parallel_for(n, [&](std::int64_t r) {
    thread_local std::vector<float> scratch;
    route(row_of(logits, r), num, k, layer.routing, moe_.experts.data() + r * k,
          moe_.weights.data() + r * k, scratch);
  });
  // Next, every (row, choice) by expert: expert e's rows are slots [begin[e], begin[e+1]) of
  // the gathered matrices, in row order.
  moe_.begin.assign(static_cast<std::size_t>(num) + 1, 0);
  for (const std::int32_t e : moe_.experts) ++moe_.begin[static_cast<std::size_t>(e) + 1];
  std::partial_sum(moe_.begin.begin(), moe_.begin.end(), moe_.begin.begin());
  moe_.slot.resize(static_cast<std::size_t>(n * k));  // (row, choice) -> its slot
  moe_.slot_row.resize(static_cast<std::size_t>(n * k));
  {
    std::vector<std::int64_t> next(moe_.begin.begin(), moe_.begin.end() - 1);
    for (std::int64_t a = 0; a < n * k; ++a) {
      const std::int64_t s = next[static_cast<std::size_t>(moe_.experts[a])]++;
      moe_.slot[a] = s;
      moe_.slot_row[s] = a / k;
    }
  }
  const std::int64_t total = n * k;
  moe_.xs.resize(static_cast<std::size_t>(total * dim));
  moe_.gate.resize(static_cast<std::size_t>(total * ffn));
  moe_.up.resize(static_cast<std::size_t>(total * ffn));
  moe_.ys.resize(static_cast<std::size_t>(total * dim));
  const Tensor xs{moe_.xs.data(), total, dim}, gate{moe_.gate.data(), total, ffn},
      up{moe_.up.data(), total, ffn}, ys{moe_.ys.data(), total, dim};
  pool_.parallel_for(
      total, [&](std::int64_t s) { std::copy_n(row_of(x, moe_.slot_row[s]), dim, row_of(xs, s)); });
  // Then each expert once, over its rows.
  for (std::int32_t e = 0; e < num; ++e) {
    const std::int64_t b0 = moe_.begin[static_cast<std::size_t>(e)];
    const std::int64_t m = moe_.begin[static_cast<std::size_t>(e) + 1] - b0;
    if (m == 0) continue;
    const model::ExpertWeights& w = layer.experts[static_cast<std::size_t>(e)];
    const Tensor xe{row_of(xs, b0), m, dim}, ge{row_of(gate, b0), m, ffn},
        ue{row_of(up, b0), m, ffn}, ye{row_of(ys, b0), m, dim};
    matmul(xe, w.gate, ge);
    matmul(xe, w.up, ue);
    if (w.gate_bias.data != nullptr) add_bias(ge, w.gate_bias);
    if (w.up_bias.data != nullptr) add_bias(ue, w.up_bias);
    if (layer.activation == ExpertActivation::silu) {
      swiglu(ge, ue, ge);
    } else {
      pool_.parallel_for(m, [&](std::int64_t r) { swiglu_oai(row_of(ge, r), row_of(ue, r), ffn); });
    }
    matmul(ge, w.down, ye);
    if (w.down_bias.data != nullptr) add_bias(ye, w.down_bias);
  }
  // Last, each row's weighted sum, in the order its experts were chosen.
  pool_.parallel_for(n, [&](std::int64_t r) {
    float* o = row_of(out, r);
    for (std::int32_t j = 0; j < k; ++j) {
      const float w = moe_.weights[r * k + j];
      const float* y = row_of(ys, moe_.slot[r * k + j]);
      if (j == 0) {
        for (std::int64_t i = 0; i < dim; ++i) o[i] = w * y[i];
      } else {
        for (std::int64_t i = 0; i < dim; ++i) o[i] += w * y[i];
      }
    }
  });
}

}  // namespace troupe::cpu
