// What the server tests share: a server over a small engine, and whether a client going
// away cancelled its requests rather than let them run to their end.
#pragma once

#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "actors/engine_hooks.hpp"
#include "monitoring/metrics.hpp"
#include "net/http_server.hpp"
#include "support/engine_support.hpp"
#include "support/small_model.hpp"
#include "troupe/engine.hpp"

namespace troupe::test {

// The server on an ephemeral port over an engine on a small model (write_small_model)
// of this context length: 2 threads, `num_kv_blocks` blocks of 4 tokens, metrics.
struct ServedEngine {
  // `vocab_size`: of the built-in vocabulary (0: write_small_model's 512).
  ServedEngine(const std::string& name, net::ServerConfig config, std::int32_t context_length,
               std::int32_t num_kv_blocks, std::function<void()> before_step = {},
               std::int32_t vocab_size = 0, SpeculativeConfig speculative = {}) {
    metrics = std::make_shared<monitoring::Metrics>();
    EngineConfig e;
    e.model_path = write_small_model(
        name + "-" + std::to_string(context_length) + "-" + std::to_string(vocab_size),
        [context_length, vocab_size](model::RandomModelSpec& s) {
          s.context_length = context_length;
          if (vocab_size > 0) s.vocab_size = vocab_size;
        });
    e.num_threads = 2;
    e.block_size = 4;
    e.num_kv_blocks = num_kv_blocks;
    e.metrics = metrics;
    e.speculative = std::move(speculative);
    auto created = Engine::create(e, EngineHooks{std::move(before_step)});
    INFO((created ? std::string() : created.error().message));
    REQUIRE(created.has_value());
    engine = std::move(*created);
    config.metrics = metrics;
    config.port = 0;
    server = std::make_unique<net::HttpServer>(*engine, config);
    REQUIRE(server->start().has_value());
  }
  ~ServedEngine() { server->stop(); }

  bool kv_drains() const { return test::kv_drains(*engine); }

  std::shared_ptr<monitoring::Metrics> metrics;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<net::HttpServer> server;  // declared last: it goes first
};

// Whether `n` requests have ended cancelled (finish reason "abort"), waiting up to two
// seconds: a request actor records its end a moment after the scheduler frees its blocks.
inline bool num_aborted_is(const monitoring::Metrics& metrics, int n) {
  const std::string line =
      R"(troupe_request_success_total{model_name="troupe",finish_reason="abort"} )" +
      std::to_string(n) + "\n";
  for (int i = 0; i < 200; ++i) {
    if (metrics.serialize().find(line) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

}  // namespace troupe::test
