#include "model/bpe_encoder.hpp"

namespace troupe::model {

Result<BpeEncoder> BpeEncoder::create(const Vocabulary&) {
  return make_error(ErrorCode::unsupported, "byte-level BPE vocabularies are not supported yet");
}

void BpeEncoder::encode(std::string_view, std::vector<TokenId>&) const {}

std::string BpeEncoder::decode_token_text(std::string_view text) const {
  return std::string(text);
}

}  // namespace troupe::model
