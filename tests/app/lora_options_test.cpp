// `troupe serve --lora-modules`, `--max-loras`, `--max-lora-rank` (issue 33): bad input is
// a clear start-up error naming the adapter, never a crash; a good set of adapters serves
// (the llama base of ../shared/models/archs and its adapters in ../shared/models/lora).
#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>

#include "support/child_process.hpp"
#include "support/shell.hpp"
#include "support/test_support.hpp"

using namespace std::chrono_literals;
using troupe::test::ChildProcess;

namespace {

std::string base() {
  return troupe::test::shared_file("models/archs/llama.gguf");
}
std::string adapter(const std::string& name) {
  return troupe::test::shared_file("models/lora/" + name + ".gguf");
}

// The whole output of a serve that must refuse its flags before it serves.
std::string refused(const std::vector<std::string>& flags) {
  std::vector<std::string> argv{TROUPE_BINARY, "serve", base(), "--port", "0", "--threads", "1"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  ChildProcess serve(argv);
  const auto code = serve.wait_exit(60s);
  INFO(serve.output());
  REQUIRE(code.has_value());
  CHECK(*code == 1);
  return serve.output();
}

bool says(const std::string& output, const std::string& what) {
  INFO(output);
  return output.find(what) != std::string::npos;
}

}  // namespace

TEST_CASE("bad --lora-modules input is a clear start-up error", "[app][lora]") {
  const std::string r8 = adapter("llama-attn-r8"), r16 = adapter("llama-all-r16");
  CHECK(says(refused({"--lora-modules", "a=/no/such.gguf"}), "adapter 'a': no file /no/such.gguf"));
  CHECK(says(refused({"--lora-modules", "no-path"}), "'no-path' is neither name=path nor a JSON"));
  CHECK(says(refused({"--lora-modules", "=" + r8}), "needs a name and a path"));
  CHECK(says(refused({"--max-loras", "2", "--lora-modules", "a=" + r8, "a=" + r16}),
             "the name 'a' is given twice"));
  CHECK(says(refused({"--lora-modules", base() + "=" + r8}), "is the served model's"));
  CHECK(says(refused({"--lora-modules", "a=" + r8, "b=" + r16}),
             "2 adapters, more than --max-loras 1"));
  CHECK(says(refused({"--lora-modules", "a=" + r16, "--max-lora-rank", "8"}),
             "adapter 'a' has rank 16, more than --max-lora-rank 8"));
  CHECK(says(refused({"--lora-modules", "a=" + base()}), "is not a LoRA adapter GGUF"));
  // An adapter of another architecture: the worker's check against the model.
  CHECK(says(refused({"--lora-modules", "a=" + adapter("qwen2-qv-r4")}),
             "the adapter is for architecture qwen2, the base model is llama"));
  // A truncated adapter file.
  const std::string cut = troupe::test::temp_path("lora-cut.gguf");
  {
    std::ifstream in(r8, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  }
  CHECK(says(refused({"--lora-modules", "a=" + cut}), "adapter 'a' (" + cut + ")"));
  // vLLM's JSON form, checked the same way.
  CHECK(says(refused({"--lora-modules",
                      R"({"name": "a", "path": ")" + r8 + R"(", "base_model_name": "other"})"}),
             "base_model_name 'other' is not the served model"));
  CHECK(says(refused({"--lora-modules", R"({"name": "a", "path": 5})"}), "path must be a string"));
  CHECK(says(refused({"--lora-modules", R"({"name": "a")"}), "is not a JSON object"));
}

TEST_CASE("a server with adapters in both forms serves and lists them",
          "[app][lora][integration]") {
  ChildProcess serve({TROUPE_BINARY, "serve", base(), "--port", "0", "--threads", "1",
                      "--served-model-name", "base", "--max-loras", "2", "--lora-modules",
                      "attn=" + adapter("llama-attn-r8"),
                      R"({"name": "all", "path": ")" + adapter("llama-all-r16") +
                          R"(", "base_model_name": "base"})"});
  const auto port = serve.wait_for(R"(serving '.*' at http://127\.0\.0\.1:(\d+))", 60s);
  INFO(serve.output());
  REQUIRE(port.has_value());
  const std::string models =
      troupe::test::run_shell("curl -s http://127.0.0.1:" + *port + "/v1/models").output;
  INFO(models);
  CHECK(says(models, R"("id":"attn","object":"model")"));
  CHECK(says(models, R"("root":")" + adapter("llama-all-r16") + R"(","parent":"base")"));
}

namespace {

// POST `body` to `path` of a server on `port`: the answer's body and status.
std::string post(const std::string& port, const std::string& path, const std::string& body) {
  const std::string command =
      "curl -s -w ' %{http_code}' -H 'Content-Type: application/json' -d '" + body +
      "' http://127.0.0.1:" + port + path;
  return troupe::test::run_shell(command).output;
}

}  // namespace

TEST_CASE("the flag --enable-runtime-lora-updating, or vLLM's variable, turns on the load route",
          "[app][lora][integration]") {
  const std::string load =
      R"({"lora_name": "rt", "lora_path": ")" + adapter("llama-attn-r8") + R"("})";
  for (const bool by_flag : {true, false}) {
    INFO((by_flag ? "the flag" : "VLLM_ALLOW_RUNTIME_LORA_UPDATING"));
    std::vector<std::string> argv{TROUPE_BINARY, "serve",     base(), "--port",
                                  "0",           "--threads", "1",    "--served-model-name",
                                  "base"};
    if (by_flag) {
      argv.push_back("--enable-runtime-lora-updating");
    } else {
      ::setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", " True", 1);  // as vLLM reads it
    }
    ChildProcess serve(argv);
    ::unsetenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING");
    const auto port = serve.wait_for(R"(serving '.*' at http://127\.0\.0\.1:(\d+))", 60s);
    INFO(serve.output());
    REQUIRE(port.has_value());
    CHECK(says(post(*port, "/v1/load_lora_adapter", load),
               "Success: LoRA adapter 'rt' added successfully. 200"));
    // --max-loras 1 (the default): the one slot is taken.
    CHECK(says(post(*port, "/v1/load_lora_adapter",
                    R"({"lora_name": "rt2", "lora_path": ")" + adapter("llama-attn-r8") + R"("})"),
               "no free LoRA adapter slot"));
    CHECK(says(post(*port, "/v1/unload_lora_adapter", R"({"lora_name": "rt"})"),
               "Success: LoRA adapter 'rt' removed successfully. 200"));
  }
  // Off, the routes say how to turn them on: tests/net/lora_runtime_test.cpp.
}
