// The `troupe` binary as a user runs it: output, errors and exit codes.
#include <sys/stat.h>
#include <sys/wait.h>

#include <array>
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cpu/int8_repack.hpp"
#include "golden/golden_support.hpp"
#include "support/shell.hpp"

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
  const test::ShellRun shell = test::run_shell(command);
  return {shell.exit_code, shell.output};
}

// A run that must end by itself: a troupe that waits on a FIFO or starts serving is
// ended after `seconds` (exit code 124) instead of holding the test.
Run run_bounded(const std::string& args, int seconds = 30) {
  return run_troupe(args, "", "exec timeout " + std::to_string(seconds) + " env ");
}

// What a refused start-up shows: an error naming `what`, and no model loaded.
void check_refused_at_once(const Run& run, const std::string& what) {
  INFO(run.out);
  CHECK(run.exit_code != 0);
  CHECK(run.exit_code != 124);  // it did not wait
  CHECK(run.out.find(what) != std::string::npos);
  CHECK(run.out.find("serving") == std::string::npos);
}

// The shares of the table that follows the line starting with `title`.
double shares_after(const std::string& out, const std::string& title) {
  std::istringstream lines(out.substr(out.find(title)));
  std::string line;
  std::getline(lines, line);  // the title
  std::getline(lines, line);  // the header
  double total = 0.0;
  while (std::getline(lines, line) && line.rfind("  ", 0) == 0 &&
         line.find('%') != std::string::npos && line.find("int8 matmuls") == std::string::npos) {
    std::istringstream fields(line);
    std::string word;
    // The op's name may have spaces; the share is the first field ending in '%'.
    while (fields >> word) {
      if (word.back() == '%') {
        total += std::stod(word.substr(0, word.size() - 1));
        break;
      }
    }
  }
  return total;
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

TEST_CASE("troupe generate --lora applies an adapter, and refuses one of another model",
          "[cli][lora][shared]") {
  const std::string model = test::shared_file("models/archs/llama.gguf");
  const std::string adapter = test::shared_file("models/lora/llama-attn-r8.gguf");
  const std::string args = "generate -m " + model + " -p 'Lily and Ben' -n 12 --ignore-eos -t 2";
  const std::string err = test::temp_path("generate-lora.err");
  const Run base = run_troupe(args, err);
  const Run adapted = run_troupe(args + " --lora " + adapter, err);
  REQUIRE(base.exit_code == 0);
  REQUIRE(adapted.exit_code == 0);
  CHECK(adapted.out != base.out);  // the adapter changes the first token on (golden/lora)
  CHECK(run_troupe(args + " --lora " + adapter, err).out == adapted.out);
  const Run wrong =
      run_troupe(args + " --lora " + test::shared_file("models/lora/qwen2-qv-r4.gguf"));
  CHECK(wrong.exit_code == 1);
  CHECK(wrong.out.find("the adapter is for architecture qwen2, the base model is llama") !=
        std::string::npos);
}

TEST_CASE("troupe generate runs the built-in model when given none", "[cli]") {
  const Run run = run_troupe("generate -p 'Hello world' -n 8 --ignore-eos");
  CHECK(run.exit_code == 0);
  CHECK(run.out.find("generation: 8 tokens") != std::string::npos);
}

TEST_CASE("make-model writes mixtures of experts (qwen3moe, Mixtral-style llama, olmoe) that serve",
          "[cli]") {
  for (const std::string arch : {"qwen3moe", "llama", "olmoe"}) {
    INFO(arch);
    const std::string path = test::temp_path("moe-" + arch + ".gguf");
    // olmoe has no grouped KV heads (llama.cpp loads its Q/K norms as [dim]).
    const std::string kv_heads = arch == "olmoe" ? "8" : "2";
    const Run made = run_troupe("make-model --out " + path + " --arch " + arch +
                                " --dim 256 --layers 2 --heads 8 --kv-heads " + kv_heads +
                                " --head-dim 32"
                                " --experts 8 --experts-used 2 --expert-ffn 256 --type q4_k_m"
                                " --vocab-size 512");
    REQUIRE(made.exit_code == 0);
    const Run run = run_troupe("generate -m " + path + " -p 'Hello world' -n 6 --ignore-eos");
    CHECK(run.exit_code == 0);
    CHECK(run.out.find("generation: 6 tokens") != std::string::npos);
    std::filesystem::remove(path);
  }
  const std::string bad = test::temp_path("moe-bad.gguf");
  const Run used = run_troupe("make-model --out " + bad +
                              " --arch qwen3moe --dim 64 --layers 1 --heads 2 --ffn 64"
                              " --experts 4 --experts-used 5 --expert-ffn 64");
  CHECK(used.exit_code == 1);
  CHECK(used.out.find("4 experts, 5 used") != std::string::npos);
  const Run none = run_troupe("make-model --out " + bad +
                              " --arch qwen3moe --dim 64 --layers 1 --heads 2 --ffn 64");
  CHECK(none.exit_code == 1);
  CHECK(none.out.find("qwen3moe and olmoe need them") != std::string::npos);
  CHECK(run_troupe("make-model --out " + bad + " --arch gpt2").exit_code == 1);
  const Run huge = run_troupe("make-model --out " + bad +
                              " --dim 64 --layers 1 --heads 2 --ffn 64 --vocab-size 2000000000");
  CHECK(huge.exit_code == 1);
  CHECK(huge.out.find("too large") != std::string::npos);
  const Run wide =
      run_troupe("make-model --out " + bad + " --dim 1048576 --layers 1 --heads 2 --ffn 1048576");
  CHECK(wide.exit_code == 1);
  CHECK(wide.out.find("2^32 values") != std::string::npos);
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
  SECTION("a scheduling policy that does not exist") {
    const Run run = run_troupe("serve --scheduling-policy fastest --port 0");
    CHECK(run.exit_code != 0);
    CHECK(run.out.find("--scheduling-policy") != std::string::npos);
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

TEST_CASE("a FIFO, a directory or a device is refused as a file troupe reads, at once", "[cli]") {
  const std::filesystem::path dir = test::temp_path("special-files");
  std::filesystem::create_directories(dir);
  const std::string fifo = (dir / "fifo").string();
  std::filesystem::remove(fifo);
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  SECTION("the model") {
    for (const std::string& path : {fifo, dir.string(), std::string("/dev/null")}) {
      INFO(path);
      const Run serve = run_bounded("serve --port 0 --model " + path);
      check_refused_at_once(serve, "'" + path + "' is not a regular file");
      CHECK(serve.exit_code == 1);
      check_refused_at_once(run_bounded("generate -p hi -m " + path),
                            "'" + path + "' is not a regular file");
    }
  }
  SECTION("the config file") {
    const Run from_fifo = run_bounded("serve --port 0 --config " + fifo);
    check_refused_at_once(from_fifo, "the config file " + fifo + " is not a regular file");
    CHECK(from_fifo.exit_code == 2);
    check_refused_at_once(run_bounded("serve --port 0 --config " + dir.string()),
                          "the config file " + dir.string() + " is a directory, not a file");
  }
  SECTION("the chat template and the cluster's TLS files") {
    check_refused_at_once(run_bounded("serve --port 0 --chat-template " + fifo),
                          "the chat template " + fifo + " is not a regular file");
    check_refused_at_once(run_bounded("serve --port 0 --cluster-port 0 --cluster-tls-cert " + fifo +
                                      " --cluster-tls-key " + fifo + " --cluster-tls-ca " + fifo),
                          "--cluster-tls-cert: '" + fifo + "' is not a regular file");
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("a number out of its flag's range, NaN or infinite is the flag's error, at once",
          "[cli]") {
  // Each once refused late (the KV cache of -9709 blocks), or taken as it came (NaN passes
  // a range check; a negative length meant the model's; a huge one overflowed).
  const std::vector<std::pair<std::string, std::string>> serve = {
      {"--kv-cache-gb", "-1"},
      {"--kv-cache-gb", "0"},
      {"--kv-cache-gb", "nan"},
      {"--kv-cache-gb", "inf"},
      {"--kv-cache-gb", "1e30"},
      {"--gpu-memory-utilization", "nan"},
      {"--gpu-memory-utilization", "1.5"},
      {"--max-model-len", "-1"},
      {"--max-model-len", "99999999999"},
      {"--block-size", "0"},
      {"--block-size", "-16"},
      {"--block-size", "1000000"},
      {"--max-num-seqs", "0"},
      {"--max-num-seqs", "-1"},
      {"--threads", "-1"},
      {"--data-parallel-size", "0"},
      {"--data-parallel-size", "100000"},
      {"--port", "-1"},
      {"--port", "70000"},
      {"--cluster-port", "70000"},
      {"--cluster-wait", "-1"},
      {"--step-timeout", "0"},
      {"--failover-timeout", "-1"},
      {"--failover-timeout", "nan"},
      {"--cluster-handshake-timeout", "nan"},
      {"--cluster-handshake-timeout", "0"},
      {"--collective-timeout", "nan"},
      {"--collective-timeout", "inf"},
      {"--target-itl-ms", "nan"},
      {"--log-stats-interval", "nan"},
      {"--log-stats-interval", "0"},
      {"--max-concurrent-requests", "-1"},
      {"--max-connections", "-1"},
      {"--max-buffered-output-bytes", "-1"},
      {"--max-buffered-output-bytes", "0"},
      {"--shutdown-timeout", "-1"},
      {"--shutdown-timeout", "x"}};
  for (const auto& [flag, value] : serve) {
    INFO(flag << " " << value);
    const std::string port = flag == "--port" ? "" : " --port 0";
    check_refused_at_once(run_bounded("serve" + port + " " + flag + " " + value), flag + ": ");
  }
  // The same flags on the other commands.
  check_refused_at_once(run_bounded("generate -p hi --kv-cache-gb -1"), "--kv-cache-gb: ");
  check_refused_at_once(run_bounded("generate -p hi --threads -2"), "--threads: ");
  check_refused_at_once(run_bounded("bench throughput --max-model-len -1"), "--max-model-len: ");
  check_refused_at_once(run_bounded("node --join 127.0.0.1:1 --kv-cache-gb -1"), "--kv-cache-gb: ");
  check_refused_at_once(run_bounded("node --join 127.0.0.1:1 --kv-cache-gb nan"),
                        "--kv-cache-gb: ");
}

TEST_CASE("names and other text flags are bounded, however large a config file gives them",
          "[cli]") {
  auto config = [](const std::string& name, const std::string& text) {
    const std::string path = test::temp_path(name);
    std::ofstream(path) << text;
    return path;
  };
  // Once a 50 MB name was taken, and copied into every answer and metric (3.5 GB RSS).
  check_refused_at_once(
      run_bounded("serve --port 0 --config " +
                  config("long-name.yaml", "served-model-name: " + std::string(300, 'n') + "\n")),
      "--served-model-name: at most 256 bytes, not 300");
  check_refused_at_once(run_bounded("serve --port 0 --config " +
                                    config("tab-name.yaml", "served-model-name: \"a\\tb\"\n")),
                        "--served-model-name: must not hold control characters");
  check_refused_at_once(run_bounded("serve --port 0 --served-model-name \"$(printf 'a\\377b')\""),
                        "--served-model-name: must be UTF-8 text");
  check_refused_at_once(
      run_bounded("serve --port 0 --config " +
                  config("long-key.yaml", "api-key: " + std::string(5000, 'k') + "\n")),
      "--api-key: at most 4096 bytes, not 5000");
  check_refused_at_once(run_bounded("node --join 127.0.0.1:1 --name " + std::string(300, 'n')),
                        "--name: at most 256 bytes, not 300");
}

TEST_CASE("bench forward --profile shows each op's share of a prefill and a decode step", "[cli]") {
  const std::string model = troupe::test::temp_path("profile-q8_0.gguf");
  const Run made = run_troupe("make-model --out " + model + " --type q8_0 --layers 2");
  INFO(made.out);
  REQUIRE(made.exit_code == 0);
  const Run run = run_troupe("bench forward -m " + model +
                             " --threads 1 --prompt-len 32 --gen-len 2 --batch 1,3 "
                             "--repetitions 1 --profile");
  INFO(run.out);
  REQUIRE(run.exit_code == 0);
  CHECK(run.out.find("profile: one prefill of 32 tokens") != std::string::npos);
  CHECK(run.out.find("profile: a decode step at batch 1") != std::string::npos);
  CHECK(run.out.find("profile: a decode step at batch 3") != std::string::npos);
  CHECK(run.out.find("attention") != std::string::npos);
  CHECK(run.out.find("rms_norm") != std::string::npos);
  // Q8_0 matrices go through the repacked kernel where this processor runs it.
  CHECK(run.out.find(troupe::cpu::repacked_kernel_available(troupe::gguf::TensorType::q8_0)
                         ? "matmul Q8_0 (repacked)"
                         : "matmul Q8_0") != std::string::npos);
  if (troupe::cpu::int8_peak_macs_per_second(0.01) > 0.0) {
    CHECK(run.out.find("of the processor's int8 peak") != std::string::npos);
  }
  // Each table's shares add up to its step (rounding: 0.1% a line).
  CHECK(shares_after(run.out, "profile: one prefill") == Approx(100.0).margin(1.0));
  CHECK(shares_after(run.out, "profile: a decode step at batch 3") == Approx(100.0).margin(1.0));
}
