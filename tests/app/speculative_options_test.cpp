// `--speculative-config` on the command line (issue 36): every command that takes it refuses
// a bad value naming the field, a draft model with another vocabulary is refused naming
// both, `generate` prints the same text with and without n-gram or draft-model proposals,
// and a server with either exports vLLM's spec-decode counters (stories260K, started and
// ended by the test).
#include <catch2/catch.hpp>
#include <cstdio>
#include <regex>

#include "support/child_process.hpp"
#include "support/shell.hpp"
#include "support/test_support.hpp"

using namespace std::chrono_literals;
using troupe::test::ChildProcess;

namespace {

// The exit code and whole output of `troupe <argv...>`.
std::pair<int, std::string> run(const std::vector<std::string>& args) {
  std::vector<std::string> argv{TROUPE_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  ChildProcess child(argv);
  const auto code = child.wait_exit(120s);
  INFO(child.output());
  REQUIRE(code.has_value());
  return {*code, child.output()};
}

std::string curl(const std::string& args) {
  return troupe::test::run_shell("curl -s --max-time 60 " + args + " 2>&1").output;
}

const char* const kNgram =
    R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1})";

}  // namespace

TEST_CASE("a bad --speculative-config is refused naming the field, by every command that takes it",
          "[app][speculative]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{bad", "not valid JSON"},
      {"[1, 2]", "must be a JSON object"},
      {R"({"num_speculative_tokens": 3})", "method is required"},
      {R"({"method": "eagle", "num_speculative_tokens": 3})", "method must be \"ngram\""},
      {R"({"method": "ngram"})", "num_speculative_tokens is required"},
      {R"({"method": "ngram", "num_speculative_tokens": 0})", "num_speculative_tokens must be in"},
      {R"({"method": "ngram", "num_speculative_tokens": 2.5})",
       "num_speculative_tokens must be an integer"},
      {R"({"method": "ngram", "num_speculative_tokens": "3"})",
       "num_speculative_tokens must be an integer"},
      {R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 0})",
       "prompt_lookup_max must be in"},
      {R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 4, "prompt_lookup_max": 2})",
       "prompt_lookup_min (4) must not exceed prompt_lookup_max (2)"},
      {R"({"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": 0})",
       "disable_by_batch_size must be in"},
      {R"({"method": "ngram", "num_speculative_tokens": 3, "typo": 1})", "unknown field \"typo\""},
      {R"({"model": "draft.gguf", "method": "ngram", "num_speculative_tokens": 3})",
       "method \"ngram\" does not take a model"},
      {R"({"method": "draft_model", "num_speculative_tokens": 3})",
       "method draft_model needs a \"model\""},
      {R"({"model": "draft.gguf", "num_speculative_tokens": 3, "draft_num_threads": 0})",
       "draft_num_threads must be in [1, 1024], not 0"},
      {R"({"method": "ngram", "num_speculative_tokens": 3, "draft_num_threads": 2})",
       "draft_num_threads is for a draft model"},
      {R"({"model": "draft.gguf"})", "num_speculative_tokens is required with a draft model"},
      {R"({"model": 7, "num_speculative_tokens": 3})", "model must be the draft model's file path"},
      {R"({"model": "draft.gguf", "num_speculative_tokens": 3, "prompt_lookup_max": 2})",
       "prompt_lookup_max is for method \"ngram\""},
  };
  const std::vector<std::vector<std::string>> commands = {{"serve", "--port", "0"},
                                                          {"generate", "-n", "2"},
                                                          {"bench", "throughput"},
                                                          {"bench", "forward"}};
  for (const auto& command : commands) {
    for (const auto& [json, message] : cases) {
      INFO(command.front() << " " << json);
      auto args = command;
      args.push_back("--speculative-config");
      args.push_back(json);
      const auto [code, output] = run(args);
      CHECK(code != 0);
      CHECK(output.find("--speculative-config: " + message) != std::string::npos);
    }
  }
}

// The model as its own draft: stories260K is the only small model in ../shared with its
// vocabulary.
std::string own_draft(const std::string& model, int threads = 0) {
  return R"({"model": ")" + model + R"(", "num_speculative_tokens": 3)" +
         (threads > 0 ? R"(, "draft_num_threads": )" + std::to_string(threads) : "") + "}";
}

TEST_CASE("generate prints the same greedy text with and without speculation",
          "[app][speculative]") {
  const std::string model = troupe::test::shared_file("models/stories260K.gguf");
  const std::vector<std::string> base = {
      "generate", "-m", model, "-p", "Once upon a time", "-n", "100", "--ignore-eos", "-t", "1"};
  // n-gram lookup, a draft model on the model's pool, a draft model on a pool of its own
  const int proposer = GENERATE(0, 1, 2);
  INFO((proposer == 0   ? "n-gram lookup"
        : proposer == 1 ? "a draft model"
                        : "a draft model on 2 threads of its own"));
  auto with = base;
  with.push_back("--speculative-config");
  with.push_back(proposer == 0 ? std::string(kNgram) : own_draft(model, proposer == 2 ? 2 : 0));
  const auto plain = run(base);
  const auto spec = run(with);
  REQUIRE(plain.first == 0);
  REQUIRE(spec.first == 0);
  // The text (stdout and stderr together): everything before the timing line.
  auto text = [](const std::string& out) { return out.substr(0, out.rfind("prompt: ")); };
  CHECK(text(spec.second) == text(plain.second));
  CHECK(text(plain.second).size() > 100);
}

TEST_CASE("a draft model with another vocabulary is refused at start-up, naming both sizes",
          "[app][speculative]") {
  const std::string model = troupe::test::shared_file("models/stories260K.gguf");
  const std::string other = troupe::test::shared_file("models/rand15M-f16.gguf");
  const auto [code, output] = run({"generate", "-m", model, "-p", "Once", "-n", "4", "-t", "1",
                                   "--speculative-config", own_draft(other)});
  CHECK(code != 0);
  CHECK(output.find("the draft model " + other + " has a vocabulary of 32000 tokens, the model " +
                    "512: a draft must share the model's vocabulary") != std::string::npos);
  const auto missing = run({"generate", "-m", model, "-p", "Once", "-n", "4", "-t", "1",
                            "--speculative-config", own_draft("/nonexistent/draft.gguf")});
  CHECK(missing.first != 0);
  CHECK(missing.second.find("/nonexistent/draft.gguf") != std::string::npos);
}

TEST_CASE("a server with speculation exports vLLM's spec-decode counters",
          "[app][speculative][integration]") {
  const std::string model = troupe::test::shared_file("models/stories260K.gguf");
  const bool draft = GENERATE(false, true);
  INFO((draft ? "a draft model" : "n-gram lookup"));
  ChildProcess serve({TROUPE_BINARY, "serve", "--model", model, "--port", "0", "--threads", "1",
                      "--kv-cache-gb", "0.02", "--speculative-config",
                      draft ? own_draft(model) : std::string(kNgram)});
  const auto port = serve.wait_for(R"(serving '.*' at http://127\.0\.0\.1:(\d+))", 60s);
  INFO(serve.output());
  REQUIRE(port);
  const std::string url = "http://127.0.0.1:" + *port;
  const std::string answer = curl(
      url + "/v1/completions -H 'Content-Type: application/json'" +
      R"( -d '{"prompt": "Once upon a time", "max_tokens": 100, "temperature": 0, "ignore_eos": true}')");
  CHECK(answer.find("\"completion_tokens\":100") != std::string::npos);
  const std::string metrics = curl(url + "/metrics");
  auto value = [&](const std::string& name, const std::string& label = "") {
    std::smatch m;
    const std::regex line(name + R"(\{[^}]*)" + label + R"([^}]*\} ([0-9.e+]+))");
    return std::regex_search(metrics, m, line) ? std::stod(m[1]) : -1.0;
  };
  const double drafts = value("troupe_spec_decode_num_drafts_total");
  const double proposed = value("troupe_spec_decode_num_draft_tokens_total");
  const double accepted = value("troupe_spec_decode_num_accepted_tokens_total");
  INFO(metrics);
  CHECK(drafts > 0);
  CHECK(proposed >= drafts);
  CHECK(accepted > 0);
  CHECK(accepted <= proposed);
  // Accepted at the first position: every accepted draft has its first token accepted.
  CHECK(value("troupe_spec_decode_num_accepted_tokens_per_pos_total", R"(position="0")") > 0);
}
