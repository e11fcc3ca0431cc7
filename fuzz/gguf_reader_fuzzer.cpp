// The GGUF reader on arbitrary bytes, and, when they parse, everything a loader
// reads: the config, the tokenizer (then an encode and decode), the chat
// template, every tensor through the weight loader's checks and a row decode.
// Invariants: a rejected file says why; a tensor's rows fit in its bytes (and
// ASan sees any read past the parsed copy); token ids stay inside the vocabulary.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "fuzz_support.hpp"
#include "gguf/dequantize.hpp"
#include "gguf/gguf_file.hpp"
#include "model/backend.hpp"
#include "model/llama_config.hpp"
#include "model/llama_model.hpp"
#include "text/chat_template.hpp"
#include "text/tokenizer.hpp"

using namespace troupe;
using namespace troupe::gguf;
using namespace troupe::model;
using namespace troupe::text;

namespace {

// Rows up to this many elements are decoded (a fuzzed file may claim huge ones).
constexpr std::int64_t kMaxDecodedCols = 1 << 16;

void decode_rows(const GgufTensorInfo& t, const GgufFile& file) {
  TROUPE_FUZZ_CHECK(t.num_bytes <= file.file_size(), "a tensor is larger than its file");
  if (!can_dequantize(t.type) || t.dims[0] <= 0 || t.dims[0] > kMaxDecodedCols) return;
  const std::size_t bytes_per_row = row_bytes(t.type, t.dims[0]);
  const std::int64_t num_rows = t.num_elements() / t.dims[0];
  TROUPE_FUZZ_CHECK(bytes_per_row * static_cast<std::uint64_t>(num_rows) <= t.num_bytes,
                    "a tensor's rows do not fit in its bytes");
  std::vector<float> row(static_cast<std::size_t>(t.dims[0]));
  // The first and the last row: an offset error shows at either end.
  for (const std::int64_t r : {std::int64_t{0}, num_rows - 1}) {
    const std::byte* at = t.data + static_cast<std::size_t>(r) * bytes_per_row;
    const auto decoded = dequantize_row(t.type, at, t.dims[0], row.data());
    TROUPE_FUZZ_CHECK(decoded.has_value(), "a decodable type failed to decode");
  }
}

// The weight loader's backend: takes each weight after the loader's checks and
// decodes its rows; it runs no ops (nothing calls them without a step).
class CheckingBackend final : public Backend {
 public:
  explicit CheckingBackend(const GgufFile& file) : file_(file) {}

  Result<Weight> load_weight(const GgufTensorInfo& info) override {
    decode_rows(info, file_);
    return Weight{info.data, info.type,
                  info.num_elements() / std::max<std::int64_t>(info.dims[0], 1), info.dims[0]};
  }
  Result<Tensor> allocate(std::int64_t, std::int64_t) override {
    return make_error(ErrorCode::unsupported, "the fuzz backend allocates nothing");
  }
  void release(Tensor) override {}
  Result<void> allocate_kv_cache(const KvCacheShape& shape) override {
    shape_ = shape;
    return {};
  }
  const KvCacheShape& kv_cache_shape() const override { return shape_; }
  Result<StepShape> begin_step(const StepInput&) override {
    return make_error(ErrorCode::unsupported, "the fuzz backend runs no steps");
  }
  void embed(const Weight&, Tensor) override {}
  void rms_norm(Tensor, const Weight&, float, Tensor) override {}
  void matmul(Tensor, const Weight&, Tensor) override {}
  void rope(Tensor, std::int32_t, const RopeParams&) override {}
  void store_kv(std::int32_t, Tensor, Tensor) override {}
  void attention(std::int32_t, Tensor, const AttentionParams&, Tensor) override {}
  void swiglu(Tensor, Tensor, Tensor) override {}
  void add(Tensor, Tensor) override {}
  void gather_logit_rows(Tensor, Tensor) override {}
  Result<void> read(Tensor, std::span<float>) override { return {}; }

 private:
  const GgufFile& file_;
  KvCacheShape shape_;
};

// Every typed accessor on every key: each returns a value or an error, never UB.
void read_metadata(const GgufFile& file) {
  for (const auto& [key, value] : file.metadata()) {
    TROUPE_FUZZ_CHECK(file.find(key) != nullptr, "a metadata key cannot be found");
    (void)file.get_uint(key);
    (void)file.get_int(key);
    (void)file.get_float(key);
    (void)file.get_bool(key);
    (void)file.get_string(key);
    if (value.type == GgufType::array) {
      const auto& array = std::get<GgufArray>(value.value);
      (void)file.get_array(key, array.element_type);
    }
  }
  for (const auto& t : file.tensors()) {
    TROUPE_FUZZ_CHECK(file.find_tensor(t.name) != nullptr, "a tensor cannot be found");
    decode_rows(t, file);
  }
}

void read_tokenizer(const GgufFile& file, std::string_view text) {
  const auto tokenizer = Tokenizer::from_gguf(file);
  if (!tokenizer) {
    TROUPE_FUZZ_CHECK(!tokenizer.error().message.empty(), "a rejected vocabulary says nothing");
    return;
  }
  for (const bool parse_special : {false, true}) {
    const auto ids = tokenizer->encode(text, /*add_special=*/true, parse_special);
    for (const TokenId id : ids) {
      TROUPE_FUZZ_CHECK(id >= 0 && static_cast<std::size_t>(id) < tokenizer->size(),
                        "a token id is outside the vocabulary");
    }
    (void)tokenizer->decode(ids);
    (void)tokenizer->decode(ids, /*render_special=*/true);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto bytes = std::as_bytes(std::span(data, size));
  const auto file = GgufFile::parse(bytes);
  if (!file) {
    TROUPE_FUZZ_CHECK(!file.error().message.empty(), "a rejected file says nothing");
    return 0;
  }
  TROUPE_FUZZ_CHECK(file->file_size() == size, "the file size is not the input's");
  read_metadata(*file);
  (void)LlamaConfig::from_gguf(*file);
  CheckingBackend backend(*file);
  (void)LlamaModel::load(*file, backend);
  // The text encoded is the tail of the input itself: whatever the mutator wrote last.
  const std::size_t tail = std::min<std::size_t>(size, 64);
  read_tokenizer(*file, std::string_view(reinterpret_cast<const char*>(data) + size - tail, tail));
  if (const auto chat_template = file->get_string("tokenizer.chat_template")) {
    (void)render_chat(detect_chat_family(*chat_template), {{"user", "hi"}});
  }
  return 0;
}
