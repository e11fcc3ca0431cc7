// `troupe serve --target-tpot-ms`: refused where it cannot apply, said at start-up where it
// does (stories260K, started and ended by the test).
#include <catch2/catch.hpp>

#include "support/child_process.hpp"
#include "support/test_support.hpp"

using namespace std::chrono_literals;
using troupe::test::ChildProcess;

namespace {

// The whole output of a serve that must refuse its flags before it loads anything.
std::string refused(const std::vector<std::string>& flags) {
  std::vector<std::string> argv{TROUPE_BINARY, "serve", "--port", "0"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  ChildProcess serve(argv);
  const auto code = serve.wait_exit(30s);
  INFO(serve.output());
  REQUIRE(code.has_value());
  CHECK(*code != 0);
  return serve.output();
}

}  // namespace

TEST_CASE("a TPOT objective is refused without the auto budget, beside an ITL target, or unsound",
          "[app][slo]") {
  CHECK(refused({"--max-num-batched-tokens", "64", "--target-tpot-ms", "250"})
            .find("applies only with --max-num-batched-tokens auto") != std::string::npos);
  CHECK(refused({"--target-itl-ms", "100", "--target-tpot-ms", "250"})
            .find("leave --target-itl-ms out") != std::string::npos);
  for (const char* bad : {"0", "-5", "nan", "inf", "fast"}) {
    INFO(bad);
    CHECK(refused({"--target-tpot-ms", bad}).find("--target-tpot-ms") != std::string::npos);
  }
}

TEST_CASE("a server with a TPOT objective says so and serves", "[app][slo][integration]") {
  const std::string model = troupe::test::shared_file("models/stories260K.gguf");
  ChildProcess serve({TROUPE_BINARY, "serve", "--model", model, "--port", "0", "--threads", "1",
                      "--kv-cache-gb", "0.02", "--max-num-batched-tokens", "auto",
                      "--target-tpot-ms", "250"});
  const auto line = serve.wait_for(R"(serving '.*' at http://127\.0\.0\.1:\d+)", 60s);
  INFO(serve.output());
  REQUIRE(line.has_value());
  CHECK(serve.output().find("the running streams' slack under a TPOT of 250 ms") !=
        std::string::npos);
}
