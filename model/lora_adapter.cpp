#include "model/lora_adapter.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <map>
#include <utility>

#include "gguf/half.hpp"

namespace troupe::model {

namespace {

constexpr std::array<std::string_view, kNumLoraTargets> kTargetNames = {
    "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};

// An adapter that is not one, does not fit its base, or is corrupt.
tl::unexpected<Error> bad(const std::string& message) {
  return make_error(ErrorCode::invalid_argument, message);
}

// "blk.N.<target>.weight.lora_a" -> (N, target name, is_a); nothing when it is not of that
// form.
struct TensorName {
  std::int64_t layer = 0;
  std::string_view matrix;
  bool is_a = false;
};

std::optional<TensorName> parse_name(std::string_view name) {
  constexpr std::string_view kBlk = "blk.";
  constexpr std::string_view kA = ".weight.lora_a", kB = ".weight.lora_b";
  if (!name.starts_with(kBlk)) return std::nullopt;
  TensorName out;
  if (name.ends_with(kA)) {
    out.is_a = true;
  } else if (!name.ends_with(kB)) {
    return std::nullopt;
  }
  std::string_view rest = name.substr(kBlk.size(), name.size() - kBlk.size() - kA.size());
  const std::size_t dot = rest.find('.');
  if (dot == std::string_view::npos || dot == 0 || dot > 9) return std::nullopt;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + dot, out.layer);
  if (ec != std::errc{} || end != rest.data() + dot) return std::nullopt;
  out.matrix = rest.substr(dot + 1);
  if (out.matrix.empty()) return std::nullopt;
  return out;
}

// A 2-D F32 or F16 tensor's elements, row-major [dims[1], dims[0]], in `type` (F32 or F16;
// its own, or F32).
Result<std::vector<std::byte>> elements(const gguf::GgufTensorInfo& t, gguf::TensorType type) {
  if (t.dims[2] != 1 || t.dims[3] != 1) {
    return bad("adapter tensor " + t.name + " is not a matrix");
  }
  if (t.type != gguf::TensorType::f32 && t.type != gguf::TensorType::f16) {
    return bad("adapter tensor " + t.name + " is " + std::string(gguf::tensor_type_name(t.type)) +
               "; only F32 and F16 are read");
  }
  const auto n = static_cast<std::size_t>(t.num_elements());
  const std::size_t size = t.type == gguf::TensorType::f32 ? 4 : 2;
  if (t.num_bytes < n * size) return bad("adapter tensor " + t.name + " is truncated");
  if (t.type == type) return std::vector<std::byte>(t.data, t.data + n * size);
  std::vector<std::byte> out(n * sizeof(float));  // F16 to F32
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t h = 0;
    std::memcpy(&h, t.data + 2 * i, 2);
    const float f = gguf::f16_to_f32(h);
    std::memcpy(out.data() + 4 * i, &f, 4);
  }
  return out;
}

// A row-major [rows, cols] matrix of `size`-byte elements as [cols, rows].
std::vector<std::byte> transposed(const std::vector<std::byte>& m, std::int64_t rows,
                                  std::int64_t cols, std::size_t size) {
  std::vector<std::byte> out(m.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      std::memcpy(out.data() + static_cast<std::size_t>(c * rows + r) * size,
                  m.data() + static_cast<std::size_t>(r * cols + c) * size, size);
    }
  }
  return out;
}

float element(const std::vector<std::byte>& m, gguf::TensorType type, std::int64_t index) {
  const auto i = static_cast<std::size_t>(index);
  if (type == gguf::TensorType::f16) {
    std::uint16_t h = 0;
    std::memcpy(&h, m.data() + 2 * i, 2);
    return gguf::f16_to_f32(h);
  }
  float f = 0.0f;
  std::memcpy(&f, m.data() + 4 * i, 4);
  return f;
}

}  // namespace

std::string_view lora_target_name(LoraTarget target) {
  return kTargetNames[static_cast<std::size_t>(target)];
}

std::optional<LoraTarget> lora_target_of(std::string_view name) {
  for (std::size_t i = 0; i < kTargetNames.size(); ++i) {
    if (kTargetNames[i] == name) return static_cast<LoraTarget>(i);
  }
  return std::nullopt;
}

Result<LoraAdapter> LoraAdapter::open(const std::string& path, const gguf::GgufFile& base,
                                      const LlamaConfig& base_config, float scale) {
  auto file = gguf::GgufFile::open(path);
  if (!file) {
    return make_error(file.error().code, "LoRA adapter " + path + ": " + file.error().message);
  }
  auto adapter = read(*file, base, base_config, scale);
  if (!adapter) {
    return make_error(adapter.error().code,
                      "LoRA adapter " + path + ": " + adapter.error().message);
  }
  return adapter;
}

Result<LoraAdapter> LoraAdapter::read(const gguf::GgufFile& file, const gguf::GgufFile& base,
                                      const LlamaConfig& base_config, float scale) {
  const auto type = file.get_string("general.type");
  if (!type || *type != "adapter") {
    return bad("not an adapter: general.type is " +
               (type ? "\"" + std::string(*type) + "\"" : std::string("missing")) +
               ", not \"adapter\"");
  }
  const auto adapter_type = file.get_string("adapter.type");
  if (!adapter_type || *adapter_type != "lora") {
    return bad("adapter.type is " +
               (adapter_type ? "\"" + std::string(*adapter_type) + "\"" : std::string("missing")) +
               ", not \"lora\"");
  }
  LoraAdapter adapter;
  TROUPE_TRY(const std::string_view arch, file.get_string("general.architecture"));
  adapter.architecture_ = std::string(arch);
  if (adapter.architecture_ != base_config.architecture) {
    return bad("the adapter is for architecture " + adapter.architecture_ + ", the base model is " +
               base_config.architecture);
  }
  // As llama.cpp: no alpha reads as 0 (then s = scale).
  if (file.find("adapter.lora.alpha") != nullptr) {
    TROUPE_TRY(const double alpha, file.get_float("adapter.lora.alpha"));
    adapter.alpha_ = static_cast<float>(alpha);
  }
  if (!std::isfinite(scale)) return bad("the adapter's scale is not a finite number");
  adapter.scale_ = scale;
  adapter.layers_.resize(static_cast<std::size_t>(base_config.num_layers));

  // Pair each lora_a with its lora_b, by the base matrix's name.
  std::map<std::string, std::pair<const gguf::GgufTensorInfo*, const gguf::GgufTensorInfo*>> pairs;
  for (const auto& t : file.tensors()) {
    const auto name = parse_name(t.name);
    if (!name) {
      return bad("tensor " + t.name + " is not a LoRA tensor (blk.N.<matrix>.weight.lora_a|b)");
    }
    if (name->layer < 0 || name->layer >= base_config.num_layers) {
      return bad("tensor " + t.name + " is for layer " + std::to_string(name->layer) +
                 "; the base model has " + std::to_string(base_config.num_layers));
    }
    if (!lora_target_of(name->matrix)) {
      return bad("tensor " + t.name + " adapts " + std::string(name->matrix) +
                 ", which troupe does not adapt (only attn_q, attn_k, attn_v, attn_output, " +
                 "ffn_gate, ffn_up and ffn_down)");
    }
    const std::string base_name = t.name.substr(0, t.name.size() - std::string(".lora_a").size());
    auto& pair = pairs[base_name];
    (name->is_a ? pair.first : pair.second) = &t;
  }
  if (pairs.empty()) return bad("the adapter has no tensors");

  for (const auto& [base_name, pair] : pairs) {
    const auto* a = pair.first;
    const auto* b = pair.second;
    if (a == nullptr || b == nullptr) {
      return bad("tensor " + base_name +
                 (a == nullptr ? ".lora_b has no .lora_a" : ".lora_a has no .lora_b"));
    }
    const auto name = *parse_name(a->name);
    const gguf::GgufTensorInfo* w = base.find_tensor(base_name);
    if (w == nullptr) {
      return bad("tensor " + a->name + " adapts " + base_name + ", which the base model lacks");
    }
    const std::int64_t n_in = w->dims[0], n_out = w->dims[1];
    const std::int64_t rank = b->dims[0];
    const auto shape = [](const gguf::GgufTensorInfo& t) {
      return "[" + std::to_string(t.dims[0]) + ", " + std::to_string(t.dims[1]) + "]";
    };
    if (w->dims[2] != 1 || w->dims[3] != 1) {
      return bad("tensor " + a->name + " adapts " + base_name + ", which is not a matrix");
    }
    if (rank <= 0 || a->dims[0] != n_in || a->dims[1] != rank || b->dims[1] != n_out) {
      return bad("tensors " + a->name + " " + shape(*a) + " and " + b->name + " " + shape(*b) +
                 " do not fit " + base_name + " " + shape(*w) + ": lora_a must be [" +
                 std::to_string(n_in) + ", rank] and lora_b [rank, " + std::to_string(n_out) + "]");
    }
    auto m = std::make_unique<LoraMatrix>();
    m->n_in = n_in;
    m->n_out = n_out;
    m->rank = rank;
    m->scale = adapter.alpha_ != 0.0f ? scale * adapter.alpha_ / static_cast<float>(rank) : scale;
    // F16 stays F16 (what the file holds, half the bytes a step reads); mixed types, F32.
    m->type = a->type == gguf::TensorType::f16 && b->type == gguf::TensorType::f16
                  ? gguf::TensorType::f16
                  : gguf::TensorType::f32;
    TROUPE_TRY(m->a, elements(*a, m->type));                 // A [rank][n_in]
    TROUPE_TRY(const auto b_values, elements(*b, m->type));  // B [n_out][rank]
    m->b_t = transposed(b_values, n_out, rank, m->type == gguf::TensorType::f16 ? 2 : 4);
    adapter.max_rank_ = std::max(adapter.max_rank_, rank);
    ++adapter.num_matrices_;
    const auto target = static_cast<std::size_t>(*lora_target_of(name.matrix));
    adapter.layers_[static_cast<std::size_t>(name.layer)][target] = std::move(m);
  }
  return adapter;
}

float LoraMatrix::a_at(std::int64_t k, std::int64_t i) const {
  return element(a, type, k * n_in + i);
}

float LoraMatrix::b_at(std::int64_t j, std::int64_t k) const {
  return element(b_t, type, k * n_out + j);
}

Result<LoraAdapter> LoraAdapter::cut(const std::array<LoraCut, kNumLoraTargets>& cuts) const {
  LoraAdapter out;
  out.architecture_ = architecture_;
  out.alpha_ = alpha_;
  out.scale_ = scale_;
  out.num_matrices_ = num_matrices_;
  out.max_rank_ = max_rank_;
  out.layers_.resize(layers_.size());
  for (std::size_t layer = 0; layer < layers_.size(); ++layer) {
    for (std::size_t t = 0; t < kNumLoraTargets; ++t) {
      const LoraMatrix* m = layers_[layer][t].get();
      if (m == nullptr) continue;
      const LoraCut& c = cuts[t];
      auto part = std::make_unique<LoraMatrix>(*m);
      const std::size_t size = m->type == gguf::TensorType::f16 ? 2 : 4;
      // Columns [begin, +count) of each of `rows` rows of `cols` elements.
      const auto columns = [&](const std::vector<std::byte>& whole, std::int64_t rows,
                               std::int64_t cols) {
        std::vector<std::byte> kept(static_cast<std::size_t>(rows * c.count) * size);
        for (std::int64_t r = 0; r < rows; ++r) {
          std::memcpy(kept.data() + static_cast<std::size_t>(r * c.count) * size,
                      whole.data() + static_cast<std::size_t>(r * cols + c.begin) * size,
                      static_cast<std::size_t>(c.count) * size);
        }
        return kept;
      };
      const std::int64_t extent = c.part == LoraCut::Part::outputs ? m->n_out : m->n_in;
      if (c.part != LoraCut::Part::whole &&
          (c.begin < 0 || c.count <= 0 || c.begin + c.count > extent)) {
        return bad("a rank's part of blk." + std::to_string(layer) + "." +
                   std::string(lora_target_name(static_cast<LoraTarget>(t))) +
                   " falls outside the matrix");
      }
      if (c.part == LoraCut::Part::outputs) {  // B's rows: B^T's columns
        part->b_t = columns(m->b_t, m->rank, m->n_out);
        part->n_out = c.count;
      } else if (c.part == LoraCut::Part::inputs) {  // A's columns
        part->a = columns(m->a, m->rank, m->n_in);
        part->n_in = c.count;
      }
      out.layers_[layer][t] = std::move(part);
    }
  }
  return out;
}

const LoraMatrix* LoraAdapter::find(std::int32_t layer, LoraTarget target) const {
  if (layer < 0 || layer >= num_layers()) return nullptr;
  return layers_[static_cast<std::size_t>(layer)][static_cast<std::size_t>(target)].get();
}

}  // namespace troupe::model
