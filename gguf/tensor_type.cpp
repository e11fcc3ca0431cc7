#include "gguf/tensor_type.hpp"

namespace troupe::gguf {

std::optional<TensorTypeTraits> tensor_type_traits(std::uint32_t type_id) {
  switch (static_cast<TensorType>(type_id)) {
    case TensorType::f32:
      return TensorTypeTraits{"F32", 1, 4};
    case TensorType::f16:
      return TensorTypeTraits{"F16", 1, 2};
    case TensorType::bf16:
      return TensorTypeTraits{"BF16", 1, 2};
    case TensorType::q4_0:
      return TensorTypeTraits{"Q4_0", 32, 18};
    case TensorType::q4_1:
      return TensorTypeTraits{"Q4_1", 32, 20};
    case TensorType::q5_0:
      return TensorTypeTraits{"Q5_0", 32, 22};
    case TensorType::q5_1:
      return TensorTypeTraits{"Q5_1", 32, 24};
    case TensorType::q8_0:
      return TensorTypeTraits{"Q8_0", 32, 34};
    case TensorType::q8_1:
      return TensorTypeTraits{"Q8_1", 32, 36};
    case TensorType::q2_k:
      return TensorTypeTraits{"Q2_K", 256, 84};
    case TensorType::q3_k:
      return TensorTypeTraits{"Q3_K", 256, 110};
    case TensorType::q4_k:
      return TensorTypeTraits{"Q4_K", 256, 144};
    case TensorType::q5_k:
      return TensorTypeTraits{"Q5_K", 256, 176};
    case TensorType::q6_k:
      return TensorTypeTraits{"Q6_K", 256, 210};
    case TensorType::q8_k:
      return TensorTypeTraits{"Q8_K", 256, 292};
    case TensorType::i8:
      return TensorTypeTraits{"I8", 1, 1};
    case TensorType::i16:
      return TensorTypeTraits{"I16", 1, 2};
    case TensorType::i32:
      return TensorTypeTraits{"I32", 1, 4};
    case TensorType::i64:
      return TensorTypeTraits{"I64", 1, 8};
    case TensorType::f64:
      return TensorTypeTraits{"F64", 1, 8};
  }
  return std::nullopt;
}

}  // namespace troupe::gguf
