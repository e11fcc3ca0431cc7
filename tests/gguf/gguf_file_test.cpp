#include <catch2/catch.hpp>
#include <cstring>

#include "gguf/dequantize.hpp"
#include "gguf/gguf_file.hpp"
#include "gguf/gguf_writer.hpp"
#include "support/test_support.hpp"

using namespace troupe;
using namespace troupe::gguf;

namespace {

std::vector<std::byte> encode(std::initializer_list<std::uint8_t> bytes) {
  std::vector<std::byte> out;
  for (auto b : bytes) out.push_back(static_cast<std::byte>(b));
  return out;
}

template <typename T>
void append(std::vector<std::byte>& out, T value) {
  const std::size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &value, sizeof(T));
}

std::vector<std::byte> header(std::uint32_t version, std::uint64_t tensors, std::uint64_t kvs) {
  std::vector<std::byte> out;
  append<std::uint32_t>(out, 0x46554747);
  append(out, version);
  append(out, tensors);
  append(out, kvs);
  return out;
}

std::string error_of(const std::vector<std::byte>& bytes) {
  auto file = GgufFile::parse(bytes);
  REQUIRE_FALSE(file.has_value());
  return file.error().message;
}

GgufWriter small_model_writer() {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_uint32("answer", 42);
  std::vector<float> values(64);
  for (int i = 0; i < 64; ++i) values[i] = static_cast<float>(i);
  w.add_tensor("a", TensorType::f32, {8, 8}, *quantize(TensorType::f32, values, 8));
  w.add_tensor("b", TensorType::q8_0, {32, 2}, *quantize(TensorType::q8_0, values, 32));
  return w;
}

}  // namespace

TEST_CASE("every metadata value type round-trips through the writer and reader", "[gguf]") {
  GgufWriter w;
  w.add_uint32("u32", 7);
  w.add_int32("i32", -7);
  w.add_uint64("u64", 1ULL << 40);
  w.add_float32("f32", 0.5f);
  w.add_bool("bool", true);
  w.add_string("string", "héllo");
  const std::vector<std::string> strings = {"a", "", "ccc"};
  w.add_string_array("strings", strings);
  const std::vector<std::int32_t> ints = {1, -2, 3};
  w.add_int32_array("ints", ints);
  // The narrow and wide scalar types, and an array of arrays, written raw.
  auto raw = [&](const char* key, std::uint32_t type, std::vector<std::byte> bytes) {
    w.add_raw(key, type, bytes);
  };
  raw("u8", 0, encode({200}));
  raw("i8", 1, encode({0xff}));
  raw("u16", 2, encode({0x34, 0x12}));
  raw("i16", 3, encode({0xfe, 0xff}));
  std::vector<std::byte> i64, f64, nested;
  append<std::int64_t>(i64, -5);
  append<double>(f64, 2.25);
  raw("i64", 11, i64);
  raw("f64", 12, f64);
  append<std::uint32_t>(nested, 9);  // array of arrays
  append<std::uint64_t>(nested, 2);
  for (int i = 0; i < 2; ++i) {
    append<std::uint32_t>(nested, 4);  // of uint32
    append<std::uint64_t>(nested, 1);
    append<std::uint32_t>(nested, static_cast<std::uint32_t>(10 + i));
  }
  raw("nested", 9, nested);

  auto file = GgufFile::parse(w.to_bytes());
  REQUIRE(file.has_value());
  CHECK(file->version() == 3);
  CHECK(*file->get_uint("u32") == 7);
  CHECK(*file->get_int("i32") == -7);
  CHECK(*file->get_uint("u64") == (1ULL << 40));
  CHECK(*file->get_float("f32") == 0.5);
  CHECK(*file->get_bool("bool"));
  CHECK(*file->get_string("string") == "héllo");
  CHECK(*file->get_uint("u8") == 200);
  CHECK(*file->get_int("i8") == -1);
  CHECK(*file->get_uint("u16") == 0x1234);
  CHECK(*file->get_int("i16") == -2);
  CHECK(*file->get_int("i64") == -5);
  CHECK(*file->get_float("f64") == 2.25);
  const auto* s = *file->get_array("strings", GgufType::string);
  REQUIRE(s->elements.size() == 3);
  CHECK(std::get<std::string_view>(s->elements[2].value) == "ccc");
  const auto* n = *file->get_array("nested", GgufType::array);
  REQUIRE(n->elements.size() == 2);
  const auto& inner = std::get<GgufArray>(n->elements[1].value);
  CHECK(inner.element_type == GgufType::u32);
  CHECK(std::get<std::uint64_t>(inner.elements[0].value) == 11);

  SECTION("typed accessors name the key and the problem") {
    CHECK(file->get_string("u32").error().message == "metadata key 'u32' is uint32, not a string");
    CHECK(file->get_uint("nope").error().message == "missing metadata key 'nope'");
    CHECK(file->get_uint("i32").error().message.find("'i32'") != std::string::npos);
    CHECK(file->get_array("ints", GgufType::f32).error().message ==
          "metadata key 'ints' is an array of int32, not of float32");
  }
}

TEST_CASE("tensor infos point at aligned data inside the file", "[gguf]") {
  auto file = GgufFile::parse(small_model_writer().to_bytes());
  REQUIRE(file.has_value());
  REQUIRE(file->tensors().size() == 2);
  const auto* a = file->find_tensor("a");
  const auto* b = file->find_tensor("b");
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  CHECK(a->num_bytes == 256);
  CHECK(b->type == TensorType::q8_0);
  CHECK(b->num_bytes == 2 * 34);
  CHECK(b->offset % 32 == 0);
  CHECK(reinterpret_cast<const float*>(a->data)[63] == 63.0f);
}

TEST_CASE("the real test models parse", "[gguf][shared]") {
  auto file = GgufFile::open(test::shared_file("models/stories260K.gguf"));
  REQUIRE(file.has_value());
  CHECK(file->version() == 3);
  CHECK(file->tensors().size() == 48);
  CHECK(*file->get_string("general.architecture") == "llama");
  CHECK(*file->get_uint("llama.block_count") == 5);
  const auto* tokens = *file->get_array("tokenizer.ggml.tokens", GgufType::string);
  CHECK(tokens->elements.size() == 512);
}

TEST_CASE("corrupt headers give errors that name the problem", "[gguf]") {
  SECTION("empty input") {
    CHECK(error_of({}).find("truncated file: magic") == 0);
  }
  SECTION("wrong magic") {
    CHECK(error_of(encode({'G', 'G', 'M', 'L', 3, 0, 0, 0})) ==
          "not a GGUF file: the first four bytes are not 'GGUF'");
  }
  SECTION("version 1 and big-endian files") {
    CHECK(error_of(header(1, 0, 0)) == "unsupported GGUF version 1 (versions 2 and 3 are)");
    CHECK(error_of(header(0x03000000, 0, 0)) == "big-endian GGUF files are not supported");
  }
  SECTION("an absurd tensor count") {
    CHECK(error_of(header(3, 1ULL << 60, 0)).find("tensor count") != std::string::npos);
  }
  SECTION("an absurd metadata count") {
    CHECK(error_of(header(3, 0, 1ULL << 62)).find("metadata count") != std::string::npos);
  }
  SECTION("a string longer than the file") {
    auto bytes = header(3, 0, 1);
    append<std::uint64_t>(bytes, 1ULL << 50);
    bytes.resize(bytes.size() + 16);
    CHECK(error_of(bytes).find("claims 1125899906842624 bytes") != std::string::npos);
  }
  SECTION("an unknown value type names its key") {
    auto bytes = header(3, 0, 1);
    append<std::uint64_t>(bytes, 3);
    bytes.push_back(std::byte{'k'});
    bytes.push_back(std::byte{'e'});
    bytes.push_back(std::byte{'y'});
    append<std::uint32_t>(bytes, 99);
    CHECK(error_of(bytes) == "corrupt metadata: key 'key' has unknown value type 99");
  }
  SECTION("an array longer than the file") {
    GgufWriter w;
    std::vector<std::byte> v;
    append<std::uint32_t>(v, 4);
    append<std::uint64_t>(v, 1ULL << 40);
    w.add_raw("big", 9, v);
    CHECK(error_of(w.to_bytes()).find("key 'big' claims an array of 1099511627776 uint32") !=
          std::string::npos);
  }
  SECTION("arrays nested too deep") {
    GgufWriter w;
    std::vector<std::byte> v;
    for (int i = 0; i < 20; ++i) {
      append<std::uint32_t>(v, 9);
      append<std::uint64_t>(v, 1);
    }
    w.add_raw("deep", 9, v);
    CHECK(error_of(w.to_bytes()).find("nests arrays deeper") != std::string::npos);
  }
  SECTION("a duplicate key") {
    GgufWriter w;
    w.add_uint32("twice", 1);
    w.add_uint32("twice", 2);
    CHECK(error_of(w.to_bytes()) == "corrupt metadata: key 'twice' appears twice");
  }
  SECTION("a bad alignment") {
    GgufWriter w;
    w.add_uint32("general.alignment", 24);
    CHECK(error_of(w.to_bytes()).find("power of two") != std::string::npos);
  }
}

TEST_CASE("corrupt tensor infos name the tensor", "[gguf]") {
  SECTION("an unknown tensor type") {
    GgufWriter w;
    w.add_tensor("weird", static_cast<TensorType>(77), {4}, std::vector<std::byte>(16));
    CHECK(error_of(w.to_bytes()) == "tensor 'weird' has unknown tensor type 77");
  }
  SECTION("a type ggml has removed from files") {
    GgufWriter w;
    w.add_tensor("blk.0.ffn_up.weight", static_cast<TensorType>(31), {32},
                 std::vector<std::byte>(18));
    CHECK(error_of(w.to_bytes()) ==
          "tensor 'blk.0.ffn_up.weight' has tensor type Q4_0_4_4 (31), which ggml has removed "
          "from GGUF files; convert the model again");
  }
  SECTION("a row that is not whole blocks") {
    GgufWriter w;
    w.add_tensor("q", TensorType::q8_0, {33}, std::vector<std::byte>(34));
    CHECK(error_of(w.to_bytes()).find("tensor 'q'") != std::string::npos);
  }
  SECTION("a zero dimension") {
    GgufWriter w;
    w.add_tensor("z", TensorType::f32, {0}, {});
    CHECK(error_of(w.to_bytes()) == "corrupt tensor 'z': dimension 0 is 0");
  }
  SECTION("five dimensions") {
    GgufWriter w;
    w.add_tensor("five", TensorType::f32, {1, 1, 1, 1, 1}, std::vector<std::byte>(4));
    CHECK(error_of(w.to_bytes()).find("5 dimensions") != std::string::npos);
  }
  SECTION("data past the end of the file") {
    auto bytes = small_model_writer().to_bytes();
    bytes.resize(bytes.size() - 40);
    CHECK(error_of(bytes).find("tensor 'b'") != std::string::npos);
    CHECK(error_of(bytes).find("lies outside the file") != std::string::npos);
  }
  SECTION("a duplicate tensor name") {
    GgufWriter w;
    w.add_tensor("t", TensorType::f32, {1}, std::vector<std::byte>(4));
    w.add_tensor("t", TensorType::f32, {1}, std::vector<std::byte>(4));
    CHECK(error_of(w.to_bytes()) == "corrupt file: tensor 't' appears twice");
  }
}

TEST_CASE("tensors of every type ggml defines parse, with ggml's names and block sizes", "[gguf]") {
  // Types troupe cannot compute with still parse: the model loader then refuses them by
  // tensor and type name (tests/cpu/quantized_model_test.cpp).
  struct Known {
    std::uint32_t id;
    std::string_view name;
    std::int64_t block;
    std::size_t block_bytes;
  };
  for (const Known k :
       {Known{16, "IQ2_XXS", 256, 66}, Known{17, "IQ2_XS", 256, 74}, Known{18, "IQ3_XXS", 256, 98},
        Known{19, "IQ1_S", 256, 50}, Known{20, "IQ4_NL", 32, 18}, Known{21, "IQ3_S", 256, 110},
        Known{22, "IQ2_S", 256, 82}, Known{23, "IQ4_XS", 256, 136}, Known{29, "IQ1_M", 256, 56},
        Known{34, "TQ1_0", 256, 54}, Known{35, "TQ2_0", 256, 66}, Known{39, "MXFP4", 32, 17},
        Known{40, "NVFP4", 64, 36}, Known{41, "Q1_0", 128, 18}, Known{42, "Q2_0", 64, 18},
        Known{10, "Q2_K", 256, 84}, Known{11, "Q3_K", 256, 110}}) {
    INFO(k.name);
    GgufWriter w;
    w.add_tensor("t", static_cast<TensorType>(k.id), {k.block * 2, 3},
                 std::vector<std::byte>(6 * k.block_bytes));
    const auto bytes = w.to_bytes();
    auto file = GgufFile::parse(bytes);
    REQUIRE(file.has_value());
    const GgufTensorInfo* t = file->find_tensor("t");
    REQUIRE(t != nullptr);
    CHECK(tensor_type_name(t->type) == k.name);
    CHECK(t->num_bytes == 6 * k.block_bytes);
  }
}

TEST_CASE("opening a missing or empty file is an error, not a crash", "[gguf]") {
  auto missing = GgufFile::open("/nonexistent/model.gguf");
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.error().message.find("cannot open model file '/nonexistent/model.gguf'") == 0);
  const auto empty = test::temp_path("empty.gguf");
  { std::ofstream(empty).flush(); }
  auto e = GgufFile::open(empty);
  REQUIRE_FALSE(e.has_value());
  CHECK(e.error().message.find("is empty") != std::string::npos);
  auto dir = GgufFile::open("/tmp");
  REQUIRE_FALSE(dir.has_value());
}
