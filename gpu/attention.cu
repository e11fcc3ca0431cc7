// Paged attention: one kernel for decode (one query per sequence, split along the
// context, then combined) and one for prefill chunks (query tiles against key tiles
// in shared memory with an online softmax, as FlashAttention does). The KV cache
// holds half-precision slots of [num_kv_heads * head_dim]; block tables map a
// sequence's positions to slots. Optionally (gemma2, phi3) a score is soft-capped,
// s = cap * tanh(s / cap), and a query at position p sees only the keys j with
// p - j < window: the masked keys score -inf, and partitions or key tiles wholly before
// a query's window are skipped.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cmath>

#include "gpu/kernels.hpp"

namespace troupe::gpu::kernels {

namespace {

constexpr int kDecodeThreads = 128;
constexpr int kPrefillThreads = 128;
constexpr int kKeyTile = 32;
constexpr int kLanesPerRow = kPrefillThreads / kPrefillTile;  // 8
constexpr int kDimsPerLane = kMaxHeadDim / kLanesPerRow;      // 32

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ std::int64_t slot_of(const std::int32_t* table, std::int32_t position,
                                                std::int32_t block_size) {
  return static_cast<std::int64_t>(table[position / block_size]) * block_size +
         position % block_size;
}

// Writes one output value, and its 16-bit copy when one is asked for.
__device__ __forceinline__ void write_out(const AttentionArgs& a, std::int64_t index, float v) {
  a.out[index] = v;
  if (a.out16.data == nullptr) return;
  if (a.out16.type == Half16::f16) {
    static_cast<__half*>(a.out16.data)[index] = __float2half_rn(v);
  } else {
    static_cast<__nv_bfloat16*>(a.out16.data)[index] = __float2bfloat16_rn(v);
  }
}

// The keys a row attends to: up to its own position; none for a padding row.
__device__ __forceinline__ int keys_of(const AttentionArgs& a, int row) {
  return a.token_seq[row] < 0 ? 0 : a.positions[row] + 1;
}

// The first key a row of `length` keys sees through the window (0 without one).
__device__ __forceinline__ int window_start(const AttentionArgs& a, int length) {
  return a.window > 0 ? max(0, length - a.window) : 0;
}

// A score after the optional softcap.
__device__ __forceinline__ float cap_score(const AttentionArgs& a, float s) {
  return a.softcap > 0.0f ? a.softcap * tanhf(s / a.softcap) : s;
}

// Eight halves at a 16-byte aligned address, as floats.
__device__ __forceinline__ void load8(const __half* p, float (&out)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const auto* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

constexpr int kDecodeWarps = kDecodeThreads / 32;
constexpr int kHeadPass = 8;  // query heads whose values one pass accumulates in registers

std::size_t decode_shared_bytes(int group, int dim) {
  const int floats = group * dim + group * kDecodePartition + kDecodeWarps * kHeadPass * dim;
  return sizeof(float) * static_cast<std::size_t>((floats + 1) / 2 * 2) +
         sizeof(std::int64_t) * kDecodePartition;
}

// grid (num_kv_heads, num_decode_rows, num_splits): one block per (KV head, query row,
// partition of a.partition keys, kDecodePartition at most), for all the group's query heads
// at once.
// Scores: one key per thread, its row read in 16-byte pieces (many loads in flight).
// Values: a thread owns 8 dims for one lane of keys; lanes are summed by shuffles within a
// warp and through shared memory across warps. A partition past the context's end does
// nothing: the combine reads only partitions that hold keys.
__global__ void __launch_bounds__(kDecodeThreads)
    decode_kernel(AttentionArgs a, const std::int32_t* __restrict__ decode_rows,
                  std::int32_t num_splits, float* __restrict__ partials) {
  const int kv_head = blockIdx.x;
  const int item = blockIdx.y;
  const int split = blockIdx.z;
  const int row = decode_rows[item];
  const int group = a.num_heads / a.num_kv_heads;
  const int dim = a.head_dim;
  const int kv_dim = a.num_kv_heads * dim;
  const std::int64_t q_stride = static_cast<std::int64_t>(a.num_heads) * dim;
  const int length = keys_of(a, row);
  const int start = split * a.partition;
  const int end = min(length, start + a.partition);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (start >= end) {
    if (length == 0 && split == 0 && num_splits == 1) {  // a padding row: zeros
      for (int idx = threadIdx.x; idx < group * dim; idx += kDecodeThreads) {
        write_out(a, row * q_stride + kv_head * group * dim + idx, 0.0f);
      }
    }
    return;
  }
  const int first_key = window_start(a, length);
  if (end <= first_key) return;  // wholly before the window: the combine skips it
  const int n = end - start;

  extern __shared__ float smem[];
  float* q_s = smem;                               // [group][dim], scaled
  float* p_s = q_s + group * dim;                  // [group][kDecodePartition]
  float* red_s = p_s + group * kDecodePartition;   // [warps][kHeadPass][dim]
  auto* slot_s = reinterpret_cast<std::int64_t*>(  // [kDecodePartition], 8-byte aligned
      smem + (group * dim + group * kDecodePartition + kDecodeWarps * kHeadPass * dim + 1) / 2 * 2);
  __shared__ float m_s[kMaxGroup], l_s[kMaxGroup];

  for (int idx = threadIdx.x; idx < group * dim; idx += kDecodeThreads) {
    q_s[idx] = a.q[row * q_stride + kv_head * group * dim + idx] * a.scale;
  }
  __syncthreads();

  const std::int32_t* table =
      a.block_tables + static_cast<std::int64_t>(a.token_seq[row]) * a.block_stride;
  const auto* k_cache = static_cast<const __half*>(a.k_cache);
  const auto* v_cache = static_cast<const __half*>(a.v_cache);
  for (int t = threadIdx.x; t < n; t += kDecodeThreads) {
    const std::int64_t slot = slot_of(table, start + t, a.block_size);
    slot_s[t] = slot;
    const __half* key = k_cache + slot * kv_dim + kv_head * dim;
    float acc[kMaxGroup];
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) acc[g] = 0.0f;
#pragma unroll 4
    for (int d = 0; d < dim; d += 8) {
      float k[8];
      load8(key + d, k);
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g < group) {
          const float* q = q_s + g * dim + d;
          float dot = 0.0f;
#pragma unroll
          for (int i = 0; i < 8; ++i) dot += q[i] * k[i];
          acc[g] += dot;
        }
      }
    }
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g < group) {
        p_s[g * kDecodePartition + t] = start + t >= first_key ? cap_score(a, acc[g]) : -INFINITY;
      }
    }
  }
  __syncthreads();

  for (int g = warp; g < group; g += kDecodeWarps) {
    float* p = p_s + g * kDecodePartition;
    float m = -INFINITY;
    for (int j = lane; j < n; j += 32) m = fmaxf(m, p[j]);
    m = warp_max(m);
    float l = 0.0f;
    for (int j = lane; j < n; j += 32) {
      const float e = __expf(p[j] - m);
      p[j] = e;
      l += e;
    }
    l = warp_sum(l);
    if (lane == 0) {
      m_s[g] = m;
      l_s[g] = l;
    }
  }
  __syncthreads();

  // dim / 8 "dim groups" of 8 values; 128 / (dim / 8) key lanes. head_dim is a power of two
  // from 8 to 256 (check_heads), so a warp holds whole key lanes or one lane's part.
  const int dim_groups = dim / 8;
  const int key_lanes = kDecodeThreads / dim_groups;
  const int dg = threadIdx.x % dim_groups, kl = threadIdx.x / dim_groups;
  for (int g0 = 0; g0 < group; g0 += kHeadPass) {
    float acc[kHeadPass][8];
#pragma unroll
    for (int h = 0; h < kHeadPass; ++h) {
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[h][i] = 0.0f;
    }
#pragma unroll 4
    for (int t = kl; t < n; t += key_lanes) {
      float v[8];
      load8(v_cache + slot_s[t] * kv_dim + kv_head * dim + dg * 8, v);
#pragma unroll
      for (int h = 0; h < kHeadPass; ++h) {
        if (g0 + h < group) {
          const float p = p_s[(g0 + h) * kDecodePartition + t];
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[h][i] += p * v[i];
        }
      }
    }
    // Key lanes of one warp hold the same dims dim_groups lanes apart.
    for (int o = dim_groups; o < 32; o <<= 1) {
#pragma unroll
      for (int h = 0; h < kHeadPass; ++h) {
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[h][i] += __shfl_xor_sync(0xffffffffu, acc[h][i], o);
      }
    }
    if (lane < dim_groups) {
#pragma unroll
      for (int h = 0; h < kHeadPass; ++h) {
#pragma unroll
        for (int i = 0; i < 8; ++i) red_s[(warp * kHeadPass + h) * dim + dg * 8 + i] = acc[h][i];
      }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < kHeadPass * dim; idx += kDecodeThreads) {
      const int h = idx / dim, d = idx % dim, g = g0 + h;
      if (g >= group) continue;
      float o = 0.0f;
#pragma unroll
      for (int w = 0; w < kDecodeWarps; ++w) o += red_s[(w * kHeadPass + h) * dim + d];
      if (num_splits == 1) {
        write_out(a, row * q_stride + (kv_head * group + g) * dim + d, o / l_s[g]);
      } else {
        const std::int64_t head = kv_head * group + g;
        float* out = partials +
                     ((item * static_cast<std::int64_t>(a.num_heads) + head) * num_splits + split) *
                         (dim + 2);
        out[d] = o;
        if (d == 0) {
          out[dim] = m_s[g];
          out[dim + 1] = l_s[g];
        }
      }
    }
    __syncthreads();  // red_s is reused by the next pass
  }
}

// grid (num_decode_rows, num_heads): merges a head's partitions by their maxima and sums,
// reading only the partitions that hold keys.
__global__ void combine_kernel(AttentionArgs a, const std::int32_t* __restrict__ decode_rows,
                               std::int32_t num_splits, const float* __restrict__ partials) {
  const int item = blockIdx.x, head = blockIdx.y;
  const int dim = a.head_dim;
  const int row = decode_rows[item];
  const int used = min(num_splits, (keys_of(a, row) + a.partition - 1) / a.partition);
  // The partitions before the window's start computed nothing.
  const int first = window_start(a, keys_of(a, row)) / a.partition;
  const float* base =
      partials + (item * static_cast<std::int64_t>(a.num_heads) + head) * num_splits * (dim + 2);
  float m = -INFINITY;
  for (int s = first; s < used; ++s) m = fmaxf(m, base[s * (dim + 2) + dim]);
  float total = 0.0f;
  for (int s = first; s < used; ++s) {
    const float* p = base + s * (dim + 2);
    total += __expf(p[dim] - m) * p[dim + 1];
  }
  const std::int64_t out = row * static_cast<std::int64_t>(a.num_heads) * dim + head * dim;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    float acc = 0.0f;
    for (int s = first; s < used; ++s) {
      const float* p = base + s * (dim + 2);
      acc += __expf(p[dim] - m) * p[d];
    }
    write_out(a, out + d, used > 0 ? acc / total : 0.0f);
  }
}

// One query row's step of the online softmax over a key tile, shared by the 8 lanes that
// hold the row (lanes 8r .. 8r + 7 of a warp). `s` holds this lane's scores, -inf where
// masked; they become unnormalized probabilities against the new running maximum `m`, and
// `l` the running sum. Returns the factor the row's running output must be scaled by.
template <int N>
__device__ __forceinline__ float online_softmax(float (&s)[N], float& m, float& l) {
  float tile_max = -INFINITY;
#pragma unroll
  for (int i = 0; i < N; ++i) tile_max = fmaxf(tile_max, s[i]);
  for (int o = 1; o < kLanesPerRow; o <<= 1) {
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, o));
  }
  const float m_new = fmaxf(m, tile_max);
  const float alpha = m == -INFINITY ? 0.0f : __expf(m - m_new);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    s[i] = s[i] == -INFINITY ? 0.0f : __expf(s[i] - m_new);
    sum += s[i];
  }
  for (int o = 1; o < kLanesPerRow; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  l = l * alpha + sum;
  m = m_new;
  return alpha;
}

std::size_t prefill_shared_bytes(int dim) {
  return sizeof(float) * (kPrefillTile * dim + kKeyTile * (dim + 1) + kKeyTile * dim +
                          kPrefillTile * (kKeyTile + 1));
}

// grid (num_heads, num_tiles). Thread (r, c) of the tile: query row r = tid / 8; it scores
// keys c, c + 8, ... of each key tile and owns output dims c, c + 8, ...
__global__ void __launch_bounds__(kPrefillThreads)
    prefill_kernel(AttentionArgs a, const PrefillTile* __restrict__ tiles) {
  const int head = blockIdx.x;
  const PrefillTile tile = tiles[blockIdx.y];
  const int group = a.num_heads / a.num_kv_heads;
  const int kv_head = head / group;
  const int dim = a.head_dim;
  const int kv_dim = a.num_kv_heads * dim;
  const std::int64_t q_stride = static_cast<std::int64_t>(a.num_heads) * dim;
  const int r = threadIdx.x / kLanesPerRow, c = threadIdx.x % kLanesPerRow;
  const bool valid = r < tile.num_rows;
  const int row = tile.first_row + r;
  const int seq = a.token_seq[tile.first_row];
  const int position = valid ? a.positions[row] : -1;
  const int num_keys = a.positions[tile.first_row + tile.num_rows - 1] + 1;

  extern __shared__ float smem[];
  float* q_s = smem;                        // [tile][dim]
  float* k_s = q_s + kPrefillTile * dim;    // [key tile][dim + 1]
  float* v_s = k_s + kKeyTile * (dim + 1);  // [key tile][dim]
  float* p_s = v_s + kKeyTile * dim;        // [tile][key tile + 1]

  for (int idx = threadIdx.x; idx < kPrefillTile * dim; idx += kPrefillThreads) {
    const int rr = idx / dim, d = idx % dim;
    q_s[idx] = rr < tile.num_rows ? a.q[(tile.first_row + rr) * q_stride + head * dim + d] * a.scale
                                  : 0.0f;
  }
  const std::int32_t* table = a.block_tables + static_cast<std::int64_t>(seq) * a.block_stride;
  const auto* k_cache = static_cast<const __half*>(a.k_cache);
  const auto* v_cache = static_cast<const __half*>(a.v_cache);

  float m = -INFINITY, l = 0.0f;
  float acc[kDimsPerLane];
#pragma unroll
  for (int k = 0; k < kDimsPerLane; ++k) acc[k] = 0.0f;

  // The tile's first row sees the earliest keys: tiles before its window are skipped.
  const int key_begin = window_start(a, a.positions[tile.first_row] + 1) / kKeyTile * kKeyTile;
  for (int first_key = key_begin; first_key < num_keys; first_key += kKeyTile) {
    __syncthreads();  // the previous tile's keys and values are consumed
    for (int idx = threadIdx.x; idx < kKeyTile * dim; idx += kPrefillThreads) {
      const int jj = idx / dim, d = idx % dim;
      const int j = first_key + jj;
      float k = 0.0f, v = 0.0f;
      if (j < num_keys) {
        const std::int64_t at = slot_of(table, j, a.block_size) * kv_dim + kv_head * dim + d;
        k = __half2float(k_cache[at]);
        v = __half2float(v_cache[at]);
      }
      k_s[jj * (dim + 1) + d] = k;
      v_s[jj * dim + d] = v;
    }
    __syncthreads();

    float s[kKeyTile / kLanesPerRow];
#pragma unroll
    for (int cc = 0; cc < kKeyTile / kLanesPerRow; ++cc) {
      const int jj = c + kLanesPerRow * cc;
      float dot = 0.0f;
      for (int d = 0; d < dim; ++d) dot += q_s[r * dim + d] * k_s[jj * (dim + 1) + d];
      const int j = first_key + jj;
      s[cc] = j <= position && (a.window <= 0 || position - j < a.window) ? cap_score(a, dot)
                                                                          : -INFINITY;
    }
    const float alpha = online_softmax(s, m, l);
#pragma unroll
    for (int cc = 0; cc < kKeyTile / kLanesPerRow; ++cc) {
      p_s[r * (kKeyTile + 1) + c + kLanesPerRow * cc] = s[cc];
    }
    __syncwarp();  // a row's probabilities are written and read by its own 8 lanes
#pragma unroll
    for (int k = 0; k < kDimsPerLane; ++k) {
      const int d = c + kLanesPerRow * k;
      if (d < dim) {
        float o = acc[k] * alpha;
        for (int jj = 0; jj < kKeyTile; ++jj) o += p_s[r * (kKeyTile + 1) + jj] * v_s[jj * dim + d];
        acc[k] = o;
      }
    }
  }
  if (!valid) return;
  const float inverse = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int k = 0; k < kDimsPerLane; ++k) {
    const int d = c + kLanesPerRow * k;
    if (d < dim) write_out(a, row * q_stride + head * dim + d, acc[k] * inverse);
  }
}

// --- prefill on the tensor cores ---
// The same tiling as prefill_kernel, with Q K^T and P V as half-precision WMMA products
// (float accumulation): 16 queries of one head against 64-key tiles. Scores and the
// running output live in shared memory in float, where the online softmax rescales them.
constexpr int kWmmaKeys = 64;
constexpr int kWmmaThreads = 128;  // 4 warps: each scores 16 keys of a tile

struct WmmaLayout {
  int ld_h;  // half rows of Q, K, V: dim + 8
  int ld_o;  // float rows of O: dim + 4
  std::size_t q, k, v, s, p, o, bytes;
};

__host__ __device__ inline WmmaLayout wmma_layout(int dim) {
  WmmaLayout l{};
  l.ld_h = dim + 8;
  l.ld_o = dim + 4;
  l.q = 0;
  l.k = l.q + sizeof(__half) * kPrefillTile * l.ld_h;
  l.v = l.k + sizeof(__half) * kWmmaKeys * l.ld_h;
  l.s = l.v + sizeof(__half) * kWmmaKeys * l.ld_h;
  l.p = l.s + sizeof(float) * kPrefillTile * (kWmmaKeys + 4);
  l.o = l.p + sizeof(__half) * kPrefillTile * (kWmmaKeys + 8);
  l.bytes = l.o + sizeof(float) * kPrefillTile * l.ld_o;
  return l;
}

__global__ void __launch_bounds__(kWmmaThreads)
    prefill_wmma_kernel(AttentionArgs a, const PrefillTile* __restrict__ tiles) {
  namespace wmma = nvcuda::wmma;
  const int head = blockIdx.x;
  const PrefillTile tile = tiles[blockIdx.y];
  const int group = a.num_heads / a.num_kv_heads;
  const int kv_head = head / group;
  const int dim = a.head_dim;
  const int kv_dim = a.num_kv_heads * dim;
  const std::int64_t q_stride = static_cast<std::int64_t>(a.num_heads) * dim;
  const int warp = threadIdx.x / 32;
  const int seq = a.token_seq[tile.first_row];
  const int num_keys = a.positions[tile.first_row + tile.num_rows - 1] + 1;
  const WmmaLayout L = wmma_layout(dim);

  extern __shared__ __align__(128) unsigned char wmma_smem[];
  auto* q_h = reinterpret_cast<__half*>(wmma_smem + L.q);  // [16][ld_h], scaled
  auto* k_h = reinterpret_cast<__half*>(wmma_smem + L.k);  // [64][ld_h]
  auto* v_h = reinterpret_cast<__half*>(wmma_smem + L.v);  // [64][ld_h]
  auto* s_f = reinterpret_cast<float*>(wmma_smem + L.s);   // [16][64 + 4]
  auto* p_h = reinterpret_cast<__half*>(wmma_smem + L.p);  // [16][64 + 8]
  auto* o_f = reinterpret_cast<float*>(wmma_smem + L.o);   // [16][ld_o]
  constexpr int kLdS = kWmmaKeys + 4, kLdP = kWmmaKeys + 8;

  for (int idx = threadIdx.x; idx < kPrefillTile * dim; idx += kWmmaThreads) {
    const int r = idx / dim, d = idx % dim;
    const float q =
        r < tile.num_rows ? a.q[(tile.first_row + r) * q_stride + head * dim + d] * a.scale : 0.0f;
    q_h[r * L.ld_h + d] = __float2half_rn(q);
    o_f[r * L.ld_o + d] = 0.0f;
  }
  // Row statistics: thread r * 8 + c works on row r (8 threads a row, as prefill_kernel).
  const int r = threadIdx.x / kLanesPerRow, c = threadIdx.x % kLanesPerRow;
  const int position = r < tile.num_rows ? a.positions[tile.first_row + r] : -1;
  float m = -INFINITY, l = 0.0f;

  const std::int32_t* table = a.block_tables + static_cast<std::int64_t>(seq) * a.block_stride;
  const auto* k_cache = static_cast<const __half*>(a.k_cache);
  const auto* v_cache = static_cast<const __half*>(a.v_cache);
  const int pieces = dim / 8;  // 16-byte pieces of a row
  const int key_begin = window_start(a, a.positions[tile.first_row] + 1) / kWmmaKeys * kWmmaKeys;
  for (int first_key = key_begin; first_key < num_keys; first_key += kWmmaKeys) {
    __syncthreads();  // the previous tile is consumed
    for (int idx = threadIdx.x; idx < kWmmaKeys * pieces; idx += kWmmaThreads) {
      const int jj = idx / pieces, piece = idx % pieces;
      const int j = first_key + jj;
      uint4 k = make_uint4(0, 0, 0, 0), v = make_uint4(0, 0, 0, 0);
      if (j < num_keys) {
        const std::int64_t at =
            slot_of(table, j, a.block_size) * kv_dim + kv_head * dim + piece * 8;
        k = *reinterpret_cast<const uint4*>(k_cache + at);
        v = *reinterpret_cast<const uint4*>(v_cache + at);
      }
      *reinterpret_cast<uint4*>(k_h + jj * L.ld_h + piece * 8) = k;
      *reinterpret_cast<uint4*>(v_h + jj * L.ld_h + piece * 8) = v;
    }
    __syncthreads();

    {  // S[:, 16w .. 16w + 16) = Q K^T
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> s;
      wmma::fill_fragment(s, 0.0f);
      for (int k0 = 0; k0 < dim; k0 += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> qa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> kb;
        wmma::load_matrix_sync(qa, q_h + k0, L.ld_h);
        wmma::load_matrix_sync(kb, k_h + warp * 16 * L.ld_h + k0, L.ld_h);
        wmma::mma_sync(s, qa, kb, s);
      }
      wmma::store_matrix_sync(s_f + warp * 16, s, kLdS, wmma::mem_row_major);
    }
    __syncthreads();

    // Online softmax on row r: this thread's keys are c, c + 8, ... of the tile.
    float p[kWmmaKeys / kLanesPerRow];
#pragma unroll
    for (int cc = 0; cc < kWmmaKeys / kLanesPerRow; ++cc) {
      const int jj = c + kLanesPerRow * cc;
      const int j = first_key + jj;
      p[cc] = j <= position && (a.window <= 0 || position - j < a.window)
                  ? cap_score(a, s_f[r * kLdS + jj])
                  : -INFINITY;
    }
    const float alpha = online_softmax(p, m, l);
#pragma unroll
    for (int cc = 0; cc < kWmmaKeys / kLanesPerRow; ++cc) {
      p_h[r * kLdP + c + kLanesPerRow * cc] = __float2half_rn(p[cc]);
    }
    for (int d = c; d < dim; d += kLanesPerRow) o_f[r * L.ld_o + d] *= alpha;
    __syncthreads();

    // O += P V: warp w owns output columns 16w, 16w + 64, ...
    for (int n0 = warp * 16; n0 < dim; n0 += 4 * 16) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> o;
      wmma::load_matrix_sync(o, o_f + n0, L.ld_o, wmma::mem_row_major);
#pragma unroll
      for (int k0 = 0; k0 < kWmmaKeys; k0 += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> pa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> vb;
        wmma::load_matrix_sync(pa, p_h + k0, kLdP);
        wmma::load_matrix_sync(vb, v_h + k0 * L.ld_h + n0, L.ld_h);
        wmma::mma_sync(o, pa, vb, o);
      }
      wmma::store_matrix_sync(o_f + n0, o, L.ld_o, wmma::mem_row_major);
    }
  }
  __syncthreads();
  if (r >= tile.num_rows) return;
  const float inverse = l > 0.0f ? 1.0f / l : 0.0f;
  for (int d = c; d < dim; d += kLanesPerRow) {
    write_out(a, (tile.first_row + r) * q_stride + head * dim + d, o_f[r * L.ld_o + d] * inverse);
  }
}

}  // namespace

void paged_attention_decode(const AttentionArgs& args, const std::int32_t* decode_rows,
                            std::int32_t num_decode_rows, std::int32_t num_splits, float* scratch,
                            cudaStream_t stream) {
  if (num_decode_rows == 0) return;
  const int group = args.num_heads / args.num_kv_heads;
  const dim3 grid(static_cast<unsigned>(args.num_kv_heads), static_cast<unsigned>(num_decode_rows),
                  static_cast<unsigned>(num_splits));
  decode_kernel<<<grid, kDecodeThreads, decode_shared_bytes(group, args.head_dim), stream>>>(
      args, decode_rows, num_splits, scratch);
  if (num_splits > 1) {
    const dim3 combine_grid(static_cast<unsigned>(num_decode_rows),
                            static_cast<unsigned>(args.num_heads));
    combine_kernel<<<combine_grid, 128, 0, stream>>>(args, decode_rows, num_splits, scratch);
  }
}

void prefill_attention(const AttentionArgs& args, const PrefillTile* tiles, std::int32_t num_tiles,
                       bool tensor_cores, cudaStream_t stream) {
  if (num_tiles == 0) return;
  const dim3 grid(static_cast<unsigned>(args.num_heads), static_cast<unsigned>(num_tiles));
  if (tensor_cores && args.head_dim % 16 == 0) {
    prefill_wmma_kernel<<<grid, kWmmaThreads, wmma_layout(args.head_dim).bytes, stream>>>(args,
                                                                                          tiles);
    return;
  }
  prefill_kernel<<<grid, kPrefillThreads, prefill_shared_bytes(args.head_dim), stream>>>(args,
                                                                                         tiles);
}

cudaError_t prepare_attention() {
  const auto prefill =
      cudaFuncSetAttribute(prefill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(prefill_shared_bytes(kMaxHeadDim)));
  if (prefill != cudaSuccess) return prefill;
  const auto wmma =
      cudaFuncSetAttribute(prefill_wmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(wmma_layout(kMaxHeadDim).bytes));
  if (wmma != cudaSuccess) return wmma;
  return cudaFuncSetAttribute(decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(decode_shared_bytes(kMaxGroup, kMaxHeadDim)));
}

}  // namespace troupe::gpu::kernels
