// What one GPU can check of tensor parallelism on CUDA: a one-rank NCCL group (its
// all-reduce and gather give back what they were given, through the backend's ops and
// bounded waits), and each rank's shard of a model loading on the device. Two ranks need
// two GPUs; these tests skip, saying so, without any.
#include <catch2/catch.hpp>

#include "gguf/gguf_file.hpp"
#include "gpu/gpu_test_support.hpp"
#include "gpu/nccl_communicator.hpp"
#include "model/llama_model.hpp"
#include "model/rendezvous_stores.hpp"

using namespace troupe;
using namespace std::chrono_literals;

TEST_CASE("a one-rank NCCL group's all-reduce and gather give back what they were given",
          "[gpu][tp]") {
  auto backend = test::gpu_or_skip();
  model::InProcessStore store;
  auto group = gpu::NcclCommunicator::connect(store, 0, 1, 0, "nccl-test", 20s);
  REQUIRE(group.has_value());
  REQUIRE(backend->join_group(std::shared_ptr<model::Communicator>(std::move(*group))).has_value());
  // The scratch and gather buffer at their largest, and NCCL's connections made, first.
  const auto before = backend->bytes_in_use();
  REQUIRE(backend->prepare_collectives(3000, 3000).has_value());
  CHECK(backend->bytes_in_use() == before + 3000 * 4);  // rank 0's gather buffer
  auto x = backend->allocate(3, 1000);
  REQUIRE(x.has_value());
  const auto host = test::random_floats(3000);
  REQUIRE(backend->write(*x, host).has_value());
  backend->all_reduce(*x);
  std::vector<float> back(3000);
  REQUIRE(backend->read(*x, back).has_value());
  CHECK(back == host);
  auto whole = backend->allocate(3, 1000);
  REQUIRE(whole.has_value());
  backend->gather_columns(*x, *whole);
  std::vector<float> gathered(3000);
  REQUIRE(backend->read(*whole, gathered).has_value());
  CHECK(gathered == host);
}

TEST_CASE("each rank's shard of stories260K loads on the GPU", "[gpu][tp][shared]") {
  const std::string path = test::shared_file("models/stories260K.gguf");
  for (std::int32_t rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank << " of 2");
    auto backend = test::gpu_or_skip();
    auto file = gguf::GgufFile::open(path);
    REQUIRE(file.has_value());
    auto shard = model::LlamaModel::load(*file, *backend, {rank, 2});
    REQUIRE(shard.has_value());
    CHECK(shard->local_config().num_heads == 4);
    CHECK(shard->local_config().num_kv_heads == 2);
    CHECK(shard->local_config().ffn_dim == 86);
  }
}
