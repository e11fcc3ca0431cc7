// troupe make-lora's adapters (model/random_adapter.cpp): written for any base model file,
// they read back through LoraAdapter::open with the asked rank, type and targets.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>

#include "model/loaded_model.hpp"
#include "model/lora_adapter.hpp"
#include "model/random_model.hpp"
#include "support/small_model.hpp"
#include "support/test_support.hpp"

using namespace troupe;
using namespace troupe::model;

TEST_CASE("a random adapter reads back with its rank, type and targets", "[lora]") {
  const std::string base_path = test::write_small_model("lora-base");  // FFN 128
  auto base = LoadedModel::open(base_path);
  REQUIRE(base.has_value());
  const std::string path = test::temp_path("lora-random.gguf");

  SECTION("every attention and FFN matrix, F16 by default of the spec's type") {
    RandomAdapterSpec spec;
    spec.base_path = base_path;
    spec.rank = 8;
    spec.alpha = 16.0f;
    spec.type = gguf::TensorType::f16;
    REQUIRE(write_random_adapter(spec, path).has_value());
    auto adapter = LoraAdapter::open(path, *base->file, base->config);
    REQUIRE(adapter.has_value());
    CHECK(adapter->num_matrices() == 2 * 7);
    CHECK(adapter->max_rank() == 8);
    const LoraMatrix* k = adapter->find(1, LoraTarget::attn_k);
    REQUIRE(k != nullptr);
    CHECK(k->type == gguf::TensorType::f16);
    CHECK(k->n_in == 64);
    CHECK(k->n_out == 32);
    CHECK(k->scale == 2.0f);  // alpha / rank
    const LoraMatrix* down = adapter->find(0, LoraTarget::ffn_down);
    REQUIRE(down != nullptr);
    CHECK(down->n_in == 128);
    // Normal values of the asked spread, and A and B not the same values.
    double sum_squares = 0.0;
    for (std::int64_t r = 0; r < 8; ++r) {
      for (std::int64_t i = 0; i < 128; ++i) sum_squares += std::pow(down->a_at(r, i), 2.0);
    }
    CHECK(std::sqrt(sum_squares / (8 * 128)) == Approx(0.02).epsilon(0.15));
    CHECK(down->a_at(0, 0) != down->b_at(0, 0));
  }
  SECTION("chosen targets in F32, and a second seed gives other values") {
    RandomAdapterSpec spec;
    spec.base_path = base_path;
    spec.rank = 4;
    spec.targets = {"attn_q", "ffn_up"};
    REQUIRE(write_random_adapter(spec, path).has_value());
    auto one = LoraAdapter::open(path, *base->file, base->config);
    REQUIRE(one.has_value());
    CHECK(one->num_matrices() == 2 * 2);
    CHECK(one->find(0, LoraTarget::attn_v) == nullptr);
    REQUIRE(one->find(1, LoraTarget::ffn_up) != nullptr);
    CHECK(one->find(1, LoraTarget::ffn_up)->type == gguf::TensorType::f32);
    spec.seed = 2;
    const std::string other_path = test::temp_path("lora-random-2.gguf");
    REQUIRE(write_random_adapter(spec, other_path).has_value());
    auto other = LoraAdapter::open(other_path, *base->file, base->config);
    REQUIRE(other.has_value());
    CHECK(one->find(0, LoraTarget::attn_q)->a_at(0, 0) !=
          other->find(0, LoraTarget::attn_q)->a_at(0, 0));
    std::filesystem::remove(other_path);
  }
  SECTION("what cannot be written is an error that says why") {
    RandomAdapterSpec spec;
    spec.base_path = base_path;
    spec.targets = {"attn_qkv"};
    auto unknown = write_random_adapter(spec, path);
    REQUIRE_FALSE(unknown.has_value());
    CHECK(unknown.error().message.find("unknown LoRA target attn_qkv") != std::string::npos);
    spec.targets.clear();
    spec.rank = 0;
    CHECK_FALSE(write_random_adapter(spec, path).has_value());
    spec.rank = 4;
    spec.type = gguf::TensorType::q8_0;
    CHECK_FALSE(write_random_adapter(spec, path).has_value());
    spec.type = gguf::TensorType::f16;
    spec.base_path = test::temp_path("no-such-model.gguf");
    CHECK_FALSE(write_random_adapter(spec, path).has_value());
  }
  std::filesystem::remove(path);
  std::filesystem::remove(base_path);
}
