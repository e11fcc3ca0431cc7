// --data-parallel-size (issue 31, elastic data parallelism): a number, a range MIN:MAX or
// auto, read by parse_data_parallel_size; `troupe serve` refuses a bad value, and a range
// or auto without a cluster port, at start-up with a clear error.
#include <catch2/catch.hpp>

#include "app/data_parallel_option.hpp"
#include "support/child_process.hpp"
#include "troupe/config.hpp"

using namespace std::chrono_literals;
using troupe::EngineConfig;
using troupe::app::parse_data_parallel_size;

TEST_CASE("the data-parallel size reads as a number, a range or auto", "[app][elastic]") {
  auto fixed = parse_data_parallel_size("3");
  REQUIRE(fixed.has_value());
  CHECK(fixed->min == 3);
  CHECK(fixed->max == 0);  // fixed: a spare node stays a standby
  auto range = parse_data_parallel_size("2:8");
  REQUIRE(range.has_value());
  CHECK(range->min == 2);
  CHECK(range->max == 8);
  auto same = parse_data_parallel_size("2:2");
  REQUIRE(same.has_value());
  CHECK(same->max == 2);
  auto automatic = parse_data_parallel_size("auto");
  REQUIRE(automatic.has_value());
  CHECK(automatic->min == 1);
  CHECK(automatic->max == EngineConfig::kUnboundedReplicas);
  CHECK(parse_data_parallel_size("1024").has_value());
}

TEST_CASE("a bad data-parallel size says what is wrong with it", "[app][elastic]") {
  const auto error_of = [](std::string_view text) {
    auto parsed = parse_data_parallel_size(text);
    REQUIRE_FALSE(parsed.has_value());
    return parsed.error().message;
  };
  CHECK(error_of("3:2") == "the range 3:2 has its minimum 3 above its maximum 2");
  CHECK_THAT(error_of("0"), Catch::Contains("must be in [1, 1024], not 0"));
  CHECK_THAT(error_of("0:4"), Catch::Contains("the range's minimum must be in [1, 1024]"));
  CHECK_THAT(error_of("x"), Catch::Contains("'x' is not a whole number") &&
                                Catch::Contains("a range MIN:MAX such as 2:8, or auto"));
  CHECK_THAT(error_of("2:"), Catch::Contains("the range's maximum '' is not a whole number"));
  CHECK_THAT(error_of(":3"), Catch::Contains("the range's minimum '' is not a whole number"));
  CHECK_THAT(error_of("1:2:3"), Catch::Contains("the range's maximum '2:3' is not a whole number"));
  CHECK_THAT(error_of("-1"), Catch::Contains("not -1"));
  CHECK_THAT(error_of("2048"), Catch::Contains("not 2048"));
  CHECK_THAT(error_of("99999999999"), Catch::Contains("must be in [1, 1024]"));
  CHECK_THAT(error_of("AUTO"), Catch::Contains("is not a whole number"));
  CHECK_THAT(error_of(""), Catch::Contains("is not a whole number"));
  CHECK_THAT(error_of(std::string(100, '1')), Catch::Contains("not a value of 100 bytes"));
}

namespace {

// `troupe serve` with `args`: its exit code and output (it must end by itself).
std::pair<int, std::string> serve(const std::vector<std::string>& args) {
  std::vector<std::string> argv{TROUPE_BINARY, "serve", "--port", "0"};
  argv.insert(argv.end(), args.begin(), args.end());
  troupe::test::ChildProcess child(argv);
  const auto code = child.wait_exit(60s);
  INFO(child.output());
  REQUIRE(code.has_value());
  return {*code, child.output()};
}

}  // namespace

TEST_CASE("serve refuses a bad data-parallel size, and a range without a cluster port",
          "[app][elastic]") {
  for (const auto& [value, says] : std::vector<std::pair<std::string, std::string>>{
           {"3:2", "the range 3:2 has its minimum 3 above its maximum 2"},
           {"0", "must be in [1, 1024], not 0"},
           {"x", "'x' is not a whole number"}}) {
    INFO("--dp " << value);
    const auto [code, output] = serve({"--dp", value});
    CHECK(code != 0);
    CHECK_THAT(output, Catch::Contains(says));
  }
  for (const std::string value : {"auto", "1:3"}) {
    INFO("--dp " << value);
    const auto [code, output] = serve({"--data-parallel-size", value});
    CHECK(code != 0);
    CHECK_THAT(output, Catch::Contains("--data-parallel-size " + value + " needs --cluster-port"));
  }
}
