// The log's lines as text and as JSON, its levels, and the engine's periodic line.
#include <catch2/catch.hpp>
#include <limits>

#include "monitoring/log.hpp"
#include "monitoring/stats_logger.hpp"

using namespace troupe;
using namespace troupe::monitoring;

TEST_CASE("a text line is the level, the message and key=value fields", "[monitoring][log]") {
  const LogField fields[] = {
      {"route", "/v1/completions"}, {"status", 200},     {"ttft_ms", 12.5}, {"client_gone", false},
      {"finish_reason", nullptr},   {"client", "a b\"c"}};
  CHECK(render_log_body(LogFormat::text, LogLevel::info, "request", fields) ==
        "INFO    request route=/v1/completions status=200 ttft_ms=12.5 client_gone=false "
        "finish_reason=- client=\"a b\\\"c\"");
  CHECK(render_log_body(LogFormat::text, LogLevel::warning, "w", {}) == "WARNING w");
}

TEST_CASE("a JSON line is one object whatever the fields hold", "[monitoring][log]") {
  // A client's path with a newline, a quote and bytes that are not UTF-8 cannot break it.
  const std::string path = "/v1/\n\"x\"\xff\xc3\xa9";
  const LogField fields[] = {{"path", path},
                             {"status", 404},
                             {"total_ms", std::numeric_limits<double>::infinity()},
                             {"ttft_ms", nullptr},
                             {"ok", true}};
  const std::string body = render_log_body(LogFormat::json, LogLevel::error, "request", fields);
  CHECK(body ==
        "\"level\":\"error\",\"message\":\"request\",\"path\":\"/v1/\\n\\\"x\\\"\\ufffd\xc3\xa9\","
        "\"status\":404,\"total_ms\":null,\"ttft_ms\":null,\"ok\":true");
}

TEST_CASE("log levels read as vLLM's names, in any case", "[monitoring][log]") {
  CHECK(parse_log_level("DEBUG") == LogLevel::debug);
  CHECK(parse_log_level("info") == LogLevel::info);
  CHECK(parse_log_level("Warning") == LogLevel::warning);
  CHECK(parse_log_level("warn") == LogLevel::warning);
  CHECK(parse_log_level("error") == LogLevel::error);
  CHECK(parse_log_level("off") == LogLevel::off);
  CHECK_FALSE(parse_log_level("verbose"));
  CHECK(parse_log_format("json") == LogFormat::json);
  CHECK_FALSE(parse_log_format("yaml"));
}

TEST_CASE("a level lets through itself and what is more severe", "[monitoring][log]") {
  configure_logging(LogLevel::warning, LogFormat::text);
  CHECK_FALSE(log_enabled(LogLevel::debug));
  CHECK_FALSE(log_enabled(LogLevel::info));
  CHECK(log_enabled(LogLevel::warning));
  CHECK(log_enabled(LogLevel::error));
  configure_logging(LogLevel::off, LogFormat::json);
  CHECK_FALSE(log_enabled(LogLevel::error));
  configure_logging(LogLevel::info, LogFormat::text);
  CHECK(log_enabled(LogLevel::info));
  flush_logging();
}

TEST_CASE("the engine's line carries speculative decoding's acceptance rate in the window",
          "[monitoring][log]") {
  EngineStats before;
  before.spec_num_drafts = 10;
  before.spec_num_draft_tokens = 40;
  before.spec_num_accepted_tokens = 20;
  EngineStats now = before;
  now.num_generated_tokens = 90;
  now.spec_num_drafts = 30;
  now.spec_num_draft_tokens = 120;
  now.spec_num_accepted_tokens = 80;
  const StatsWindow w = stats_window(before, now, 1.0);
  REQUIRE(w.spec_acceptance_rate);
  CHECK(*w.spec_acceptance_rate == Approx(60.0 / 80.0));
  CHECK(w.spec_mean_acceptance_length == Approx(1.0 + 60.0 / 20.0));
  // No drafts in a window: no rate.
  CHECK_FALSE(stats_window(now, now, 1.0).spec_acceptance_rate);
}

TEST_CASE("the engine's line is the window's throughput, load and hit rate", "[monitoring][log]") {
  EngineStats before;
  before.num_prompt_tokens = 100;
  before.num_generated_tokens = 50;
  before.prefix_queried_tokens = 1000;
  before.prefix_hit_tokens = 100;
  before.num_preemptions = 2;
  EngineStats now = before;
  now.num_prompt_tokens = 600;
  now.num_generated_tokens = 250;
  now.prefix_queried_tokens = 1400;
  now.prefix_hit_tokens = 400;
  now.num_preemptions = 5;
  now.num_running = 3;
  now.num_waiting = 1;
  now.kv_usage = 0.25;
  const StatsWindow w = stats_window(before, now, 2.0);
  CHECK(w.prompt_tokens_per_second == Approx(250.0));
  CHECK(w.generation_tokens_per_second == Approx(100.0));
  CHECK(w.num_running == 3);
  CHECK(w.num_waiting == 1);
  CHECK(w.kv_usage == Approx(0.25));
  REQUIRE(w.prefix_cache_hit_rate);
  CHECK(*w.prefix_cache_hit_rate == Approx(0.75));
  CHECK(w.num_preemptions == 3);
  CHECK(w.busy);

  SECTION("an idle engine writes nothing, and no lookup gives no rate") {
    const StatsWindow idle = stats_window(
        now,
        [&] {
          EngineStats s = now;
          s.num_running = 0;
          s.num_waiting = 0;
          return s;
        }(),
        10.0);
    CHECK_FALSE(idle.busy);
    CHECK_FALSE(idle.prefix_cache_hit_rate);
    CHECK(idle.num_preemptions == 0);
  }
}
