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
#include "cpu/row_ops.hpp"
#include "gguf/dequantize.hpp"

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
// id, as a stable sort does), with their weights as `routing` says.
void route(const float* logits, std::int32_t num, std::int32_t k, ExpertRouting routing,
           std::int32_t* experts, float* weights, std::vector<float>& scratch) {
  scratch.assign(logits, logits + num);
  const bool softmax_first = routing != ExpertRouting::top_k_softmax;
  if (softmax_first) {
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
  thread_local std::vector<std::int32_t> order;
  order.resize(static_cast<std::size_t>(num));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](std::int32_t a, std::int32_t b) {
                      return scratch[a] > scratch[b] || (scratch[a] == scratch[b] && a < b);
                    });
  for (std::int32_t j = 0; j < k; ++j) experts[j] = order[j];
  if (routing == ExpertRouting::softmax_top_k_unnormalised) {
    for (std::int32_t j = 0; j < k; ++j) weights[j] = scratch[experts[j]];
  } else if (routing == ExpertRouting::softmax_top_k) {
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

// Expert e's rows are slots [begin[e], begin[e + 1]).
std::int64_t rows_of(const std::vector<std::int64_t>& begin, std::int32_t e) {
  return begin[static_cast<std::size_t>(e) + 1] - begin[static_cast<std::size_t>(e)];
}

// x += an expert's bias (F32, as the loader keeps biases).
void add_row(float* x, const model::Weight& bias) {
  TROUPE_ASSERT(bias.type == gguf::TensorType::f32, "an expert's bias is F32");
  add_bias_row(x, static_cast<const float*>(bias.data), bias.rows * bias.cols);
}

}  // namespace

void CpuBackend::moe_ffn(Tensor x, const model::MoeLayer& layer, Tensor out) {
  const OpTimer timer = time_op([] { return "moe_ffn"; });
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
  moe_.gate.resize(static_cast<std::size_t>(total * ffn));
  moe_.up.resize(static_cast<std::size_t>(total * ffn));
  moe_.ys.resize(static_cast<std::size_t>(total * dim));
  // Then the experts, each once over its rows.
  const bool int8 = std::all_of(layer.experts.begin(), layer.experts.end(), [&](const auto& w) {
    return has_int8_kernel(w.gate.type, dim) && has_int8_kernel(w.up.type, dim) &&
           has_int8_kernel(w.down.type, ffn);
  });
  if (int8) {
    moe_experts_int8(x, layer, total, ffn);
  } else {
    moe_experts_each(x, layer, total, ffn);
  }
  const Tensor ys{moe_.ys.data(), total, dim};
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

// Quantized experts: the gathered rows quantized once; every loaded expert's gate and up in
// one parallel loop, then the activation (quantized as it is made), then every down in
// another. A task is (expert, a block of output rows), the most-loaded experts' first, so
// no thread waits on one busy expert and the loop's tail is the lightest work.
void CpuBackend::moe_experts_int8(Tensor x, const model::MoeLayer& layer, std::int64_t total,
                                  std::int64_t ffn) {
  const std::int64_t dim = x.cols;
  MoeScratch& m = moe_;
  const auto num = static_cast<std::int32_t>(layer.experts.size());
  m.loaded.clear();
  for (std::int32_t e = 0; e < num; ++e) {
    if (rows_of(m.begin, e) > 0) m.loaded.push_back(e);
  }
  std::stable_sort(m.loaded.begin(), m.loaded.end(), [&](std::int32_t a, std::int32_t b) {
    return rows_of(m.begin, a) > rows_of(m.begin, b);
  });
  m.xs_int8.resize(total, dim);
  pool_.parallel_for(total,
                     [&](std::int64_t s) { m.xs_int8.quantize_row(s, row_of(x, m.slot_row[s])); });
  const Int8Rows xq = m.xs_int8.rows();
  const auto loaded = static_cast<std::int64_t>(m.loaded.size());
  // Each loaded expert's weights repacked (on their first product; not from the threads).
  m.packed.assign(static_cast<std::size_t>(3 * num), nullptr);
  for (const std::int32_t e : m.loaded) {
    const model::ExpertWeights& w = layer.experts[static_cast<std::size_t>(e)];
    m.packed[3 * e] = repacked(w.gate);
    m.packed[3 * e + 1] = repacked(w.up);
    m.packed[3 * e + 2] = repacked(w.down);
  }
  const std::int64_t up_chunk = rows_per_task(ffn, pool_.num_threads());
  const std::int64_t up_tasks = (ffn + up_chunk - 1) / up_chunk;
  pool_.parallel_for(loaded * up_tasks, [&](std::int64_t task) {
    const std::int32_t e = m.loaded[static_cast<std::size_t>(task / up_tasks)];
    const std::int64_t r0 = task % up_tasks * up_chunk, rows = std::min(up_chunk, ffn - r0);
    const std::int64_t b0 = m.begin[static_cast<std::size_t>(e)], count = rows_of(m.begin, e);
    const model::ExpertWeights& w = layer.experts[static_cast<std::size_t>(e)];
    const Int8Rows rows_in = xq.from_row(b0);
    for (int which = 0; which < 2; ++which) {
      const model::Weight& weight = which == 0 ? w.gate : w.up;
      float* out = (which == 0 ? m.gate.data() : m.up.data()) + b0 * ffn + r0;
      int8_product(weight.type, m.packed[3 * e + which], static_cast<const std::byte*>(weight.data),
                   gguf::row_bytes(weight.type, dim), rows_in, count, r0, rows, out, ffn);
    }
  });
  m.gate_int8.resize(total, ffn);
  pool_.parallel_for(total, [&](std::int64_t s) {
    const auto e = static_cast<std::size_t>(std::upper_bound(m.begin.begin(), m.begin.end(), s) -
                                            m.begin.begin() - 1);
    const model::ExpertWeights& w = layer.experts[e];
    float* g = m.gate.data() + s * ffn;
    float* u = m.up.data() + s * ffn;
    if (w.gate_bias.data != nullptr) add_row(g, w.gate_bias);
    if (w.up_bias.data != nullptr) add_row(u, w.up_bias);
    if (layer.activation == ExpertActivation::silu) {
      swiglu_row(g, u, g, ffn);
    } else {
      swiglu_oai(g, u, ffn);
    }
    m.gate_int8.quantize_row(s, g);
  });
  const Int8Rows hq = m.gate_int8.rows();
  const std::int64_t down_chunk = rows_per_task(dim, pool_.num_threads());
  const std::int64_t down_tasks = (dim + down_chunk - 1) / down_chunk;
  pool_.parallel_for(loaded * down_tasks, [&](std::int64_t task) {
    const std::int32_t e = m.loaded[static_cast<std::size_t>(task / down_tasks)];
    const std::int64_t r0 = task % down_tasks * down_chunk, rows = std::min(down_chunk, dim - r0);
    const std::int64_t b0 = m.begin[static_cast<std::size_t>(e)], count = rows_of(m.begin, e);
    const model::ExpertWeights& w = layer.experts[static_cast<std::size_t>(e)];
    float* y = m.ys.data() + b0 * dim + r0;
    int8_product(w.down.type, m.packed[3 * e + 2], static_cast<const std::byte*>(w.down.data),
                 gguf::row_bytes(w.down.type, ffn), hq.from_row(b0), count, r0, rows, y, dim);
    if (w.down_bias.data != nullptr) {
      const auto* b = static_cast<const float*>(w.down_bias.data) + r0;
      for (std::int64_t s = 0; s < count; ++s) {
        add_bias_row(y + s * dim, b, rows);
      }
    }
  });
}

// Float experts: each expert's matmuls in turn, each spread over the threads.
void CpuBackend::moe_experts_each(Tensor x, const model::MoeLayer& layer, std::int64_t total,
                                  std::int64_t ffn) {
  MoeScratch& m = moe_;
  const std::int64_t dim = x.cols;
  m.xs.resize(static_cast<std::size_t>(total * dim));
  const Tensor xs{m.xs.data(), total, dim}, gate{m.gate.data(), total, ffn},
      up{m.up.data(), total, ffn}, ys{m.ys.data(), total, dim};
  pool_.parallel_for(
      total, [&](std::int64_t s) { std::copy_n(row_of(x, m.slot_row[s]), dim, row_of(xs, s)); });
  const auto num = static_cast<std::int32_t>(layer.experts.size());
  for (std::int32_t e = 0; e < num; ++e) {
    const std::int64_t b0 = m.begin[static_cast<std::size_t>(e)];
    const std::int64_t count = rows_of(m.begin, e);
    if (count == 0) continue;
    const model::ExpertWeights& w = layer.experts[static_cast<std::size_t>(e)];
    const Tensor xe{row_of(xs, b0), count, dim}, ge{row_of(gate, b0), count, ffn},
        ue{row_of(up, b0), count, ffn}, ye{row_of(ys, b0), count, dim};
    matmul(xe, w.gate, ge);
    matmul(xe, w.up, ue);
    if (w.gate_bias.data != nullptr) add_bias(ge, w.gate_bias);
    if (w.up_bias.data != nullptr) add_bias(ue, w.up_bias);
    if (layer.activation == ExpertActivation::silu) {
      swiglu(ge, ue, ge);
    } else {
      pool_.parallel_for(count,
                         [&](std::int64_t r) { swiglu_oai(row_of(ge, r), row_of(ue, r), ffn); });
    }
    matmul(ge, w.down, ye);
    if (w.down_bias.data != nullptr) add_bias(ye, w.down_bias);
  }
}

}  // namespace troupe::cpu
