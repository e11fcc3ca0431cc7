// `troupe bench serve` against a real `troupe serve` of stories260K (a 512-token vocabulary):
// the client learns the model, its vocabulary and its context from the server, completes every
// request, and prints vLLM's summary with the totals the workload implies. Both processes are
// started and ended by each test.
#include <boost/json.hpp>
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>

#include "support/child_process.hpp"
#include "support/test_support.hpp"

using namespace std::chrono_literals;
using troupe::test::ChildProcess;

namespace {

struct Server {
  ChildProcess process;
  std::string model_name;
  std::string port;
};

// `troupe serve` of stories260K on a free port, with a key, once it says where it serves.
std::unique_ptr<Server> start_server() {
  const std::string model = troupe::test::shared_file("models/stories260K.gguf");
  auto server = std::unique_ptr<Server>(
      new Server{ChildProcess({TROUPE_BINARY, "serve", "--model", model, "--port", "0", "--threads",
                               "1", "--kv-cache-gb", "0.02", "--api-key", "sk-bench"}),
                 "", ""});
  const auto line = server->process.wait_for(R"(serving '.*' at http://127\.0\.0\.1:\d+)", 60s);
  INFO(server->process.output());
  REQUIRE(line.has_value());
  server->model_name = *server->process.wait_for(R"(serving '(.*)' at)", 1s);
  server->port = *server->process.wait_for(R"(serving '.*' at http://127\.0\.0\.1:(\d+))", 1s);
  return server;
}

// The client's whole output (stdout and stderr) and its exit code.
std::pair<int, std::string> run_bench(const std::vector<std::string>& args) {
  std::vector<std::string> argv{TROUPE_BINARY, "bench", "serve"};
  argv.insert(argv.end(), args.begin(), args.end());
  ChildProcess client(argv);
  const auto code = client.wait_exit(180s);
  INFO(client.output());
  REQUIRE(code.has_value());
  return {*code, client.output()};
}

bool has_line(const std::string& output, const std::string& label, const std::string& value) {
  // vLLM's "{:<40} {:<10}": the label padded to 40 columns, a space, the value.
  char line[128];
  std::snprintf(line, sizeof line, "\n%-40s %-10s\n", label.c_str(), value.c_str());
  return output.find(line) != std::string::npos;
}

}  // namespace

TEST_CASE("bench serve completes every request on stories260K and prints vLLM's summary",
          "[bench][integration]") {
  const auto server = start_server();
  const auto json_path = std::filesystem::temp_directory_path() /
                         ("troupe-bench-serve-" + std::to_string(::getpid()) + ".json");
  const auto [code, output] =
      run_bench({"--port", server->port, "--api-key", "sk-bench", "--num-prompts", "6",
                 "--random-input-len", "24", "--random-output-len", "10", "--max-concurrency", "3",
                 "--seed", "1", "--output-json", json_path.string()});
  INFO(output);
  CHECK(code == 0);
  CHECK(output.find("============ Serving Benchmark Result ============\n") != std::string::npos);
  CHECK(has_line(output, "Successful requests:", "6"));
  CHECK(has_line(output, "Failed requests:", "0"));
  CHECK(has_line(output, "Maximum request concurrency:", "3"));
  CHECK(has_line(output, "Total input tokens:", "144"));  // 6 prompts of 24 token ids
  // ignore_eos is sent, as vLLM's client does for the random dataset: every request runs to
  // its max_tokens.
  CHECK(has_line(output, "Total generated tokens:", "60"));
  for (const char* label : {"Benchmark duration (s):", "Request throughput (req/s):",
                            "Output token throughput (tok/s):", "Total Token throughput (tok/s):",
                            "Mean TTFT (ms):", "P99 TPOT (ms):", "Median ITL (ms):"}) {
    CHECK(output.find(std::string("\n") + label) != std::string::npos);
  }
  // Not a terminal: the progress is a line per tenth, the last one at 100%.
  CHECK(output.find("troupe bench serve: 100% (6/6 requests") != std::string::npos);

  const auto json = boost::json::parse(troupe::test::read_text(json_path.string())).as_object();
  std::filesystem::remove(json_path);
  CHECK(json.at("model_id").as_string() == server->model_name);
  CHECK(json.at("completed").to_number<int>() == 6);
  CHECK(json.at("failed").to_number<int>() == 0);
  CHECK(json.at("total_input_tokens").to_number<int>() == 144);
  CHECK(json.at("total_output_tokens").to_number<int>() == 60);
  CHECK(json.at("total_token_throughput").to_number<double>() > 0.0);
}

TEST_CASE("bench serve refuses lengths past the server's context before sending a request",
          "[bench][integration]") {
  const auto server = start_server();
  const auto [code, output] =
      run_bench({"--port", server->port, "--api-key", "sk-bench", "--num-prompts", "2",
                 "--random-input-len", "4000", "--random-output-len", "8"});
  INFO(output);
  CHECK(code == 1);
  CHECK(output.find("exceeds the server's max_model_len") != std::string::npos);
  CHECK(output.find("Serving Benchmark Result") == std::string::npos);
}

TEST_CASE("bench serve names the served model or refuses another", "[bench][integration]") {
  const auto server = start_server();
  const auto [code, output] =
      run_bench({"--port", server->port, "--api-key", "sk-bench", "--model", "no-such-model",
                 "--num-prompts", "1", "--random-input-len", "4", "--random-output-len", "2"});
  INFO(output);
  CHECK(code == 1);
  CHECK(output.find("the server does not serve 'no-such-model' (it serves '" + server->model_name +
                    "')") != std::string::npos);
}

TEST_CASE("bench serve with gamma arrivals reports the goodput of the objectives given",
          "[bench][integration]") {
  const auto server = start_server();
  const auto json_path = std::filesystem::temp_directory_path() /
                         ("troupe-bench-goodput-" + std::to_string(::getpid()) + ".json");
  // Objectives every request meets (ten minutes), and one that none can (a TTFT of 0 ms).
  const auto [code, output] = run_bench({"--port",
                                         server->port,
                                         "--api-key",
                                         "sk-bench",
                                         "--num-prompts",
                                         "6",
                                         "--random-input-len",
                                         "16",
                                         "--random-output-len",
                                         "6",
                                         "--request-rate",
                                         "40",
                                         "--burstiness",
                                         "0.5",
                                         "--seed",
                                         "3",
                                         "--goodput",
                                         "ttft:600000",
                                         "tpot:600000",
                                         "e2el:600000",
                                         "--percentile-metrics",
                                         "ttft,e2el",
                                         "--metric-percentiles",
                                         "50,90",
                                         "--output-json",
                                         json_path.string()});
  INFO(output);
  CHECK(code == 0);
  CHECK(has_line(output, "Successful requests:", "6"));
  CHECK(has_line(output, "Request rate configured (RPS):", "40.00"));
  CHECK(output.find("\nRequest goodput (req/s):") != std::string::npos);
  for (const char* label :
       {"P50 TTFT (ms):", "P90 TTFT (ms):", "Mean E2EL (ms):", "P90 E2EL (ms):"}) {
    CHECK(output.find(std::string("\n") + label) != std::string::npos);
  }
  CHECK(output.find("Time per Output Token") == std::string::npos);  // not asked for
  const auto json = boost::json::parse(troupe::test::read_text(json_path.string())).as_object();
  std::filesystem::remove(json_path);
  CHECK(json.at("good_completed").to_number<int>() == 6);
  CHECK(json.at("request_goodput").to_number<double>() ==
        Approx(json.at("request_throughput").to_number<double>()));
  CHECK(json.at("burstiness").to_number<double>() == 0.5);
  CHECK(json.contains("p90_e2el_ms"));

  const auto [none_code, none] =
      run_bench({"--port", server->port, "--api-key", "sk-bench", "--num-prompts", "2",
                 "--random-input-len", "8", "--random-output-len", "2", "--goodput", "ttft:0"});
  INFO(none);
  CHECK(none_code == 0);
  CHECK(has_line(none, "Request goodput (req/s):", "0.00"));
}

TEST_CASE("bench serve refuses bad objectives, percentiles and burstiness before it runs",
          "[bench][integration]") {
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"--goodput", "itl:5"},
                                              {"--goodput", "ttft:-3"},
                                              {"--percentile-metrics", "ttft,p99"},
                                              {"--metric-percentiles", "0"},
                                              {"--burstiness", "0"},
                                              {"--request-rate", "-2"},
                                              {"--request-rate", "3x"}}) {
    std::vector<std::string> args{"--port", "1", "--num-prompts", "1"};
    args.insert(args.end(), bad.begin(), bad.end());
    const auto [code, output] = run_bench(args);
    INFO(bad[0] << " " << bad[1] << ": " << output);
    CHECK(code != 0);
    CHECK(output.find(bad[0]) != std::string::npos);
    CHECK(output.find("cannot reach") == std::string::npos);  // refused before asking
  }
}
