// prompt_logprobs over the cluster's wire: the head is this process's Engine and its one
// replica's worker a `troupe node` process on loopback, so the step's prompt rows and
// their scores cross the network (StepWork, StepOutput). The scores must be a local
// worker's, bit for bit: the same model and kernels on the same machine.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <condition_variable>
#include <map>
#include <mutex>

#include "support/child_process.hpp"
#include "support/engine_support.hpp"
#include "support/test_support.hpp"
#include "troupe/engine.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

const std::string kToken = "prompt-logprobs-token";

// A port nothing listens on now (the head opens it; the node retries until it does).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  socklen_t length = sizeof address;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0);
  ::close(fd);
  return ntohs(address.sin_port);
}

EngineConfig stories_config() {
  EngineConfig c;
  c.model_path = test::shared_file("models/stories260K.gguf");
  c.num_threads = 1;
  c.block_size = 4;
  c.num_kv_blocks = 128;
  c.max_num_batched_tokens = 8;  // several chunks, each step's rows on the wire
  return c;
}

// The first event of one request: where its prompt_logprobs come.
std::vector<PromptLogprob> scores_of(Engine& engine, std::vector<TokenId> prompt) {
  auto request = test::greedy(std::move(prompt), 2);
  request.params.prompt_logprobs = 4;
  std::mutex mutex;
  std::condition_variable done;
  std::vector<TokenEvent> events;
  const auto id = engine.submit(request, [&](const TokenEvent& e) {
    std::lock_guard lock(mutex);
    events.push_back(e);
    if (e.finished) done.notify_all();
  });
  REQUIRE(id.has_value());
  std::unique_lock lock(mutex);
  REQUIRE(done.wait_for(lock, 60s, [&] { return !events.empty() && events.back().finished; }));
  REQUIRE(events.back().finish_reason == FinishReason::length);
  return events.front().prompt_logprobs;
}

}  // namespace

TEST_CASE("a prompt scored by a worker on a node: a local worker's scores, bit for bit",
          "[cluster][prompt_logprobs]") {
  std::vector<TokenId> prompt{1};
  for (int i = 1; i < 29; ++i) prompt.push_back(static_cast<TokenId>(3 + (i * 53) % 500));
  // The node first, before this process starts any thread: it joins once the head listens.
  const int port = free_port();
  test::ChildProcess node({TROUPE_BINARY, "node", "--join", "127.0.0.1:" + std::to_string(port),
                           "--cluster-token", kToken, "--name", "n0", "--threads", "1"});
  std::vector<PromptLogprob> remote;
  {
    auto config = stories_config();
    config.cluster.emplace();
    config.cluster->port = static_cast<std::uint16_t>(port);
    config.cluster->token = kToken;
    config.cluster->wait = std::chrono::seconds(30);
    auto head = Engine::create(config);
    INFO(node.output());
    REQUIRE(head.has_value());
    remote = scores_of(**head, prompt);
  }
  auto local = Engine::create(stories_config());
  REQUIRE(local.has_value());
  const auto expected = scores_of(**local, prompt);
  REQUIRE(expected.size() == prompt.size() - 1);
  CHECK(remote == expected);
}
