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
    case TensorType::iq2_xxs:
      return TensorTypeTraits{"IQ2_XXS", 256, 66};
    case TensorType::iq2_xs:
      return TensorTypeTraits{"IQ2_XS", 256, 74};
    case TensorType::iq3_xxs:
      return TensorTypeTraits{"IQ3_XXS", 256, 98};
    case TensorType::iq1_s:
      return TensorTypeTraits{"IQ1_S", 256, 50};
    case TensorType::iq4_nl:
      return TensorTypeTraits{"IQ4_NL", 32, 18};
    case TensorType::iq3_s:
      return TensorTypeTraits{"IQ3_S", 256, 110};
    case TensorType::iq2_s:
      return TensorTypeTraits{"IQ2_S", 256, 82};
    case TensorType::iq4_xs:
      return TensorTypeTraits{"IQ4_XS", 256, 136};
    case TensorType::iq1_m:
      return TensorTypeTraits{"IQ1_M", 256, 56};
    case TensorType::tq1_0:
      return TensorTypeTraits{"TQ1_0", 256, 54};
    case TensorType::tq2_0:
      return TensorTypeTraits{"TQ2_0", 256, 66};
    case TensorType::mxfp4:
      return TensorTypeTraits{"MXFP4", 32, 17};
    case TensorType::nvfp4:
      return TensorTypeTraits{"NVFP4", 64, 36};
    case TensorType::q1_0:
      return TensorTypeTraits{"Q1_0", 128, 18};
    case TensorType::q2_0:
      return TensorTypeTraits{"Q2_0", 64, 18};
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

std::optional<std::string_view> removed_tensor_type_name(std::uint32_t type_id) {
  switch (type_id) {
    case 4:
      return "Q4_2";
    case 5:
      return "Q4_3";
    case 31:
      return "Q4_0_4_4";
    case 32:
      return "Q4_0_4_8";
    case 33:
      return "Q4_0_8_8";
    case 36:
      return "IQ4_NL_4_4";
    case 37:
      return "IQ4_NL_4_8";
    case 38:
      return "IQ4_NL_8_8";
    default:
      return std::nullopt;
  }
}

}  // namespace troupe::gguf
