#include "model/random_model.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "gguf/dequantize.hpp"
#include "gguf/gguf_file.hpp"
#include "gguf/gguf_writer.hpp"
#include "model/splitmix64.hpp"

namespace troupe::model {

namespace {

// splitmix64: a small, fast generator whose output is fixed by its seed everywhere.
class SplitMix {
 public:
  explicit SplitMix(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() { return splitmix64_mix(state_ += kSplitMix64Step); }
  double uniform() {
    return (static_cast<double>(next() >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  }

 private:
  std::uint64_t state_;
};

void add_builtin_vocabulary(gguf::GgufWriter& w, std::int32_t vocab_size) {
  // <unk> <s> </s>, the 256 byte tokens, then pieces: characters, common words,
  // and letter pairs and triples, with and without the leading-space mark.
  static const char* const kWords[] = {
      "the",   "and",    "to",    "of",    "a",     "in",     "is",   "it",     "you",  "that",
      "he",    "was",    "for",   "on",    "are",   "with",   "as",   "I",      "his",  "they",
      "be",    "at",     "one",   "have",  "this",  "from",   "or",   "had",    "by",   "not",
      "word",  "but",    "what",  "some",  "we",    "can",    "out",  "other",  "were", "all",
      "there", "when",   "up",    "use",   "your",  "how",    "said", "an",     "each", "she",
      "which", "do",     "their", "time",  "if",    "will",   "way",  "about",  "many", "then",
      "them",  "write",  "would", "like",  "so",    "these",  "her",  "long",   "make", "thing",
      "see",   "him",    "two",   "has",   "look",  "more",   "day",  "could",  "go",   "come",
      "did",   "number", "sound", "no",    "most",  "people", "my",   "over",   "know", "water",
      "than",  "call",   "first", "who",   "may",   "down",   "side", "been",   "now",  "find",
      "hello", "world",  "model", "token", "story", "once",   "upon", "little", "girl", "boy",
      "named", "play",   "happy", "big",   "friend"};
  const std::string space = "\xe2\x96\x81";
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<std::int32_t> types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    tokens.emplace_back(name);
    types.push_back(6);
  }
  auto add = [&](const std::string& piece) {
    if (static_cast<std::int32_t>(tokens.size()) < vocab_size) {
      tokens.push_back(piece);
      types.push_back(1);
    }
  };
  add(space);
  for (char c = 33; c < 127; ++c) add(std::string(1, c));
  for (char c = 33; c < 127; ++c) add(space + std::string(1, c));
  for (const char* word : kWords) {
    add(space + word);
    add(word);
  }
  const std::string letters = "etaoinshrdlcumwfgypbvkjxqz";
  for (char a : letters)
    for (char b : letters) {
      add(std::string{a, b});
      add(space + std::string{a, b});
    }
  for (char a : letters)
    for (char b : letters)
      for (char c : letters) {
        add(std::string{a, b, c});
        add(space + std::string{a, b, c});
      }
  for (std::int32_t i = static_cast<std::int32_t>(tokens.size()); i < vocab_size; ++i) {
    tokens.push_back("<unused" + std::to_string(i) + ">");
    types.push_back(5);
  }
  // Earlier pieces merge first; the score only orders the merges.
  std::vector<float> scores(tokens.size());
  for (std::size_t i = 0; i < scores.size(); ++i) scores[i] = -static_cast<float>(i);
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_string("tokenizer.ggml.pre", "default");
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_float32_array("tokenizer.ggml.scores", scores);
  w.add_int32_array("tokenizer.ggml.token_type", types);
  w.add_uint32("tokenizer.ggml.unknown_token_id", 0);
  w.add_uint32("tokenizer.ggml.bos_token_id", 1);
  w.add_uint32("tokenizer.ggml.eos_token_id", 2);
  w.add_bool("tokenizer.ggml.add_bos_token", true);
  w.add_bool("tokenizer.ggml.add_eos_token", false);
}

Result<std::int32_t> copy_vocabulary(gguf::GgufWriter& w, const std::string& path) {
  TROUPE_TRY(const auto source, gguf::GgufFile::open(path));
  TROUPE_TRY(const auto* tokens, source.get_array("tokenizer.ggml.tokens", gguf::GgufType::string));
  for (const auto& [key, value] : source.metadata()) {
    if (key.rfind("tokenizer.", 0) == 0) w.add_value(key, value);
  }
  return static_cast<std::int32_t>(tokens->elements.size());
}

}  // namespace

std::uint64_t random_name_hash(const std::string& name) {
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ULL;
  return h;
}

std::vector<float> random_normal_values(std::size_t n, float stddev, std::uint64_t seed) {
  SplitMix rng(seed);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; i += 2) {  // Box-Muller, two at a time
    const double r = std::sqrt(-2.0 * std::log(rng.uniform()));
    const double a = 2.0 * std::numbers::pi * rng.uniform();
    v[i] = static_cast<float>(stddev * r * std::cos(a));
    if (i + 1 < n) v[i + 1] = static_cast<float>(stddev * r * std::sin(a));
  }
  return v;
}

Result<RandomModelSpec> random_model_preset(const std::string& name) {
  RandomModelSpec spec;
  if (name == "tiny") {
    spec.name = "troupe-random-tiny";
    return spec;
  }
  if (name == "moe") {
    spec.name = "troupe-random-moe";
    spec.arch = "qwen3moe";
    spec.dim = 1024;
    spec.num_layers = 8;
    spec.num_heads = 16;
    spec.num_kv_heads = 4;
    spec.head_dim = 64;
    spec.ffn_dim = 3072;  // written, as the converter does, but unused
    spec.num_experts = 32;
    spec.num_experts_used = 4;
    spec.expert_ffn_dim = 512;
    spec.tied_output = false;
    return spec;
  }
  if (name == "110m") {
    spec.name = "troupe-random-110m";
    spec.dim = 768;
    spec.num_layers = 12;
    spec.num_heads = 12;
    spec.num_kv_heads = 4;
    spec.ffn_dim = 2048;
    return spec;
  }
  return make_error(ErrorCode::invalid_argument,
                    "unknown model preset '" + name + "' (tiny, 110m and moe exist)");
}

Result<void> write_random_model(const RandomModelSpec& spec, const std::string& path) {
  const std::string& arch = spec.arch;
  if (arch != "llama" && arch != "qwen3" && arch != "qwen3moe" && arch != "olmoe") {
    return make_error(ErrorCode::invalid_argument,
                      "random models are llama, qwen3, qwen3moe or olmoe, not '" + arch + "'");
  }
  const bool qwen = arch == "qwen3" || arch == "qwen3moe";
  if (spec.dim <= 0 || spec.num_layers <= 0 || spec.num_heads <= 0 || spec.num_kv_heads <= 0 ||
      spec.ffn_dim <= 0 || spec.head_dim < 0 ||
      (spec.head_dim == 0 && spec.dim % spec.num_heads != 0) ||
      spec.num_heads % spec.num_kv_heads != 0 ||
      (spec.head_dim > 0 ? spec.head_dim : spec.dim / spec.num_heads) % 2 != 0) {
    return make_error(ErrorCode::invalid_argument,
                      "impossible model shape (dim " + std::to_string(spec.dim) + ", " +
                          std::to_string(spec.num_heads) + " heads, " +
                          std::to_string(spec.num_kv_heads) + " KV heads, FFN " +
                          std::to_string(spec.ffn_dim) +
                          "): dim must split into heads of an even size (or a head_dim be "
                          "given), and heads into KV heads");
  }
  const bool moe = spec.num_experts > 0;
  if (spec.num_experts < 0 || spec.num_experts_used < 0 || spec.expert_ffn_dim < 0 ||
      spec.vocab_size <= 0 || spec.context_length <= 0) {
    return make_error(ErrorCode::invalid_argument,
                      "experts, their FFN size, the vocabulary and the context length cannot be "
                      "negative");
  }
  if (spec.vocab_size > (1 << 22)) {  // the largest real vocabularies hold about 256K
    return make_error(ErrorCode::invalid_argument, "a built-in vocabulary of " +
                                                       std::to_string(spec.vocab_size) +
                                                       " tokens is too large (at most 4194304)");
  }
  if (arch == "olmoe" && (spec.num_kv_heads != spec.num_heads ||
                          (spec.head_dim > 0 && spec.head_dim * spec.num_heads != spec.dim))) {
    // llama.cpp loads olmoe's Q/K norms as [dim]: no grouped KV heads, heads * head_dim = dim.
    return make_error(ErrorCode::invalid_argument,
                      "olmoe has as many KV heads as heads, and heads x head_dim = dim");
  }
  if (((arch == "qwen3moe" || arch == "olmoe") && !moe) || (arch == "qwen3" && moe) ||
      (moe && (spec.num_experts_used <= 0 || spec.num_experts_used > spec.num_experts ||
               spec.expert_ffn_dim <= 0))) {
    return make_error(
        ErrorCode::invalid_argument,
        "experts: qwen3moe and olmoe need them, qwen3 has none, and a model with experts "
        "needs 1..num_experts of them used and an expert FFN size (got " +
            std::to_string(spec.num_experts) + " experts, " +
            std::to_string(spec.num_experts_used) + " used, FFN " +
            std::to_string(spec.expert_ffn_dim) + ")");
  }
  using Mix = RandomModelSpec::Mix;
  const gguf::TensorType type = spec.mix == Mix::q4_k_m   ? gguf::TensorType::q4_k
                                : spec.mix == Mix::q3_k_m ? gguf::TensorType::q3_k
                                : spec.mix == Mix::q2_k   ? gguf::TensorType::q2_k
                                                          : spec.type;
  const auto traits = gguf::tensor_type_traits(static_cast<std::uint32_t>(type));
  switch (type) {
    case gguf::TensorType::f32:
    case gguf::TensorType::f16:
    case gguf::TensorType::bf16:
    case gguf::TensorType::q8_0:
    case gguf::TensorType::q4_0:
    case gguf::TensorType::q4_1:
    case gguf::TensorType::q5_0:
    case gguf::TensorType::q5_1:
    case gguf::TensorType::q2_k:
    case gguf::TensorType::q3_k:
    case gguf::TensorType::q4_k:
    case gguf::TensorType::q5_k:
    case gguf::TensorType::q6_k:
    case gguf::TensorType::iq4_nl:
    case gguf::TensorType::iq4_xs:
    case gguf::TensorType::mxfp4:
      break;
    default:
      return make_error(ErrorCode::invalid_argument,
                        "random models are F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, "
                        "Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4, or the mixes Q4_K_M, "
                        "Q3_K_M and Q2_K");
  }
  const auto block =
      static_cast<std::int32_t>(spec.mix != Mix::none ? 256 : traits->block_elements);
  const std::int64_t head_dim = spec.head_dim > 0 ? spec.head_dim : spec.dim / spec.num_heads;
  const std::int64_t q_dim = head_dim * spec.num_heads;
  const std::int64_t kv_dim = head_dim * spec.num_kv_heads;
  if (spec.dim % block != 0 || spec.ffn_dim % block != 0 || q_dim % block != 0 ||
      (moe && spec.expert_ffn_dim % block != 0)) {
    return make_error(ErrorCode::invalid_argument,
                      "dim, the FFN sizes and heads x head_dim must be multiples of " +
                          std::to_string(block) + " for " +
                          std::string(gguf::tensor_type_name(type)));
  }
  const auto u32 = [](std::int64_t v) { return static_cast<std::uint32_t>(v); };
  gguf::GgufWriter w;
  w.add_string("general.architecture", arch);
  w.add_string("general.name", spec.name);
  w.add_string("general.description", "random weights (normal, seeded); for tests and benchmarks");
  w.add_uint32(arch + ".context_length", u32(spec.context_length));
  w.add_uint32(arch + ".embedding_length", u32(spec.dim));
  w.add_uint32(arch + ".block_count", u32(spec.num_layers));
  // Mixtral-style llama and olmoe files give the experts' FFN size here; qwen3moe a dense
  // one, unused.
  w.add_uint32(arch + ".feed_forward_length",
               u32(arch != "qwen3moe" && moe ? spec.expert_ffn_dim : spec.ffn_dim));
  w.add_uint32(arch + ".attention.head_count", u32(spec.num_heads));
  w.add_uint32(arch + ".attention.head_count_kv", u32(spec.num_kv_heads));
  if (spec.head_dim > 0) {
    w.add_uint32(arch + ".attention.key_length", u32(head_dim));
    w.add_uint32(arch + ".attention.value_length", u32(head_dim));
  }
  if (moe) {
    w.add_uint32(arch + ".expert_count", u32(spec.num_experts));
    w.add_uint32(arch + ".expert_used_count", u32(spec.num_experts_used));
    if (arch == "qwen3moe") {
      w.add_uint32(arch + ".expert_feed_forward_length", u32(spec.expert_ffn_dim));
    }
  }
  w.add_uint32(arch + ".rope.dimension_count", u32(head_dim));
  w.add_float32(arch + ".rope.freq_base", qwen ? 1e6f : 10000.0f);
  w.add_float32(arch + ".attention.layer_norm_rms_epsilon", qwen ? 1e-6f : 1e-5f);

  std::int32_t vocab_size = spec.vocab_size;
  if (spec.vocab_path.empty()) {
    if (vocab_size < 512) {
      return make_error(ErrorCode::invalid_argument,
                        "the built-in vocabulary needs at least 512 tokens");
    }
    add_builtin_vocabulary(w, vocab_size);
  } else {
    TROUPE_TRY(vocab_size, copy_vocabulary(w, spec.vocab_path));
  }

  // llama.cpp's use_more_bits: the first and last eighth of the layers, and every third.
  const auto more_bits = [n = spec.num_layers](std::int32_t layer) {
    return layer < n / 8 || layer >= 7 * n / 8 || (layer - n / 8) % 3 == 2;
  };
  auto matrix_type = [&](const std::string& name, std::int32_t layer) {
    using gguf::TensorType;
    if (spec.mix == Mix::none) return spec.type;
    if (name == "output.weight" || (name == "token_embd.weight" && spec.tied_output)) {
      return TensorType::q6_k;
    }
    const bool attn_v = name.ends_with("attn_v.weight");
    const bool attn_output = name.ends_with("attn_output.weight");
    const bool ffn_down = name.find("ffn_down") != std::string::npos;  // experts too
    switch (spec.mix) {
      case Mix::q4_k_m:
        return (attn_v || ffn_down) && more_bits(layer) ? TensorType::q6_k : TensorType::q4_k;
      case Mix::q3_k_m:
        if (attn_v) return layer < 2 ? TensorType::q5_k : TensorType::q4_k;
        if (attn_output) return TensorType::q4_k;
        if (ffn_down) return layer < spec.num_layers / 16 ? TensorType::q5_k : TensorType::q4_k;
        return TensorType::q3_k;
      default:  // Mix::q2_k
        if (attn_v) {
          return spec.num_heads / spec.num_kv_heads >= 4 ? TensorType::q4_k : TensorType::q3_k;
        }
        if (attn_output || ffn_down) return TensorType::q3_k;
        return TensorType::q2_k;
    }
  };
  // A matrix [rows, cols], or `experts` of them stacked (GGUF shape {cols, rows, experts}).
  auto matrix = [&](const std::string& name, std::int64_t rows, std::int64_t cols,
                    std::int32_t layer = -1, std::int64_t experts = 0) -> Result<void> {
    const std::int64_t count = std::max<std::int64_t>(experts, 1);
    // Shapes come from flags: a tensor past 2^32 values (16 GiB as floats) is refused
    // rather than multiplied past 64 bits or allocated.
    constexpr std::int64_t kMostValues = std::int64_t{1} << 32;
    if (rows > kMostValues / cols || count > kMostValues / (rows * cols)) {
      return make_error(ErrorCode::invalid_argument,
                        name + " would hold more than 2^32 values: too large for a random model");
    }
    const auto values = random_normal_values(static_cast<std::size_t>(count * rows * cols),
                                             spec.stddev, spec.seed ^ random_name_hash(name));
    // The router stays F32, as llama.cpp's quantizer leaves ffn_gate_inp.
    const gguf::TensorType tensor_type =
        name.ends_with("ffn_gate_inp.weight") ? gguf::TensorType::f32 : matrix_type(name, layer);
    TROUPE_TRY(auto data, gguf::quantize(tensor_type, values, cols));
    if (experts > 0) {
      w.add_tensor(name, tensor_type, {cols, rows, experts}, std::move(data));
    } else {
      w.add_tensor(name, tensor_type, {cols, rows}, std::move(data));
    }
    return {};
  };
  auto ones = [&](const std::string& name, std::int64_t n) {
    std::vector<float> values(static_cast<std::size_t>(n), 1.0f);
    auto data = gguf::quantize(gguf::TensorType::f32, values, n);
    w.add_tensor(name, gguf::TensorType::f32, {n}, std::move(*data));
  };
  TROUPE_TRY_VOID(matrix("token_embd.weight", vocab_size, spec.dim));
  ones("output_norm.weight", spec.dim);
  if (!spec.tied_output) TROUPE_TRY_VOID(matrix("output.weight", vocab_size, spec.dim));
  for (std::int32_t i = 0; i < spec.num_layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    ones(b + "attn_norm.weight", spec.dim);
    TROUPE_TRY_VOID(matrix(b + "attn_q.weight", q_dim, spec.dim, i));
    TROUPE_TRY_VOID(matrix(b + "attn_k.weight", kv_dim, spec.dim, i));
    TROUPE_TRY_VOID(matrix(b + "attn_v.weight", kv_dim, spec.dim, i));
    TROUPE_TRY_VOID(matrix(b + "attn_output.weight", spec.dim, q_dim, i));
    if (qwen) {
      ones(b + "attn_q_norm.weight", head_dim);
      ones(b + "attn_k_norm.weight", head_dim);
    } else if (arch == "olmoe") {  // across the heads
      ones(b + "attn_q_norm.weight", q_dim);
      ones(b + "attn_k_norm.weight", kv_dim);
    }
    ones(b + "ffn_norm.weight", spec.dim);
    if (moe) {
      const std::int64_t e = spec.num_experts, f = spec.expert_ffn_dim;
      TROUPE_TRY_VOID(matrix(b + "ffn_gate_inp.weight", e, spec.dim, i));
      TROUPE_TRY_VOID(matrix(b + "ffn_gate_exps.weight", f, spec.dim, i, e));
      TROUPE_TRY_VOID(matrix(b + "ffn_up_exps.weight", f, spec.dim, i, e));
      TROUPE_TRY_VOID(matrix(b + "ffn_down_exps.weight", spec.dim, f, i, e));
    } else {
      TROUPE_TRY_VOID(matrix(b + "ffn_gate.weight", spec.ffn_dim, spec.dim, i));
      TROUPE_TRY_VOID(matrix(b + "ffn_up.weight", spec.ffn_dim, spec.dim, i));
      TROUPE_TRY_VOID(matrix(b + "ffn_down.weight", spec.dim, spec.ffn_dim, i));
    }
  }
  return w.write(path);
}

}  // namespace troupe::model
