// Writes the GGUF reader's seed corpus (fuzz/corpus/gguf_reader/): small valid
// files that reach every part of the reader and the loader, so that the fuzzer
// starts from deep inside rather than from the magic number. Run it again when
// the reader learns something new:
//   build-fuzz/fuzz/gguf_seeds fuzz/corpus/gguf_reader
// (The files have no .gguf suffix: .gitignore keeps model files out of the repo.)
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gguf/dequantize.hpp"
#include "gguf/gguf_writer.hpp"

using namespace troupe::gguf;

namespace {

std::vector<float> ramp(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = 0.01f * static_cast<float>(i % 17) - 0.08f;
  return v;
}

std::vector<std::byte> f32(std::size_t n) {
  return *quantize(TensorType::f32, ramp(n), static_cast<std::int64_t>(n));
}

// Bytes of `rows` rows of `cols` elements of a type the writer cannot encode: a pattern.
std::vector<std::byte> pattern(TensorType type, std::int64_t cols, std::int64_t rows) {
  std::vector<std::byte> out(row_bytes(type, cols) * static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>(i * 37 + 11);
  return out;
}

// A whole Llama model, small enough to be a seed: dim 4, one layer, 2 heads of 2,
// 8 SentencePiece tokens, F32 weights, a ChatML template, every optional key.
std::vector<std::byte> llama_model() {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_string("general.name", "fuzz-seed");
  w.add_uint32("llama.context_length", 64);
  w.add_uint32("llama.embedding_length", 4);
  w.add_uint32("llama.block_count", 1);
  w.add_uint32("llama.feed_forward_length", 8);
  w.add_uint32("llama.attention.head_count", 2);
  w.add_uint32("llama.attention.head_count_kv", 1);
  w.add_uint32("llama.attention.key_length", 2);
  w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.add_uint32("llama.rope.dimension_count", 2);
  w.add_float32("llama.rope.freq_base", 10000.0f);
  w.add_string("llama.rope.scaling.type", "linear");
  w.add_float32("llama.rope.scaling.factor", 2.0f);
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_string("tokenizer.ggml.pre", "default");
  const std::vector<std::string> tokens = {"<unk>",        "<s>",           "</s>", "<0x41>",
                                           "\xe2\x96\x81", "\xe2\x96\x81h", "i",    "<|im_end|>"};
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  const std::vector<float> scores = {0, 0, 0, 0, -1, -2, -3, 0};
  w.add_float32_array("tokenizer.ggml.scores", scores);
  const std::vector<std::int32_t> types = {2, 3, 3, 6, 1, 1, 1, 3};
  w.add_int32_array("tokenizer.ggml.token_type", types);
  w.add_uint32("tokenizer.ggml.bos_token_id", 1);
  w.add_uint32("tokenizer.ggml.eos_token_id", 2);
  w.add_uint32("tokenizer.ggml.unknown_token_id", 0);
  w.add_int32("tokenizer.ggml.padding_token_id", -1);
  w.add_bool("tokenizer.ggml.add_bos_token", true);
  w.add_bool("tokenizer.ggml.add_eos_token", false);
  w.add_bool("tokenizer.ggml.add_space_prefix", true);
  w.add_string("tokenizer.chat_template",
               "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
               "{% endfor %}");
  const std::int64_t dim = 4, ffn = 8, vocab = 8, q_dim = 4, kv_dim = 2;
  w.add_tensor("token_embd.weight", TensorType::f32, {dim, vocab}, f32(dim * vocab));
  w.add_tensor("output_norm.weight", TensorType::f32, {dim}, f32(dim));
  w.add_tensor("output.weight", TensorType::f32, {dim, vocab}, f32(dim * vocab));
  w.add_tensor("rope_freqs.weight", TensorType::f32, {1}, f32(1));
  w.add_tensor("blk.0.attn_norm.weight", TensorType::f32, {dim}, f32(dim));
  w.add_tensor("blk.0.attn_q.weight", TensorType::f32, {dim, q_dim}, f32(dim * q_dim));
  w.add_tensor("blk.0.attn_k.weight", TensorType::f32, {dim, kv_dim}, f32(dim * kv_dim));
  w.add_tensor("blk.0.attn_v.weight", TensorType::f32, {dim, kv_dim}, f32(dim * kv_dim));
  w.add_tensor("blk.0.attn_output.weight", TensorType::f32, {q_dim, dim}, f32(q_dim * dim));
  w.add_tensor("blk.0.ffn_norm.weight", TensorType::f32, {dim}, f32(dim));
  w.add_tensor("blk.0.ffn_gate.weight", TensorType::f32, {dim, ffn}, f32(dim * ffn));
  w.add_tensor("blk.0.ffn_up.weight", TensorType::f32, {dim, ffn}, f32(dim * ffn));
  w.add_tensor("blk.0.ffn_down.weight", TensorType::f32, {ffn, dim}, f32(ffn * dim));
  return w.to_bytes();
}

// A byte-level BPE vocabulary (Llama-3 pre-tokenizer) and one tensor of every
// decodable type: F16, BF16 and Q8_0/Q4_0 encoded, the others a byte pattern.
std::vector<std::byte> bpe_and_quantized() {
  GgufWriter w;
  w.add_string("general.architecture", "mistral");
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", "llama-bpe");
  const std::vector<std::string> tokens = {"h",          "i",          "\xc4\xa0", "hi",
                                           "\xc4\xa0hi", "<|eot_id|>", "<|user|>"};
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  const std::vector<std::int32_t> types = {1, 1, 1, 1, 1, 3, 4};
  w.add_int32_array("tokenizer.ggml.token_type", types);
  const std::vector<std::string> merges = {"h i", "\xc4\xa0 hi"};
  w.add_string_array("tokenizer.ggml.merges", merges);
  w.add_uint32("tokenizer.ggml.eot_token_id", 5);
  w.add_string("tokenizer.chat_template", "<|start_header_id|>");
  const auto values = ramp(64);
  for (const TensorType type :
       {TensorType::f16, TensorType::bf16, TensorType::q8_0, TensorType::q4_0}) {
    const std::string name = "t." + std::string(tensor_type_name(type));
    w.add_tensor(name, type, {32, 2}, *quantize(type, values, 32));
  }
  for (const TensorType type : {TensorType::q4_1, TensorType::q5_0, TensorType::q5_1}) {
    w.add_tensor("t." + std::string(tensor_type_name(type)), type, {32, 2}, pattern(type, 32, 2));
  }
  for (const TensorType type : {TensorType::q4_k, TensorType::q5_k, TensorType::q6_k}) {
    w.add_tensor("t." + std::string(tensor_type_name(type)), type, {256}, pattern(type, 256, 1));
  }
  return w.to_bytes();
}

// Every metadata value type, a nested array, and a v2-era layout's neighbour: an
// empty tensor list with a custom alignment.
std::vector<std::byte> metadata_types() {
  GgufWriter w;
  auto raw = [&](const char* key, std::uint32_t type, std::vector<std::uint8_t> bytes) {
    std::vector<std::byte> b(bytes.size());
    std::memcpy(b.data(), bytes.data(), bytes.size());
    w.add_raw(key, type, b);
  };
  w.add_uint32("general.alignment", 64);
  raw("u8", 0, {0xff});
  raw("i8", 1, {0x80});
  raw("u16", 2, {0x34, 0x12});
  raw("i16", 3, {0xff, 0xff});
  w.add_int32("i32", -7);
  w.add_float32("f32", 0.5f);
  w.add_bool("bool", true);
  w.add_string("string", "caf\xc3\xa9");
  w.add_uint64("u64", 1ULL << 40);
  raw("i64", 11, {0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff});
  raw("f64", 12, {0, 0, 0, 0, 0, 0, 0xf0, 0x3f});
  // An array of 2 arrays of u8: [[1], [2, 3]].
  raw("nested", 9, {9, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0,     //
                    0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1,  //
                    0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 2, 3});
  w.add_tensor("a", TensorType::f32, {1}, f32(1));
  return w.to_bytes();
}

bool write(const std::string& dir, const char* name, const std::vector<std::byte>& bytes) {
  const std::string path = dir + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  std::printf("%s: %zu bytes\n", path.c_str(), bytes.size());
  return std::fclose(f) == 0 && ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIRECTORY\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const bool ok = write(dir, "llama-model", llama_model()) &&
                  write(dir, "bpe-and-quantized", bpe_and_quantized()) &&
                  write(dir, "metadata-types", metadata_types());
  return ok ? 0 : 1;
}
