// Pipeline parallelism on the command line (issue 34): `generate --pp P` prints the whole
// model's greedy text, `serve --pp 2` answers llama.cpp's greedy outputs, `bench forward
// --pp 2` finds the stages' logits to be the whole model's bits, and a pipeline that cannot
// cut the model is refused naming why (stories260K, started and ended by the test).
#include <catch2/catch.hpp>
#include <filesystem>
#include <regex>

#include "cluster/cluster_support.hpp"
#include "support/test_support.hpp"

using namespace std::chrono_literals;
using troupe::test::ChildProcess;

namespace {

// The exit code and whole output of `troupe <argv...>`.
std::pair<int, std::string> run(const std::vector<std::string>& args) {
  std::vector<std::string> argv{TROUPE_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  ChildProcess child(argv);
  const auto code = child.wait_exit(180s);
  INFO(child.output());
  REQUIRE(code.has_value());
  return {*code, child.output()};
}

// The text `generate` streamed: its output up to the statistics.
std::string generated(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"generate",
                                   "-m",
                                   troupe::test::shared_file("models/stories260K.gguf"),
                                   "-p",
                                   "Once upon a time",
                                   "-n",
                                   "48",
                                   "--ignore-eos",
                                   "--threads",
                                   "1"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto [code, out] = run(args);
  INFO(out);
  REQUIRE(code == 0);
  // The statistics go to stderr, unbuffered: they may come before stdout's last newline.
  const auto end = out.rfind("prompt: ");
  REQUIRE(end != std::string::npos);
  return out.substr(0, end);
}

}  // namespace

TEST_CASE("generate in pipeline stages prints the whole model's greedy text", "[app][pp]") {
  const std::string whole = generated({});
  REQUIRE(whole.size() > 20);
  CHECK(generated({"--pp", "2"}) == whole);
  CHECK(generated({"--pipeline-parallel-size", "3"}) == whole);
  CHECK(generated({"--pp", "2", "--pp-layer-partition", "1,4"}) == whole);
  // Each stage a tensor-parallel group of two ranks (four threads).
  CHECK(generated({"--pp", "2", "--tp", "2"}) == whole);
}

TEST_CASE("a pipeline that cannot cut the model is refused, saying why", "[app][pp]") {
  const std::string model = troupe::test::shared_file("models/stories260K.gguf");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--pp", "0"}, "--pipeline-parallel-size"},
      {{"--pp", "9"}, "5 layers cannot be cut into 9 stages"},
      {{"--pp", "2", "--pp-layer-partition", "2,2"}, "adds up to 4 layers, the model has 5"},
      {{"--pp", "2", "--pp-layer-partition", "1,x"}, "layer counts separated by commas"},
      {{"--pp", "3", "--pp-layer-partition", "1,4"}, "partition has 2 stages, the pipeline 3"},
      {{"--pp", "2", "--tp", "3"}, "cannot be split over 3 ranks"},
  };
  for (const auto& [flags, why] : cases) {
    std::vector<std::string> args = {"generate", "-m", model, "-p", "Hi", "-n", "2"};
    args.insert(args.end(), flags.begin(), flags.end());
    auto [code, out] = run(args);
    INFO(out);
    CHECK(code != 0);
    CHECK_THAT(out, Catch::Contains(why));
  }
}

TEST_CASE("serve with --pp 2 answers llama.cpp's greedy outputs", "[app][pp][shared]") {
  const auto cases =
      troupe::test::JsonParser(
          troupe::test::read_text(troupe::test::shared_file("golden/stories260K_greedy.json")))
          .parse();
  ChildProcess server({TROUPE_BINARY, "serve", "-m",
                       troupe::test::shared_file("models/stories260K.gguf"), "--port", "0", "--pp",
                       "2", "--threads", "1", "--kv-cache-gb", "0.02"});
  const auto port = server.wait_for(R"(serving '.*' at http://127\.0\.0\.1:(\d+))", 60s);
  REQUIRE(port.has_value());
  for (const auto& c : cases.array) {
    std::string ids;
    for (const int id : c["prompt_ids"].ints())
      ids += (ids.empty() ? "" : ",") + std::to_string(id);
    const std::string body =
        R"({"prompt":[)" + ids + R"(],"max_tokens":64,"temperature":0,"ignore_eos":true})";
    const auto reply = troupe::test::cluster::http(static_cast<std::uint16_t>(std::stoi(*port)),
                                                   "POST", "/v1/completions", body);
    REQUIRE(reply.status == 200);
    const auto json = troupe::test::JsonParser(reply.body).parse();
    CHECK(json["choices"].array[0]["text"].string == c["output_text"].string);
  }
}

TEST_CASE("bench forward --pp 2 finds the stages' logits to be the whole model's bits",
          "[app][pp][bench]") {
  auto [code, out] =
      run({"bench", "forward", "-m", troupe::test::shared_file("models/stories260K.gguf"), "--pp",
           "2", "--threads", "1", "--prompt-len", "32", "--gen-len", "4", "--batch", "1,2",
           "--repetitions", "1"});
  INFO(out);
  REQUIRE(code == 0);
  CHECK_THAT(out, Catch::Contains("2 pipeline stages (layers [0, 3) [3, 5))"));
  CHECK_THAT(out, Catch::Contains("prefill logits at context 0: bit for bit the whole model's"));
}

TEST_CASE("bench forward --pp 2 passes its default split to the other stages' processes",
          "[app][pp][bench]") {
  // The built-in model's head weighs as much as several layers: the split by weight (5 + 1)
  // is not the split by count (3 + 3), and every process must use the first.
  auto [code, out] = run({"bench", "forward", "--pp", "2", "--threads", "1", "--prompt-len", "16",
                          "--gen-len", "2", "--batch", "1", "--repetitions", "1"});
  INFO(out);
  REQUIRE(code == 0);
  CHECK_THAT(out, Catch::Contains("2 pipeline stages (layers [0, 5) [5, 6))"));
  CHECK_THAT(out, Catch::Contains("prefill logits at context 0: bit for bit the whole model's"));
}

TEST_CASE("bench forward --pp 2 --tp 2: stages of two ranks compute the split model's logits",
          "[app][pp][tp][bench]") {
  // Each stage's ranks add their sums in the order two unstaged ranks do: the prefill
  // logits' hash of the stages is that of the model split over two ranks alone.
  const auto split_hash = [](const std::vector<std::string>& flags) {
    const std::string json_path =
        troupe::test::temp_path("bench-forward-pp-tp-" + std::to_string(flags.size()) + ".json");
    std::vector<std::string> args = {"bench",
                                     "forward",
                                     "-m",
                                     troupe::test::shared_file("models/stories260K.gguf"),
                                     "--threads",
                                     "1",
                                     "--prompt-len",
                                     "32",
                                     "--gen-len",
                                     "4",
                                     "--batch",
                                     "1,2",
                                     "--repetitions",
                                     "1",
                                     "--output-json",
                                     json_path};
    args.insert(args.end(), flags.begin(), flags.end());
    auto [code, out] = run(args);
    INFO(out);
    REQUIRE(code == 0);
    if (flags.size() > 2) {
      CHECK_THAT(out, Catch::Contains("2 pipeline stages (layers [0, 3) [3, 5)) of 2 ranks"));
    }
    const auto json = troupe::test::JsonParser(troupe::test::read_text(json_path)).parse();
    std::filesystem::remove(json_path);
    return json["split"]["prefill_logits_hash"].string;
  };
  const std::string ranks = split_hash({"--tp", "2"});
  REQUIRE(ranks.size() == 16u);
  CHECK(split_hash({"--pp", "2", "--tp", "2"}) == ranks);
}
