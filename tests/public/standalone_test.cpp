// The public API stands alone: this file is compiled with nothing but include/ (and
// tl::expected's) on its include path and linked with the library, as a program that
// embeds troupe would be. It runs the engine on stories260K from ../shared.
#include <catch2/catch.hpp>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "troupe/engine.hpp"
#include "troupe/result.hpp"
#include "troupe/sampling.hpp"
#include "troupe/types.hpp"

TEST_CASE("a program that sees only include/troupe/ builds, links and generates", "[public]") {
  const char* env = std::getenv("TROUPE_SHARED_DIR");
  const std::filesystem::path shared =
      env ? std::filesystem::path(env) : std::filesystem::path(TROUPE_SOURCE_DIR) / ".." / "shared";
  const auto model = shared / "models" / "stories260K.gguf";
  if (!std::filesystem::exists(model)) {
    std::printf("skipped: %s is absent (tests that need ../shared skip without it)\n",
                model.c_str());
    std::exit(77);
  }
  troupe::EngineConfig config;
  config.model_path = model.string();
  config.num_threads = 1;
  config.kv_cache_bytes = std::int64_t{16} << 20;
  auto engine = troupe::Engine::create(config);
  REQUIRE(engine.has_value());
  CHECK((*engine)->max_model_len() > 0);

  troupe::GenerateRequest request;
  request.prompt = {1, 400, 401};
  request.params.temperature = 0.0f;
  request.params.max_tokens = 5;
  request.params.ignore_eos = true;
  std::mutex mutex;
  std::condition_variable done;
  int tokens = 0;
  troupe::FinishReason reason = troupe::FinishReason::none;
  auto id = (*engine)->submit(request, [&](const troupe::TokenEvent& e) {
    std::lock_guard lock(mutex);
    if (e.token != troupe::kNoToken) ++tokens;
    if (e.finished) {
      reason = e.finish_reason;
      done.notify_all();
    }
  });
  REQUIRE(id.has_value());
  std::unique_lock lock(mutex);
  REQUIRE(done.wait_for(lock, std::chrono::seconds(30),
                        [&] { return reason != troupe::FinishReason::none; }));
  CHECK(reason == troupe::FinishReason::length);
  CHECK(tokens == 5);
}
