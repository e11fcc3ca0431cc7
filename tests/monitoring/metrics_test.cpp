// The exposition as vLLM's users read it: every troupe_ series labelled with the model's
// name, the request-length histograms on vLLM's 1-2-5 buckets, the process_* metrics of
// the Prometheus client libraries, and promtool's lint.
#include <sys/wait.h>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <sstream>
#include <string>

#include "monitoring/metrics.hpp"
#include "support/test_support.hpp"

using namespace troupe;

namespace {

// Each sample line's series (name and labels) and value.
std::map<std::string, double> samples(const std::string& exposition) {
  std::map<std::string, double> values;
  std::istringstream lines(exposition);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto space = line.rfind(' ');
    values[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return values;
}

// One call of each recording method, so that every family has a series.
void record_everything(monitoring::Metrics& metrics) {
  metrics.set_lora_adapters({"sql-lora"});
  monitoring::Metrics::Iteration iteration;
  iteration.seconds = 0.01;
  iteration.num_tokens = 8;
  iteration.num_prompt_tokens = 7;
  iteration.num_generated = 1;
  iteration.num_running = 1;
  iteration.num_kv_blocks = 10;
  iteration.kv_usage = 0.1;
  iteration.running_by_adapter = {0, 1};
  metrics.record_iteration(iteration);
  metrics.observe_queue_time(0.001);
  metrics.set_replica_up(0, true);
  metrics.record_replica_loss(0, 1);
  metrics.record_node_join(1);
  metrics.set_replica_count(1, 1, -1);  // elastic, auto: no cap (+Inf)
  metrics.set_replica_count(2, 1, -1);
  metrics.observe_request("stop", 1.0, 0.1, 0.01, true);
  metrics.observe_request_tokens(7, 3);
  metrics.observe_inter_token(0.01);
  metrics.observe_phases(0.05, 0.5);
  metrics.count_http("/v1/completions", 200);
  metrics.set_server_state(1, 1, 5);
  metrics.count_connection_error("slow_reader");
  metrics.count_accept_error();
}

}  // namespace

TEST_CASE("every troupe_ series carries the model_name label", "[monitoring]") {
  monitoring::Metrics metrics("llama-3.2-1b");
  record_everything(metrics);
  const auto values = samples(metrics.serialize());
  int num_series = 0;
  for (const auto& [series, value] : values) {
    if (series.rfind("troupe_", 0) != 0) continue;
    INFO(series);
    CHECK(series.find(R"({model_name="llama-3.2-1b")") != std::string::npos);
    ++num_series;
  }
  CHECK(num_series > 100);  // histograms count a series per bucket
  // The other labels stay, after the model's.
  CHECK(
      values.at(
          R"(troupe_http_requests_total{model_name="llama-3.2-1b",route="/v1/completions",status="200"})") ==
      1);
  CHECK(values.at(
            R"(troupe_request_success_total{model_name="llama-3.2-1b",finish_reason="stop"})") ==
        1);
  CHECK(values.at(R"(troupe_replica_up{model_name="llama-3.2-1b",replica="0"})") == 1);
  CHECK(values.at(R"(troupe_prompt_tokens_total{model_name="llama-3.2-1b"})") == 7);
}

TEST_CASE("the model name is \"troupe\" unless given, and any text is escaped", "[monitoring]") {
  CHECK(samples(monitoring::Metrics().serialize())
            .count(R"(troupe_num_requests_running{model_name="troupe"})") == 1);
  // A served name is the user's text: a quote or a backslash must not break the format.
  const auto values = samples(monitoring::Metrics(R"(my "best" \model)").serialize());
  CHECK(values.count(R"(troupe_num_requests_running{model_name="my \"best\" \\model"})") == 1);
}

TEST_CASE("request prompt and generation tokens fall in vLLM's 1-2-5 buckets", "[monitoring]") {
  monitoring::Metrics metrics("m");
  metrics.observe_request_tokens(7, 0);
  metrics.observe_request_tokens(1, 100);
  metrics.observe_request_tokens(1000000, 3);
  metrics.observe_request_tokens(2000000, 1);  // past the last bound: +Inf only
  metrics.observe_request_tokens(-1, -5);      // a caller's slip: not observed
  const auto values = samples(metrics.serialize());
  const auto bucket = [&](const std::string& name, const std::string& le) {
    return values.at(name + R"(_bucket{model_name="m",le=")" + le + R"("})");
  };
  const std::string prompt = "troupe_request_prompt_tokens";
  const std::string generation = "troupe_request_generation_tokens";
  // Cumulative counts at each bound: prompts 1, 7, 1e6, 2e6; generations 0, 100, 3, 1.
  const std::map<std::string, std::pair<double, double>> expected = {
      {"1", {1, 2}},      {"2", {1, 2}},      {"5", {1, 3}},       {"10", {2, 3}},
      {"20", {2, 3}},     {"50", {2, 3}},     {"100", {2, 4}},     {"200", {2, 4}},
      {"500", {2, 4}},    {"1000", {2, 4}},   {"2000", {2, 4}},    {"5000", {2, 4}},
      {"10000", {2, 4}},  {"20000", {2, 4}},  {"50000", {2, 4}},   {"100000", {2, 4}},
      {"200000", {2, 4}}, {"500000", {2, 4}}, {"1000000", {3, 4}}, {"+Inf", {4, 4}}};
  for (const auto& [le, counts] : expected) {
    INFO("le=" << le);
    CHECK(bucket(prompt, le) == counts.first);
    CHECK(bucket(generation, le) == counts.second);
  }
  // Exactly these bounds: 19 and +Inf.
  int num_buckets = 0;
  for (const auto& [series, value] : values)
    num_buckets += series.rfind(prompt + "_bucket", 0) == 0;
  CHECK(num_buckets == 20);
  CHECK(values.at(prompt + R"(_count{model_name="m"})") == 4);
  CHECK(values.at(prompt + R"(_sum{model_name="m"})") == 3000008);
  CHECK(values.at(generation + R"(_sum{model_name="m"})") == 104);
}

TEST_CASE("process_* metrics as the Prometheus client libraries export them", "[monitoring]") {
  const std::string exposition = monitoring::Metrics("m").serialize();
  const auto values = samples(exposition);
  for (const char* name : {"process_cpu_seconds_total", "process_resident_memory_bytes",
                           "process_virtual_memory_bytes", "process_open_fds", "process_max_fds",
                           "process_start_time_seconds"}) {
    INFO(name);
    // Unlabelled: the standard names, selected by job and instance as everywhere else.
    REQUIRE(values.count(name) == 1);
  }
  CHECK(exposition.find("# TYPE process_cpu_seconds_total counter\n") != std::string::npos);
  CHECK(exposition.find("# TYPE process_resident_memory_bytes gauge\n") != std::string::npos);
  CHECK(values.at("process_resident_memory_bytes") > 0);
  CHECK(values.at("process_open_fds") >= 3);
  CHECK(values.at("process_max_fds") >= values.at("process_open_fds"));
  CHECK(values.at("process_cpu_seconds_total") >= 0);
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const double start = values.at("process_start_time_seconds");
  CHECK(start <= now + 1);  // + 1: /proc/stat's boot time is in whole seconds
  CHECK(start > now - 24 * 3600);
}

TEST_CASE("the exposition passes promtool check metrics", "[monitoring]") {
  if (std::system("command -v promtool > /dev/null 2>&1") != 0) {
    test::skip_test("promtool is absent (Debian's prometheus package; scripts/setup.sh)");
  }
  monitoring::Metrics metrics("llama-3.2-1b");
  record_everything(metrics);
  const std::string file = test::temp_path("metrics.txt");
  std::FILE* f = std::fopen(file.c_str(), "wb");
  REQUIRE(f != nullptr);
  const std::string exposition = metrics.serialize();
  std::fwrite(exposition.data(), 1, exposition.size(), f);
  std::fclose(f);
  const int status =
      std::system(("promtool check metrics < " + file + " > " + file + ".out 2>&1").c_str());
  INFO(test::read_text(file + ".out"));
  CHECK(WEXITSTATUS(status) == 0);
  std::remove(file.c_str());
  std::remove((file + ".out").c_str());
}

TEST_CASE("labelled series a dashboard or an alert reads start at 0, before their first event",
          "[monitoring]") {
  // As vLLM's: "no data" in a panel or an alert's rate() until a first loss or a first
  // aborted request is a blind spot; 0 is what happened.
  monitoring::Metrics metrics("m", 3);
  auto values = samples(metrics.serialize());
  for (const char* reason : {"stop", "length", "abort", "timeout", "error"}) {
    INFO(reason);
    CHECK(values.at(std::string(R"(troupe_request_success_total{model_name="m",finish_reason=")") +
                    reason + R"("})") == 0);
  }
  for (const std::string_view reason : monitoring::Metrics::kConnectionErrorReasons) {
    INFO(reason);
    CHECK(values.at(R"(troupe_http_connection_errors_total{model_name="m",reason=")" +
                    std::string(reason) + R"("})") == 0);
  }
  for (const char* replica : {"0", "1", "2"}) {
    INFO("replica " << replica);
    const std::string label = std::string(R"({model_name="m",replica=")") + replica + R"("})";
    CHECK(values.at("troupe_replica_losses_total" + label) == 0);
    CHECK(values.at("troupe_replica_up" + label) == 0);  // down until its scheduler says up
    CHECK(values.at("troupe_replica_num_requests_running" + label) == 0);
    CHECK(values.at("troupe_replica_num_requests_waiting" + label) == 0);
    CHECK(values.at("troupe_replica_kv_cache_usage_ratio" + label) == 0);
  }
  CHECK(values.count(R"(troupe_replica_up{model_name="m",replica="3"})") == 0);
  // The first events count from there.
  metrics.record_replica_loss(1, 0);
  metrics.observe_request("abort", 1.0, 0.0, 0.0, false);
  metrics.count_connection_error("slow_reader");
  values = samples(metrics.serialize());
  CHECK(values.at(R"(troupe_replica_losses_total{model_name="m",replica="1"})") == 1);
  CHECK(values.at(R"(troupe_replica_losses_total{model_name="m",replica="0"})") == 0);
  CHECK(values.at(R"(troupe_request_success_total{model_name="m",finish_reason="abort"})") == 1);
  CHECK(values.at(R"(troupe_request_success_total{model_name="m",finish_reason="stop"})") == 0);
  CHECK(values.at(R"(troupe_http_connection_errors_total{model_name="m",reason="slow_reader"})") ==
        1);
}

TEST_CASE("speculative decoding's counters are vLLM's spec_decode counters, per position too",
          "[monitoring]") {
  monitoring::Metrics metrics("m");
  monitoring::Metrics::Iteration it;
  it.num_kv_blocks = 10;
  it.spec_drafts_total = 3;
  it.spec_draft_tokens_total = 12;
  it.spec_accepted_tokens_total = 7;
  it.spec_accepted_per_pos_total = {3, 2, 2};
  metrics.record_iteration(it);
  // The replica's totals grow: the counters move by what is new.
  it.spec_drafts_total = 4;
  it.spec_draft_tokens_total = 16;
  it.spec_accepted_tokens_total = 8;
  it.spec_accepted_per_pos_total = {4, 2, 2, 0};
  metrics.record_iteration(it);
  const auto values = samples(metrics.serialize());
  CHECK(values.at("troupe_spec_decode_num_drafts_total{model_name=\"m\"}") == 4);
  CHECK(values.at("troupe_spec_decode_num_draft_tokens_total{model_name=\"m\"}") == 16);
  CHECK(values.at("troupe_spec_decode_num_accepted_tokens_total{model_name=\"m\"}") == 8);
  CHECK(values.at("troupe_spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\",position="
                  "\"0\"}") == 4);
  CHECK(values.at("troupe_spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\",position="
                  "\"2\"}") == 2);
}

TEST_CASE("LoRA adapters' running and waiting requests are summed over replicas",
          "[monitoring][lora]") {
  monitoring::Metrics metrics("base", 2);
  CHECK(metrics.serialize().find("troupe_lora_requests") == std::string::npos);
  metrics.set_lora_adapters({"a", "b"});
  const auto series = [](const std::string& which, const std::string& name) {
    return "troupe_lora_requests_" + which + R"({model_name="base",lora_name=")" + name + R"("})";
  };
  auto values = samples(metrics.serialize());
  CHECK(values.at(series("running", "a")) == 0);
  CHECK(values.at(series("waiting", "b")) == 0);
  monitoring::Metrics::Iteration it;
  it.replica = 0;
  it.running_by_adapter = {3, 2, 1};  // slot 0 is the base model's: not an adapter series
  it.waiting_by_adapter = {0, 1};
  metrics.record_iteration(it);
  it.replica = 1;
  it.running_by_adapter = {0, 4};
  it.waiting_by_adapter = {};
  metrics.record_iteration(it);
  values = samples(metrics.serialize());
  CHECK(values.at(series("running", "a")) == 6);
  CHECK(values.at(series("running", "b")) == 1);
  CHECK(values.at(series("waiting", "a")) == 1);
  CHECK(values.at(series("waiting", "b")) == 0);
  it.running_by_adapter = {};  // replica 1 drained
  metrics.record_iteration(it);
  values = samples(metrics.serialize());
  CHECK(values.at(series("running", "a")) == 2);
}

TEST_CASE("the replica count, its range, and the replicas added and removed", "[monitoring]") {
  monitoring::Metrics metrics("m", 2);
  auto values = samples(metrics.serialize());
  // A fixed count until told otherwise.
  CHECK(values.at(R"(troupe_data_parallel_replicas{model_name="m"})") == 2);
  CHECK(values.at(R"(troupe_data_parallel_replicas_min{model_name="m"})") == 2);
  CHECK(values.at(R"(troupe_data_parallel_replicas_max{model_name="m"})") == 2);
  metrics.set_replica_count(2, 1, 3);  // the elastic head's first word: nothing added
  metrics.set_replica_count(3, 1, 3);
  metrics.replica_left(1);
  metrics.set_replica_count(2, 1, 3);
  metrics.set_replica_count(1, 1, 3);
  values = samples(metrics.serialize());
  CHECK(values.at(R"(troupe_data_parallel_replicas{model_name="m"})") == 1);
  CHECK(values.at(R"(troupe_data_parallel_replicas_min{model_name="m"})") == 1);
  CHECK(values.at(R"(troupe_data_parallel_replicas_max{model_name="m"})") == 3);
  CHECK(values.at(R"(troupe_data_parallel_replicas_added_total{model_name="m"})") == 1);
  CHECK(values.at(R"(troupe_data_parallel_replicas_removed_total{model_name="m"})") == 2);
  CHECK(values.at(R"(troupe_replica_up{model_name="m",replica="1"})") == 0);
  metrics.set_replica_count(1, 1, -1);
  values = samples(metrics.serialize());
  CHECK(values.at(R"(troupe_data_parallel_replicas_max{model_name="m"})") ==
        std::numeric_limits<double>::infinity());
}
