// The `troupe` binary as a user runs it: output, errors and exit codes.
#include <sys/wait.h>
#include <array>
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "golden/golden_support.hpp"

using namespace troupe;

namespace {

struct Run {
  int exit_code = -1;
  std::string out;  // stdout and stderr together, or stdout alone
};

// Runs troupe with `args`; stderr goes to `err_path` when given, else it joins stdout.
// `shell_prefix` runs first in the same shell (e.g. "ulimit -n 256 && ").
Run run_troupe(const std::string& args, const std::string& err_path = "",
               const std::string& shell_prefix = "") {
  const std::string redirect = err_path.empty() ? " 2>&1" : " 2>" + err_path;
  const std::string cache = test::temp_path("cache");
  const std::string command = shell_prefix + "XDG_CACHE_HOME=" + cache + " " +
                              std::string(TROUPE_BINARY) + " " + args + redirect;
  Run run;
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::array<char, 4096> buffer{};
  while (std::size_t n = std::fread(buffer.data(), 1, buffer.size(), pipe))
    run.out.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

}  // namespace

TEST_CASE("troupe generate streams llama.cpp's greedy continuation of stories260K",
          "[cli][shared]") {
  const auto cases = test::golden_cases();
  const std::string model = test::shared_file("models/stories260K.gguf");
  const std::string err = test::temp_path("generate.err");
  for (const auto& c : cases.array) {
    if (c["prompt"].string.empty()) continue;  // the shell quoting test below covers odd prompts
    INFO(c["prompt"].string);
    const Run run = run_troupe(
        "generate -m " + model + " -p '" + c["prompt"].string + "' -n 64 --ignore-eos", err);
    CHECK(run.exit_code == 0);
    CHECK(run.out == c["output_text"].string + "\n");  // the continuation only, not the prompt
    const std::string stats = test::read_text(err);
    const auto num_prompt = std::to_string(c["prompt_ids"].array.size());
    CHECK(stats.find("prompt: " + num_prompt + " tokens") != std::string::npos);
    CHECK(stats.find("generation: 64 tokens") != std::string::npos);
  }
}

TEST_CASE("troupe generate runs the built-in model when given none", "[cli]") {
  const Run run = run_troupe("generate -p 'Hello world' -n 8 --ignore-eos");
  CHECK(run.exit_code == 0);
  CHECK(run.out.find("generation: 8 tokens") != std::string::npos);
}

TEST_CASE("bad input to troupe is a clear error and exit code 1, never a crash", "[cli]") {
  SECTION("a missing model file") {
    const Run run = run_troupe("generate -m /nonexistent.gguf -p hi");
    CHECK(run.exit_code == 1);
    CHECK(run.out.find("cannot open model file '/nonexistent.gguf'") != std::string::npos);
  }
  SECTION("a truncated model file") {
    const std::string path = test::temp_path("truncated.gguf");
    const Run made =
        run_troupe("make-model --out " + path + " --dim 64 --layers 1 --heads 2 --ffn 64");
    REQUIRE(made.exit_code == 0);
    std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
    const Run run = run_troupe("generate -m " + path + " -p hi");
    CHECK(run.exit_code == 1);
    CHECK(run.out.find("lies outside the file") != std::string::npos);
  }
  SECTION("a prompt longer than the context") {
    const std::string path = test::temp_path("short-context.gguf");
    REQUIRE(run_troupe("make-model --out " + path +
                       " --dim 64 --layers 1 --heads 2 --ffn 64 --context-length 16")
                .exit_code == 0);
    const Run run =
        run_troupe("generate -m " + path + " -p 'one two three four five six seven' -n 12");
    CHECK(run.exit_code == 1);
    CHECK(run.out.find("maximum context length is 16 tokens") != std::string::npos);
  }
  SECTION("bad sampling parameters") {
    const Run run = run_troupe("generate -p hi --top-p 1.5");
    CHECK(run.exit_code == 1);
    CHECK(run.out.find("top_p must be in (0, 1]") != std::string::npos);
  }
  SECTION("the GPU asked for where there is none (or no CUDA in the build)") {
    const Run run = run_troupe("generate -p hi -n 4 --device cuda");
    if (run.exit_code == 0) {
      CHECK(run.out.find("generation: 4 tokens") != std::string::npos);  // a GPU is here
    } else {
      CHECK(run.exit_code == 1);
      CHECK(run.out.find("CUDA") != std::string::npos);
    }
    CHECK(run_troupe("generate -p hi --device tpu").exit_code != 0);
  }
  SECTION("a token budget that is neither a number nor auto, or a target without auto") {
    const Run bad = run_troupe("generate -p hi --max-num-batched-tokens lots");
    CHECK(bad.exit_code != 0);
    CHECK(bad.out.find("expected a positive number of tokens or auto, not 'lots'") !=
          std::string::npos);
    CHECK(run_troupe("generate -p hi --max-num-batched-tokens 0").exit_code != 0);
    const Run target = run_troupe("generate -p hi --max-num-batched-tokens 64 --target-itl-ms 90");
    CHECK(target.exit_code != 0);
    CHECK(target.out.find("applies only with --max-num-batched-tokens auto") != std::string::npos);
    CHECK(run_troupe("generate -p hi --target-itl-ms -5").exit_code != 0);
  }
  SECTION("an unknown subcommand") {
    CHECK(run_troupe("fly").exit_code != 0);
  }
}

TEST_CASE("troupe bench throughput reports vLLM's metrics as JSON", "[cli]") {
  const std::string json = test::temp_path("throughput.json");
  const Run run = run_troupe(
      "bench throughput --dataset-name shared-prefix --num-prompts 8 --prefix-len 32 "
      "--input-len 8 --output-len 4 --max-num-seqs 4 --kv-cache-gb 0.05 --output-json " +
      json);
  REQUIRE(run.exit_code == 0);
  CHECK(run.out.find("Completed / failed requests:         8 / 0") != std::string::npos);
  // The CPU's default: a budget chosen from a step timed at load.
  CHECK(run.out.find("Token budget:                        auto, ") != std::string::npos);
  CHECK(run.out.find("measured") != std::string::npos);
  const auto result = test::JsonParser(test::read_text(json)).parse();
  CHECK(result["completed"].number == 8);
  CHECK(result["total_output_tokens"].number == 32);
  for (const char* key :
       {"request_throughput", "output_throughput", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
        "median_itl_ms", "p99_e2el_ms", "mean_batch_size"}) {
    INFO(key);
    CHECK(result[key].number > 0);
  }
  CHECK(result["peak_kv_usage"].number > 0);
  CHECK(result["peak_kv_usage"].number <= 1);
  CHECK(result["prefix_cache_hit_rate"].number > 0.5);  // 7 of 8 find the system prompt cached
  CHECK(run_troupe("bench throughput --dataset-name bogus").exit_code == 1);
}

TEST_CASE("troupe bench throughput holds every output to a JSON schema or a grammar", "[cli]") {
  const std::string json = test::temp_path("structured.json");
  const std::string schema = std::string(TROUPE_SOURCE_DIR) + "/bench/schemas/record.json";
  const std::string run_args =
      "bench throughput --num-prompts 4 --input-len 8 --output-len 16 --max-num-seqs 4 "
      "--kv-cache-gb 0.05 --output-json " +
      json;
  SECTION("a schema: named in the results, its outputs counted") {
    const Run run = run_troupe(run_args + " --json-schema " + schema);
    REQUIRE(run.exit_code == 0);
    CHECK(run.out.find("Output constraint:                   json-schema " + schema) !=
          std::string::npos);
    CHECK(run.out.find("Mean output length (tokens):") != std::string::npos);
    const auto result = test::JsonParser(test::read_text(json)).parse();
    CHECK(result["constraint"].string == "json-schema " + schema);
    CHECK(result["completed"].number == 4);
    CHECK(result["failed"].number == 0);
    CHECK(result["total_output_tokens"].number > 0);
    CHECK(result["mean_output_len"].number > 0);
    CHECK(result["mean_output_len"].number <= 16);
    CHECK(result["output_throughput"].number > 0);
  }
  SECTION("a grammar whose end comes first: its outputs end there and still complete") {
    const std::string gbnf = test::temp_path("yes-no.gbnf");
    std::ofstream(gbnf) << "root ::= \"yes\" | \"no\"\n";
    const Run run = run_troupe(run_args + " --grammar " + gbnf);
    REQUIRE(run.exit_code == 0);
    const auto result = test::JsonParser(test::read_text(json)).parse();
    CHECK(result["constraint"].string == "grammar " + gbnf);
    CHECK(result["completed"].number == 4);
    CHECK(result["num_grammar_ends"].number == 4);
    CHECK(result["mean_output_len"].number < 16);
  }
  SECTION("both at once, or a schema that is not JSON, are refused") {
    const Run both = run_troupe(run_args + " --json-schema " + schema + " --grammar " + schema);
    CHECK(both.exit_code != 0);
    CHECK(both.out.find("excludes") != std::string::npos);
    const std::string not_json = test::temp_path("not-a-schema.json");
    std::ofstream(not_json) << "{ type: object";
    const Run bad = run_troupe(run_args + " --json-schema " + not_json);
    CHECK(bad.exit_code != 0);
    CHECK(bad.out.find("not JSON") != std::string::npos);
  }
}

TEST_CASE("troupe serve refuses a --max-connections its descriptor limit cannot hold", "[cli]") {
  // `ulimit -n` sets the hard limit too, so troupe cannot raise it.
  const Run run = run_troupe("serve --port 0 --max-connections 1024", "", "ulimit -n 256 && ");
  CHECK(run.exit_code == 1);
  CHECK(run.out.find("--max-connections 1024 needs about 1088 file descriptors") !=
        std::string::npos);
  CHECK(run.out.find("256") != std::string::npos);
  CHECK(run.out.find("loading") == std::string::npos);  // refused before the model loads
}
