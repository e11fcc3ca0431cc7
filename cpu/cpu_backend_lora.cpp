// The CPU's LoRA updates: for each adapter group of a step, its rows gathered in tiles and
// multiplied by A then B with the float kernel (matmul_tile_float: every dot product in one
// fixed order, so a row's update never depends on the batch), then added to y, scaled.
#include <algorithm>
#include <vector>

#include "cpu/cpu_backend.hpp"
#include "cpu/kernels.hpp"

namespace troupe::cpu {

using model::Tensor;

void CpuBackend::lora_add(Tensor x, std::span<const model::LoraGroup> groups, Tensor y) {
  constexpr std::int64_t kTile = 8;  // rows of a group gathered per task
  struct Task {
    std::size_t group;
    std::int64_t begin, count;
  };
  std::vector<Task> tasks;
  double macs = 0.0;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const auto& group = groups[g];
    TROUPE_ASSERT(group.a.type == gguf::TensorType::f32 && group.b.type == gguf::TensorType::f32 &&
                      group.a.cols == x.cols && group.b.rows == y.cols &&
                      group.b.cols == group.a.rows && x.rows == y.rows,
                  "lora_add shapes disagree");
    const auto m = static_cast<std::int64_t>(group.rows.size());
    for (std::int64_t r = 0; r < m; r += kTile) tasks.push_back({g, r, std::min(kTile, m - r)});
    macs += static_cast<double>(m) * static_cast<double>(group.a.rows) *
            static_cast<double>(x.cols + y.cols);
  }
  const OpTimer timer = time_op([] { return "lora_add"; }, macs);
  pool_.parallel_for(static_cast<std::int64_t>(tasks.size()), [&](std::int64_t i) {
    const Task& task = tasks[static_cast<std::size_t>(i)];
    const model::LoraGroup& group = groups[task.group];
    const std::int64_t rank = group.a.rows, n_in = x.cols, n_out = y.cols;
    thread_local std::vector<float> xs, ax, ys;
    xs.resize(static_cast<std::size_t>(task.count * n_in));
    ax.resize(static_cast<std::size_t>(task.count * rank));
    ys.resize(static_cast<std::size_t>(task.count * n_out));
    for (std::int64_t t = 0; t < task.count; ++t) {
      const std::int32_t row = group.rows[static_cast<std::size_t>(task.begin + t)];
      TROUPE_ASSERT(row >= 0 && row < x.rows, "lora_add row outside the batch");
      std::copy_n(x.data + row * n_in, n_in, xs.data() + t * n_in);
    }
    matmul_tile_float(gguf::TensorType::f32, xs.data(), n_in, task.count,
                      static_cast<const std::byte*>(group.a.data), sizeof(float) * n_in, rank, n_in,
                      ax.data(), rank);
    matmul_tile_float(gguf::TensorType::f32, ax.data(), rank, task.count,
                      static_cast<const std::byte*>(group.b.data), sizeof(float) * rank, n_out,
                      rank, ys.data(), n_out);
    for (std::int64_t t = 0; t < task.count; ++t) {
      float* out = y.data + group.rows[static_cast<std::size_t>(task.begin + t)] * n_out;
      const float* update = ys.data() + t * n_out;
      for (std::int64_t j = 0; j < n_out; ++j) out[j] += group.scale * update[j];
    }
  });
}

}  // namespace troupe::cpu
