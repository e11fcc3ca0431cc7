// Random LoRA adapters (model/random_model.hpp): for each chosen matrix of each layer of a
// base model file, lora_a [n_in, rank] and lora_b [rank, n_out] of random normal values,
// with the metadata LoraAdapter::open reads. Its shapes are taken from the base file itself,
// so an adapter fits any model troupe can load whose matrices are separate.
#include <cstring>
#include <string>
#include <vector>

#include "gguf/gguf_file.hpp"
#include "gguf/gguf_writer.hpp"
#include "gguf/half.hpp"
#include "model/lora_adapter.hpp"
#include "model/random_model.hpp"

namespace troupe::model {

namespace {

std::vector<std::byte> encode(const std::vector<float>& values, gguf::TensorType type) {
  if (type == gguf::TensorType::f16) {
    std::vector<std::byte> out(values.size() * 2);
    for (std::size_t i = 0; i < values.size(); ++i) {
      const std::uint16_t h = gguf::f32_to_f16(values[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
    return out;
  }
  std::vector<std::byte> out(values.size() * sizeof(float));
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

}  // namespace

Result<void> write_random_adapter(const RandomAdapterSpec& spec, const std::string& path) {
  if (spec.rank < 1) return make_error(ErrorCode::invalid_argument, "the rank must be at least 1");
  if (spec.type != gguf::TensorType::f32 && spec.type != gguf::TensorType::f16) {
    return make_error(ErrorCode::invalid_argument, "an adapter's tensors are F32 or F16");
  }
  std::vector<LoraTarget> targets;
  for (const auto& name : spec.targets) {
    const auto target = lora_target_of(name);
    if (!target) {
      return make_error(ErrorCode::invalid_argument,
                        "unknown LoRA target " + name +
                            " (attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down)");
    }
    targets.push_back(*target);
  }
  if (targets.empty()) {
    for (std::size_t t = 0; t < kNumLoraTargets; ++t) targets.push_back(static_cast<LoraTarget>(t));
  }
  TROUPE_TRY(const auto base, gguf::GgufFile::open(spec.base_path));
  TROUPE_TRY(const std::string_view arch, base.get_string("general.architecture"));
  gguf::GgufWriter w;
  w.add_string("general.architecture", arch);
  w.add_string("general.type", "adapter");
  w.add_string("adapter.type", "lora");
  w.add_float32("adapter.lora.alpha", spec.alpha);
  for (std::int32_t layer = 0;; ++layer) {
    const std::string prefix = "blk." + std::to_string(layer) + ".";
    if (base.find_tensor(prefix + "attn_norm.weight") == nullptr) break;
    for (const LoraTarget target : targets) {
      const std::string name = prefix + std::string(lora_target_name(target)) + ".weight";
      const gguf::GgufTensorInfo* matrix = base.find_tensor(name);
      if (matrix == nullptr || matrix->num_dims != 2) continue;  // fused or absent here
      const std::int64_t n_in = matrix->dims[0], n_out = matrix->dims[1];
      const std::uint64_t seed = spec.seed ^ random_name_hash(name);
      const auto a =
          random_normal_values(static_cast<std::size_t>(n_in * spec.rank), spec.stddev, seed);
      const auto b = random_normal_values(static_cast<std::size_t>(spec.rank * n_out), spec.stddev,
                                          seed ^ 0x9E3779B97F4A7C15ULL);
      w.add_tensor(name + ".lora_a", spec.type, {n_in, spec.rank}, encode(a, spec.type));
      w.add_tensor(name + ".lora_b", spec.type, {spec.rank, n_out}, encode(b, spec.type));
    }
  }
  if (w.num_tensors() == 0) {
    return make_error(ErrorCode::invalid_argument,
                      spec.base_path + " has none of the chosen matrices as a separate tensor");
  }
  return w.write(path);
}

}  // namespace troupe::model
