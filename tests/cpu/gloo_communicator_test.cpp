// Gloo's all-reduce (and a pipeline's point-to-point sends) as troupe uses it: ranks as
// threads of this process on loopback.
// The sum is added in rank order (the same bits on every rank, whatever the size), a
// missing rank is an error within the timeout rather than a hang, and Gloo's SO_SNDBUF
// calls go to troupe's setsockopt.
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <sys/socket.h>

#include <cstring>
#include <functional>
#include <future>
#include <random>
#include <thread>

#include "cpu/gloo_communicator.hpp"
#include "model/rendezvous_stores.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

// Connects `size` ranks (a thread each) and runs `body` on every rank.
template <typename Body>
void with_group(std::int32_t size, const Body& body, std::chrono::milliseconds timeout = 10s) {
  model::InProcessStore store;
  static int formation = 0;
  const std::string prefix = "test-" + std::to_string(++formation);
  std::vector<std::future<void>> ranks;
  for (std::int32_t r = 0; r < size; ++r) {
    ranks.push_back(std::async(std::launch::async, [&, r] {
      auto group = cpu::GlooCommunicator::connect(store, r, size, {"127.0.0.1", prefix, timeout});
      if (!group) throw std::runtime_error(group.error().message);
      body(**group);
    }));
  }
  for (auto& rank : ranks) rank.get();
}

// What rank r contributes at element i.
std::vector<float> contribution(std::int32_t rank, std::size_t n) {
  std::mt19937 random(static_cast<unsigned>(1000 + rank));
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> data(n);
  for (auto& x : data) x = value(random) * static_cast<float>(1 + rank * 1000);
  return data;
}

}  // namespace

TEST_CASE("an all-reduce adds every rank's buffer in rank order, the same bits on every rank",
          "[cpu][collective]") {
  const std::int32_t size = GENERATE(2, 3, 4);
  // Below and above the size where the algorithm changes (64 KB), and not a multiple of
  // the ranks.
  const std::size_t n = GENERATE(std::size_t{1}, std::size_t{1000}, std::size_t{40001});
  INFO(size << " ranks, " << n << " floats");
  std::vector<float> expected(n, 0.0f);
  for (std::int32_t r = 0; r < size; ++r) {
    const auto part = contribution(r, n);
    for (std::size_t i = 0; i < n; ++i) expected[i] = r == 0 ? part[i] : expected[i] + part[i];
  }
  std::vector<std::vector<float>> results(size);
  with_group(size, [&](model::Communicator& group) {
    auto data = contribution(group.rank(), n);
    REQUIRE(group.all_reduce_sum(data).has_value());
    results[group.rank()] = std::move(data);
  });
  for (std::int32_t r = 0; r < size; ++r) {
    INFO("rank " << r);
    CHECK(std::memcmp(results[r].data(), expected.data(), n * sizeof(float)) == 0);
  }
}

TEST_CASE("a gather puts every rank's part on rank 0, in rank order", "[cpu][collective]") {
  const std::int32_t size = 3;
  std::vector<float> gathered;
  with_group(size, [&](model::Communicator& group) {
    const auto part = contribution(group.rank(), 100);
    std::vector<float> out(group.rank() == 0 ? 300 : 0);
    REQUIRE(group.gather(part, out).has_value());
    if (group.rank() == 0) gathered = out;
  });
  REQUIRE(gathered.size() == 300u);
  for (std::int32_t r = 0; r < size; ++r) {
    const auto part = contribution(r, 100);
    CHECK(std::equal(part.begin(), part.end(), gathered.begin() + r * 100));
  }
}

TEST_CASE("an element's sum does not depend on how many elements are reduced with it",
          "[cpu][collective]") {
  // A batch of one row and of many: the first row comes out the same.
  const std::int32_t size = 4;
  const std::size_t row = 768;
  std::vector<std::vector<float>> one(size), many(size);
  with_group(size, [&](model::Communicator& group) {
    auto all = contribution(group.rank(), row * 64);
    std::vector<float> first(all.begin(), all.begin() + row);
    REQUIRE(group.all_reduce_sum(first).has_value());
    REQUIRE(group.all_reduce_sum(all).has_value());
    one[group.rank()] = first;
    many[group.rank()].assign(all.begin(), all.begin() + row);
  });
  for (std::int32_t r = 0; r < size; ++r) CHECK(one[r] == many[r]);
}

TEST_CASE("a rank that never joins the collective fails the others within the timeout",
          "[cpu][collective]") {
  std::promise<void> finished;
  auto released = finished.get_future().share();
  with_group(
      2,
      [&](model::Communicator& group) {
        if (group.rank() == 1) {
          released.wait_for(20s);  // stays connected but never reduces
          return;
        }
        std::vector<float> data(16, 1.0f);
        const auto start = std::chrono::steady_clock::now();
        auto first = group.all_reduce_sum(data);
        CHECK_FALSE(first.has_value());
        CHECK(std::chrono::steady_clock::now() - start < 10s);
        // The group is broken from now on: a second call fails at once.
        auto second = group.all_reduce_sum(data);
        REQUIRE_FALSE(second.has_value());
        CHECK(second.error().message.find("broken") != std::string::npos);
        finished.set_value();
      },
      2s);
}

TEST_CASE("point-to-point sends pass buffers along a pipeline, in order, bit for bit",
          "[cpu][collective][pp]") {
  // Stage r receives from r - 1, adds its contribution and sends on, twice (two steps of
  // different sizes, as a pipeline's steps are); the last stage keeps what arrived.
  const std::int32_t size = GENERATE(2, 3);
  std::vector<std::vector<float>> arrived(2);
  with_group(size, [&](model::Communicator& group) {
    const std::int32_t r = group.rank();
    for (const std::size_t n : {std::size_t{5}, std::size_t{40001}}) {
      std::vector<float> data(n, 0.0f);
      if (r > 0) REQUIRE(group.recv(data, r - 1).has_value());
      const auto mine = contribution(r, n);
      for (std::size_t i = 0; i < n; ++i) data[i] += mine[i];
      if (r + 1 < size) {
        REQUIRE(group.send(data, r + 1).has_value());
      } else {
        arrived[n == 5 ? 0 : 1] = data;
      }
    }
    // A peer outside the group, or itself, is refused.
    std::vector<float> one(1);
    CHECK_FALSE(group.send(one, r).has_value());
    CHECK_FALSE(group.recv(one, size).has_value());
  });
  for (const std::size_t n : {std::size_t{5}, std::size_t{40001}}) {
    std::vector<float> expected(n, 0.0f);
    for (std::int32_t r = 0; r < size; ++r) {
      const auto part = contribution(r, n);
      for (std::size_t i = 0; i < n; ++i) expected[i] += part[i];
    }
    const auto& got = arrived[n == 5 ? 0 : 1];
    REQUIRE(got.size() == n);
    CHECK(std::memcmp(got.data(), expected.data(), n * sizeof(float)) == 0);
  }
}

TEST_CASE("a receive whose sender never sends fails within the timeout, and breaks the group",
          "[cpu][collective][pp]") {
  std::promise<void> finished;
  auto released = finished.get_future().share();
  with_group(
      2,
      [&](model::Communicator& group) {
        if (group.rank() == 0) {
          released.wait_for(20s);  // stays connected but never sends
          return;
        }
        std::vector<float> data(16);
        const auto start = std::chrono::steady_clock::now();
        auto first = group.recv(data, 0);
        CHECK_FALSE(first.has_value());
        CHECK(std::chrono::steady_clock::now() - start < 10s);
        auto second = group.send(data, 0);
        REQUIRE_FALSE(second.has_value());
        CHECK(second.error().message.find("broken") != std::string::npos);
        finished.set_value();
      },
      2s);
}

TEST_CASE(
    "a receive of another size than the peer sent fails within the timeout, and the process "
    "lives",
    "[cpu][collective][pp]") {
  // A peer out of step (another step's message, longer than the buffer posted) once ended
  // the process from Gloo's transport thread; the sizes now tell the messages apart.
  with_group(
      2,
      [&](model::Communicator& group) {
        if (group.rank() == 0) {
          std::vector<float> longer(64, 1.0f);
          CHECK_FALSE(group.send(longer, 1).has_value());  // never received
          return;
        }
        std::vector<float> data(16);
        const auto start = std::chrono::steady_clock::now();
        auto received = group.recv(data, 0);
        REQUIRE_FALSE(received.has_value());
        CHECK(std::chrono::steady_clock::now() - start < 10s);
      },
      1s);
}

TEST_CASE("a group whose ranks do not all arrive fails to connect within the timeout",
          "[cpu][collective]") {
  model::InProcessStore store;
  const auto start = std::chrono::steady_clock::now();
  auto group = cpu::GlooCommunicator::connect(store, 0, 2, {"127.0.0.1", "alone", 300ms});
  REQUIRE_FALSE(group.has_value());
  CHECK(group.error().message.find("could not connect") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - start < 5s);
}

TEST_CASE("Gloo's setsockopt calls reach troupe's, which keeps other callers' as they were",
          "[cpu][collective]") {
  // The executable's definition is the one the dynamic linker gives libgloo.
  void* found = dlsym(RTLD_DEFAULT, "setsockopt");
  REQUIRE(found != nullptr);
  Dl_info info;
  REQUIRE(dladdr(found, &info) != 0);
  CHECK(std::strstr(info.dli_fname, "libc.so") == nullptr);
  // A call from troupe's own code still sets the buffer.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  int size = 8192;
  REQUIRE(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size)) == 0);
  int got = 0;
  socklen_t length = sizeof(got);
  REQUIRE(getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &got, &length) == 0);
  CHECK(got == 2 * size);  // the kernel doubles what it is given
  close(fd);
}
