#include "text/vocabulary.hpp"

#include <algorithm>
#include <array>

namespace troupe::text {

namespace {

Result<TokenId> optional_token_id(const gguf::GgufFile& file, std::string_view key,
                                  std::size_t size) {
  if (file.find(key) == nullptr) return kNoToken;
  TROUPE_TRY(const auto id, file.get_int(key));
  // Converters write UINT32_MAX (or -1) for "none".
  if (id < 0 || id == 0xffffffffLL) return kNoToken;
  if (static_cast<std::uint64_t>(id) >= size) {
    return make_error(ErrorCode::invalid_file,
                      "metadata key '" + std::string(key) + "' is token " + std::to_string(id) +
                          ", outside the vocabulary of " + std::to_string(size) + " tokens");
  }
  return static_cast<TokenId>(id);
}

Result<bool> optional_bool(const gguf::GgufFile& file, std::string_view key, bool fallback) {
  if (file.find(key) == nullptr) return fallback;
  return file.get_bool(key);
}

}  // namespace

Result<Vocabulary> Vocabulary::from_gguf(const gguf::GgufFile& file) {
  Vocabulary vocab;
  TROUPE_TRY(const auto model, file.get_string("tokenizer.ggml.model"));
  if (model == "llama") {
    vocab.kind = VocabularyKind::spm;
  } else if (model == "gpt2") {
    vocab.kind = VocabularyKind::bpe;
  } else {
    return make_error(ErrorCode::unsupported, "tokenizer.ggml.model '" + std::string(model) +
                                                  "' is not supported (llama and gpt2 are)");
  }
  if (file.find("tokenizer.ggml.pre") != nullptr) {
    TROUPE_TRY(const auto pre, file.get_string("tokenizer.ggml.pre"));
    vocab.pre = std::string(pre);
  }

  TROUPE_TRY(const auto* tokens, file.get_array("tokenizer.ggml.tokens", gguf::GgufType::string));
  if (tokens->elements.empty()) {
    return make_error(ErrorCode::invalid_file, "metadata key 'tokenizer.ggml.tokens' is empty");
  }
  const std::size_t n = tokens->elements.size();
  vocab.tokens.reserve(n);
  vocab.token_ids.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    vocab.tokens.emplace_back(std::get<std::string_view>(tokens->elements[i].value));
    // On duplicates the first id wins, as in llama.cpp.
    vocab.token_ids.emplace(vocab.tokens.back(), static_cast<TokenId>(i));
  }

  if (file.find("tokenizer.ggml.scores") != nullptr) {
    TROUPE_TRY(const auto* scores, file.get_array("tokenizer.ggml.scores", gguf::GgufType::f32));
    if (scores->elements.size() != n) {
      return make_error(ErrorCode::invalid_file, "metadata key 'tokenizer.ggml.scores' has " +
                                                     std::to_string(scores->elements.size()) +
                                                     " entries for " + std::to_string(n) +
                                                     " tokens");
    }
    vocab.scores.reserve(n);
    for (const auto& s : scores->elements) {
      vocab.scores.push_back(static_cast<float>(std::get<double>(s.value)));
    }
  } else if (vocab.kind == VocabularyKind::spm) {
    vocab.scores.assign(n, 0.0f);
  }

  vocab.types.assign(n, TokenType::normal);
  if (file.find("tokenizer.ggml.token_type") != nullptr) {
    TROUPE_TRY(const auto* types, file.get_array("tokenizer.ggml.token_type", gguf::GgufType::i32));
    if (types->elements.size() != n) {
      return make_error(ErrorCode::invalid_file, "metadata key 'tokenizer.ggml.token_type' has " +
                                                     std::to_string(types->elements.size()) +
                                                     " entries for " + std::to_string(n) +
                                                     " tokens");
    }
    for (std::size_t i = 0; i < n; ++i) {
      const auto t = std::get<std::int64_t>(types->elements[i].value);
      vocab.types[i] = (t >= 0 && t <= 6) ? static_cast<TokenType>(t) : TokenType::normal;
    }
  }

  if (vocab.kind == VocabularyKind::bpe) {
    TROUPE_TRY(const auto* merges, file.get_array("tokenizer.ggml.merges", gguf::GgufType::string));
    vocab.merges.reserve(merges->elements.size());
    for (const auto& m : merges->elements) {
      vocab.merges.emplace_back(std::get<std::string_view>(m.value));
    }
  }

  // Defaults follow llama.cpp: SPM models have <unk>=0, <s>=1, </s>=2 and add BOS.
  const bool spm = vocab.kind == VocabularyKind::spm;
  TROUPE_TRY(vocab.bos, optional_token_id(file, "tokenizer.ggml.bos_token_id", n));
  TROUPE_TRY(vocab.eos, optional_token_id(file, "tokenizer.ggml.eos_token_id", n));
  TROUPE_TRY(vocab.eot, optional_token_id(file, "tokenizer.ggml.eot_token_id", n));
  TROUPE_TRY(vocab.unk, optional_token_id(file, "tokenizer.ggml.unknown_token_id", n));
  TROUPE_TRY(vocab.pad, optional_token_id(file, "tokenizer.ggml.padding_token_id", n));
  // Fill-in-the-middle markers: llama.cpp's keys (and their older names), else the
  // tokens' names in the code models that have them.
  TROUPE_TRY(vocab.fim_pre, optional_token_id(file, "tokenizer.ggml.fim_pre_token_id", n));
  TROUPE_TRY(vocab.fim_suf, optional_token_id(file, "tokenizer.ggml.fim_suf_token_id", n));
  TROUPE_TRY(vocab.fim_mid, optional_token_id(file, "tokenizer.ggml.fim_mid_token_id", n));
  if (vocab.fim_pre == kNoToken) {
    TROUPE_TRY(vocab.fim_pre, optional_token_id(file, "tokenizer.ggml.prefix_token_id", n));
    TROUPE_TRY(vocab.fim_suf, optional_token_id(file, "tokenizer.ggml.suffix_token_id", n));
    TROUPE_TRY(vocab.fim_mid, optional_token_id(file, "tokenizer.ggml.middle_token_id", n));
  }
  for (const auto& [pre, suf, mid] :
       {std::array<const char*, 3>{"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"},
        std::array<const char*, 3>{"<fim_prefix>", "<fim_suffix>", "<fim_middle>"},
        std::array<const char*, 3>{"<fim-prefix>", "<fim-suffix>", "<fim-middle>"},
        std::array<const char*, 3>{"<PRE>", "<SUF>", "<MID>"}}) {
    if (vocab.has_fill_in_the_middle()) break;
    vocab.fim_pre = vocab.find(pre);
    vocab.fim_suf = vocab.find(suf);
    vocab.fim_mid = vocab.find(mid);
  }
  if (!vocab.has_fill_in_the_middle()) vocab.fim_pre = vocab.fim_suf = vocab.fim_mid = kNoToken;
  if (spm && file.find("tokenizer.ggml.bos_token_id") == nullptr && n > 2) vocab.bos = 1;
  if (spm && file.find("tokenizer.ggml.eos_token_id") == nullptr && n > 2) vocab.eos = 2;
  if (spm && file.find("tokenizer.ggml.unknown_token_id") == nullptr && n > 2) vocab.unk = 0;
  TROUPE_TRY(vocab.add_bos, optional_bool(file, "tokenizer.ggml.add_bos_token", spm));
  TROUPE_TRY(vocab.add_eos, optional_bool(file, "tokenizer.ggml.add_eos_token", false));
  TROUPE_TRY(vocab.add_space_prefix, optional_bool(file, "tokenizer.ggml.add_space_prefix", spm));
  if (vocab.add_bos && vocab.bos == kNoToken) {
    return make_error(
        ErrorCode::invalid_file,
        "the vocabulary asks for a BOS token but 'tokenizer.ggml.bos_token_id' is unset");
  }

  for (TokenId id : {vocab.eos, vocab.eot}) {
    if (id != kNoToken) vocab.end_of_generation.push_back(id);
  }
  // Chat models mark their turn ends with control tokens of these names.
  for (const char* name :
       {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>"}) {
    const TokenId id = vocab.find(name);
    if (id != kNoToken && vocab.types[id] == TokenType::control &&
        std::find(vocab.end_of_generation.begin(), vocab.end_of_generation.end(), id) ==
            vocab.end_of_generation.end()) {
      vocab.end_of_generation.push_back(id);
    }
  }
  return vocab;
}

bool Vocabulary::is_end_of_generation(TokenId id) const {
  return std::find(end_of_generation.begin(), end_of_generation.end(), id) !=
         end_of_generation.end();
}

}  // namespace troupe::text
