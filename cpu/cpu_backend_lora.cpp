// The CPU's LoRA updates: for each adapter group of a step, its rows gathered in tiles and
// multiplied by A (matmul_tile_float, A as stored), then B (A x) added to y, scaled
// (lora_expand over B transposed, the tile's columns shared out in blocks so that a single
// row's update still spreads over the threads). Every element is one fixed chain of
// multiply-adds, so a row's update never depends on the rows beside it or on the batch.
#include <algorithm>
#include <vector>

#include "cpu/cpu_backend.hpp"
#include "cpu/kernels.hpp"

namespace troupe::cpu {

using model::Tensor;

void CpuBackend::lora_add(Tensor x, std::span<const model::LoraGroup> groups, Tensor y) {
  constexpr std::int64_t kTile = 8;       // rows of a group a task takes
  constexpr std::int64_t kColumns = 512;  // of y, a task of the expansion takes
  struct Tile {
    std::size_t group;
    std::int64_t begin, count;  // of the group's rows
    std::int64_t ax;            // where its rows' A x start in `ax`, rank floats a row
  };
  std::vector<Tile> tiles;
  std::int64_t ax_floats = 0;
  double shrink_macs = 0.0, expand_macs = 0.0, shrink_bytes = 0.0, expand_bytes = 0.0;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const auto& group = groups[g];
    TROUPE_ASSERT(
        (group.a.type == gguf::TensorType::f32 || group.a.type == gguf::TensorType::f16) &&
            group.b_t.type == group.a.type && group.a.cols == x.cols && group.b_t.cols == y.cols &&
            group.b_t.rows == group.a.rows && x.rows == y.rows,
        "lora_add shapes disagree");
    const auto m = static_cast<std::int64_t>(group.rows.size());
    for (std::int64_t r = 0; r < m; r += kTile) {
      const std::int64_t count = std::min(kTile, m - r);
      tiles.push_back({g, r, count, ax_floats});
      ax_floats += count * group.a.rows;
    }
    const auto rank = static_cast<double>(group.a.rows);
    shrink_macs += static_cast<double>(m) * rank * static_cast<double>(x.cols);
    expand_macs += static_cast<double>(m) * rank * static_cast<double>(y.cols);
    if (m > 0) {
      const double size = group.a.type == gguf::TensorType::f16 ? 2.0 : 4.0;
      shrink_bytes += size * rank * static_cast<double>(x.cols);
      expand_bytes += size * rank * static_cast<double>(y.cols);
    }
  }
  if (tiles.empty()) return;
  std::vector<float> ax(static_cast<std::size_t>(ax_floats));
  const auto row_of = [&](const Tile& tile, std::int64_t t) {
    const std::int32_t row = groups[tile.group].rows[static_cast<std::size_t>(tile.begin + t)];
    TROUPE_ASSERT(row >= 0 && row < x.rows, "lora_add row outside the batch");
    return row;
  };
  const auto shrink = [&](const Tile& tile) {
    const model::LoraGroup& group = groups[tile.group];
    const std::int64_t rank = group.a.rows, n_in = x.cols;
    thread_local std::vector<float> xs;
    xs.resize(static_cast<std::size_t>(tile.count * n_in));
    for (std::int64_t t = 0; t < tile.count; ++t) {
      std::copy_n(x.data + row_of(tile, t) * n_in, n_in, xs.data() + t * n_in);
    }
    const std::size_t size = group.a.type == gguf::TensorType::f16 ? 2 : 4;
    matmul_tile_float(group.a.type, xs.data(), n_in, tile.count,
                      static_cast<const std::byte*>(group.a.data),
                      size * static_cast<std::size_t>(n_in), rank, n_in, ax.data() + tile.ax, rank);
  };
  const auto expand = [&](const Tile& tile, std::int64_t begin, std::int64_t end) {
    const model::LoraGroup& group = groups[tile.group];
    thread_local std::vector<float*> ys;
    ys.resize(static_cast<std::size_t>(tile.count));
    for (std::int64_t t = 0; t < tile.count; ++t) {
      ys[static_cast<std::size_t>(t)] = y.data + row_of(tile, t) * y.cols;
    }
    lora_expand(group.b_t.type, ax.data() + tile.ax, tile.count, group.b_t.rows,
                static_cast<const std::byte*>(group.b_t.data), y.cols, begin, end, group.scale,
                ys.data());
  };
  const auto num_tiles = static_cast<std::int64_t>(tiles.size());
  // Enough tiles to keep every thread busy: each task takes a tile whole, in one pass.
  if (num_tiles >= 2 * pool_.num_threads()) {
    const OpTimer timer =
        time_op([] { return "lora_add"; }, shrink_macs + expand_macs, shrink_bytes + expand_bytes);
    pool_.parallel_for(num_tiles, [&](std::int64_t i) {
      const Tile& tile = tiles[static_cast<std::size_t>(i)];
      shrink(tile);
      expand(tile, 0, y.cols);
    });
    return;
  }
  // Few: A x a task a tile, then B (A x) with the columns shared out too.
  {
    const OpTimer timer = time_op([] { return "lora A x"; }, shrink_macs, shrink_bytes);
    pool_.parallel_for(num_tiles,
                       [&](std::int64_t i) { shrink(tiles[static_cast<std::size_t>(i)]); });
  }
  const OpTimer timer = time_op([] { return "lora B (A x)"; }, expand_macs, expand_bytes);
  const std::int64_t blocks = (y.cols + kColumns - 1) / kColumns;
  pool_.parallel_for(num_tiles * blocks, [&](std::int64_t i) {
    const std::int64_t begin = (i % blocks) * kColumns;
    expand(tiles[static_cast<std::size_t>(i / blocks)], begin, std::min(y.cols, begin + kColumns));
  });
}

}  // namespace troupe::cpu
