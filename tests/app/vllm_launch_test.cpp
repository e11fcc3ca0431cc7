// `troupe serve` started as a vLLM user starts `vllm serve`: the positional model, named
// by its path; vLLM's flags accepted, each that has no effect here named at start-up; the
// last of a repeated flag winning; and a --help a person can read.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <regex>
#include <sstream>
#include <string>

#include "support/child_process.hpp"
#include "support/shell.hpp"
#include "support/test_support.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

// What a shell command prints (stdout and stderr) and its exit code.
std::pair<int, std::string> shell(const std::string& command) {
  const test::ShellRun run = test::run_shell(command + " 2>&1");
  return {run.exit_code, run.output};
}

std::string troupe_run(const std::string& args, int* exit_code = nullptr) {
  // Refused flags end at once; a bound in case one did not.
  auto [code, out] = shell("timeout 60 " + std::string(TROUPE_BINARY) + " " + args);
  if (exit_code != nullptr) *exit_code = code;
  return out;
}

std::string curl(const std::string& args) {
  return shell("curl -s -i --max-time 30 " + args).second;
}

}  // namespace

TEST_CASE("troupe serve takes vLLM's launch line and serves the model by its path",
          "[app][serve][vllm]") {
  const std::string model = test::shared_file("models/stories260K.gguf");
  // --port given twice: the last wins, as vLLM's argparse takes it.
  test::ChildProcess server({TROUPE_BINARY,
                             "serve",
                             model,
                             "--port",
                             "8000",
                             "--port",
                             "0",
                             "--enable-auto-tool-choice",
                             "--tool-call-parser",
                             "hermes",
                             "--disable-log-requests",
                             "--generation-config",
                             "auto",
                             "--dtype",
                             "auto",
                             "--enable-chunked-prefill",
                             "--uvicorn-log-level",
                             "info",
                             "--max-logprobs",
                             "5",
                             "--threads",
                             "1",
                             "--kv-cache-gb",
                             "0.02"});
  const auto port = server.wait_for(R"(serving '(?:[^']*)' at http://127\.0\.0\.1:(\d+))", 60s);
  REQUIRE(port);
  CHECK(*port != "8000");
  const std::string url = "http://127.0.0.1:" + *port;
  const std::string json = " -H 'Content-Type: application/json'";

  // The model's id is its path, as vLLM names it; a client sends that back.
  CHECK_THAT(curl(url + "/v1/models"), Catch::Contains("\"id\":\"" + model + "\""));
  CHECK_THAT(curl(url + "/v1/completions" + json + " -d '{\"model\": \"" + model +
                  "\", \"prompt\": \"Once\", \"max_tokens\": 2}'"),
             Catch::Contains("HTTP/1.1 200"));
  CHECK_THAT(curl(url + "/v1/completions" + json +
                  R"( -d '{"model": "troupe", "prompt": "Once", "max_tokens": 2}')"),
             Catch::Contains("HTTP/1.1 404"));
  // --max-logprobs bounds what a request may ask for.
  CHECK_THAT(curl(url + "/v1/completions" + json +
                  R"( -d '{"prompt": "Once", "max_tokens": 2, "logprobs": 6}')"),
             Catch::Contains("HTTP/1.1 400") && Catch::Contains("[0, 5]"));
  CHECK_THAT(curl(url + "/v1/completions" + json +
                  R"( -d '{"prompt": "Once", "max_tokens": 2, "logprobs": 5}')"),
             Catch::Contains("HTTP/1.1 200"));

  server.kill(SIGTERM);
  REQUIRE(server.wait_exit(30s) == 0);
  // Each flag without effect is named once, with why; the implemented ones are not.
  const std::string log = server.output();
  for (const std::string flag :
       {"--enable-auto-tool-choice has no effect here", "--disable-log-requests has no effect here",
        "--generation-config auto has no effect here", "--dtype auto has no effect here",
        "--enable-chunked-prefill has no effect here",
        "--uvicorn-log-level info has no effect here"}) {
    INFO(flag);
    CHECK(log.find(flag) != std::string::npos);
    CHECK(log.find(flag) == log.rfind(flag));
  }
  CHECK_THAT(log, !Catch::Contains("--max-logprobs") && !Catch::Contains("--tool-call-parser"));
  // vLLM's start-up lines: the model, its memory in GiB, and how many whole contexts fit.
  CHECK(std::regex_search(
      log, std::regex(R"(model: llama, [0-9.]+K parameters, weights mostly F32; weights [0-9.]+ )"
                      R"(GiB, KV cache [0-9.]+ GiB; maximum concurrency for 128 tokens per )"
                      R"(request: [0-9.]+x)")));
}

TEST_CASE("the last of a repeated flag wins, as argparse takes it", "[app][cli][vllm]") {
  int code = -1;
  const std::string out = troupe_run("generate -p 'Hello world' -n 3 -n 5 --ignore-eos", &code);
  INFO(out);
  CHECK(code == 0);
  CHECK_THAT(out, Catch::Contains("generation: 5 tokens"));
  CHECK_THAT(out, !Catch::Contains("At Most 1"));
}

TEST_CASE("what vLLM's flags ask that cannot be honoured is refused at once, naming the flag",
          "[app][cli][vllm]") {
  int code = -1;
  // A pipeline of no stage.
  std::string out = troupe_run("serve --port 0 --pipeline-parallel-size 0", &code);
  INFO(out);
  CHECK(code != 0);
  CHECK_THAT(out, Catch::Contains("--pipeline-parallel-size"));
  CHECK_THAT(out, !Catch::Contains("serving"));
  out = troupe_run("serve --port 0 --dtype float64", &code);
  CHECK(code != 0);
  CHECK_THAT(out, Catch::Contains("--dtype"));
  CHECK_THAT(out, !Catch::Contains("serving"));
  // A path that cannot be a name in the API needs --served-model-name.
  out = troupe_run("serve --port 0 /nonexistent/" + std::string(300, 'm') + ".gguf", &code);
  CHECK(code != 0);
  CHECK_THAT(out, Catch::Contains("--served-model-name"));
  CHECK_THAT(out, !Catch::Contains("loading"));
}

TEST_CASE("every command's --help shows each flag's type and default once, the default in range",
          "[app][cli]") {
  for (const std::string command : {"serve", "generate", "node", "make-model", "bench throughput",
                                    "bench serve", "bench forward"}) {
    int code = -1;
    const std::string help = troupe_run(command + " --help", &code);
    INFO(command << "\n" << help);
    CHECK(code == 0);
    // CLI11's raw renderings: a type and then its check's type, a default flag's spec.
    for (const std::string odd : {"{false}", "{true}", ":INT", ":UINT", ":FLOAT", ":TEXT",
                                  "N|auto:N|auto", ":{", "POSITIVE", "=["}) {
      INFO(odd);
      CHECK(help.find(odd) == std::string::npos);
    }
    // CLI11's own "TYPE=default" beside the one at the end of the description.
    CHECK(!std::regex_search(
        help, std::regex(R"((INT|FLOAT|TEXT|PATH|DIR|FILE|SECONDS|auto|f32|cuda|off|json|priority|)"
                         R"(round-robin|mistral)=)")));
    // "--flag TYPE in [lo, hi] ... (default: x)": x once, and within [lo, hi].
    std::string whole;  // one flag's lines, joined
    std::string flattened;
    std::istringstream lines(help);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("  -", 0) == 0) flattened += "\n";
      flattened += line + " ";
    }
    const std::regex option(
        R"(in ([\[(])(-?[0-9.e+]+), (-?[0-9.e+]+)\][^\n]*\(default: (-?[0-9.e+]+)\))");
    int checked = 0;
    for (std::istringstream in(flattened); std::getline(in, whole);) {
      const auto first = whole.find("(default:");
      if (first != std::string::npos) {
        INFO(whole);
        CHECK(whole.find("(default:", first + 1) == std::string::npos);
      }
      std::smatch m;
      if (!std::regex_search(whole, m, option)) continue;
      INFO(whole);
      const double lo = std::stod(m[2].str());
      const double hi = std::stod(m[3].str());
      const double given = std::stod(m[4].str());
      CHECK((m[1].str() == "(" ? given > lo : given >= lo));
      CHECK(given <= hi);
      ++checked;
    }
    if (command == "serve") {
      CHECK(checked > 10);
      for (const std::string group :
           {"Model:", "Server:", "Scheduler:", "KV cache:", "Device and parallelism:", "Cluster:",
            "Logging:", "vLLM's flags without effect here"}) {
        CHECK_THAT(help, Catch::Contains("\n" + group));
      }
    }
  }
}

TEST_CASE(
    "X-Request-Id is the request's id in the log and comes back, and a refusal's line "
    "says why",
    "[app][serve][vllm][log]") {
  const std::string model = test::shared_file("models/stories260K.gguf");
  test::ChildProcess server({TROUPE_BINARY, "serve", model, "--port", "0", "--log-format", "json",
                             "--disable-log-stats", "--threads", "1", "--kv-cache-gb", "0.02"});
  const auto port = server.wait_for(R"(serving '(?:[^']*)' at http://127\.0\.0\.1:(\d+))", 60s);
  REQUIRE(port);
  const std::string url = "http://127.0.0.1:" + *port;
  const std::string json = " -H 'Content-Type: application/json'";
  const std::string completion = R"( -d '{"prompt": "Once", "max_tokens": 2}')";

  // Echoed on a generation, streamed or not, and on any other route's answer.
  CHECK_THAT(curl(url + "/v1/completions -H 'X-Request-Id: trace-7f3a'" + json + completion),
             Catch::Contains("HTTP/1.1 200") && Catch::Contains("X-Request-Id: trace-7f3a"));
  CHECK_THAT(curl(url + "/v1/completions -H 'X-Request-Id: trace-stream'" + json +
                  R"( -d '{"prompt": "Once", "max_tokens": 2, "stream": true}')"),
             Catch::Contains("X-Request-Id: trace-stream"));
  CHECK_THAT(curl(url + "/v1/models -H 'X-Request-Id: trace-models'"),
             Catch::Contains("X-Request-Id: trace-models"));
  // Without one, a generation's own id comes back.
  CHECK_THAT(curl(url + "/v1/completions" + json + completion),
             Catch::Contains("X-Request-Id: cmpl-"));
  // Refusals keep the id, and their lines say why.
  CHECK_THAT(curl(url + "/v1/completions -H 'X-Request-Id: trace-bad'" + json +
                  R"( -d '{"prompt": "Once", "max_tokens": 2, "frobnicate": 1}')"),
             Catch::Contains("HTTP/1.1 400") && Catch::Contains("X-Request-Id: trace-bad"));
  CHECK_THAT(curl(url + "/v1/nowhere"), Catch::Contains("HTTP/1.1 404"));
  // An id that cannot go into a header or a log line is the client's error.
  CHECK_THAT(curl(url + "/v1/models -H 'X-Request-Id: " + std::string(300, 'x') + "'"),
             Catch::Contains("HTTP/1.1 400") && Catch::Contains("X-Request-Id"));

  CHECK(
      server.wait_for(R"("path":"/v1/completions","status":200,"request_id":"trace-7f3a",)", 10s));
  CHECK(server.wait_for(R"("path":"/v1/completions","status":200,"request_id":"trace-stream",)",
                        10s));
  CHECK(server.wait_for(R"("status":400,"request_id":"trace-bad",[^\n]*"error":"Unrecognized )"
                        R"(request argument supplied: frobnicate)",
                        10s));
  CHECK(server.wait_for(R"("path":"/v1/nowhere","status":404,[^\n]*"error":"no route /v1/nowhere")",
                        10s));
  server.kill(SIGTERM);
  REQUIRE(server.wait_exit(30s) == 0);
  // A served request's line has no error field.
  for (std::istringstream lines(server.output()); !lines.eof();) {
    std::string line;
    std::getline(lines, line);
    if (line.find("\"status\":200") != std::string::npos) {
      INFO(line);
      CHECK(line.find("\"error\"") == std::string::npos);
    }
  }
}

TEST_CASE("a port in use is found before the model loads", "[app][serve][vllm]") {
  const std::string model = test::shared_file("models/stories260K.gguf");
  // The test holds a listening socket on a free loopback port.
  const int held = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(held >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(held, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  REQUIRE(::listen(held, 1) == 0);
  socklen_t length = sizeof address;
  REQUIRE(::getsockname(held, reinterpret_cast<sockaddr*>(&address), &length) == 0);
  const std::string port = std::to_string(ntohs(address.sin_port));
  int code = -1;
  const std::string out = troupe_run("serve " + model + " --port " + port, &code);
  ::close(held);
  INFO(out);
  CHECK(code == 1);
  CHECK_THAT(out, Catch::Contains("cannot listen on 127.0.0.1:" + port));
  CHECK_THAT(out, !Catch::Contains("loading"));
}

TEST_CASE("serve --help=<group> shows one section of its help, as vLLM's", "[app][cli][vllm]") {
  int code = -1;
  const std::string kv = troupe_run("serve --help=kv-cache", &code);
  INFO(kv);
  CHECK(code == 0);
  CHECK_THAT(kv, Catch::StartsWith("KV cache:") && Catch::Contains("--block-size") &&
                     !Catch::Contains("--port"));
  const std::string groups = troupe_run("serve --help=listgroup", &code);
  CHECK(code == 0);
  CHECK_THAT(groups, Catch::Contains("Model\n") && Catch::Contains("KV cache\n"));
  const std::string port = troupe_run("serve --help=--port", &code);
  CHECK(code == 0);
  CHECK_THAT(port, Catch::Contains("--port") && !Catch::Contains("--host"));
  // The start of a name alone is enough when it is one section's.
  CHECK_THAT(troupe_run("serve --help=vllm", &code), Catch::Contains("--dtype"));
  const std::string unknown = troupe_run("serve --help=nonsense", &code);
  CHECK(code == 2);
  CHECK_THAT(unknown, Catch::Contains("no such section") && Catch::Contains("KV cache"));
}

TEST_CASE("several served model names are each accepted and listed, the first answering",
          "[app][serve][vllm]") {
  test::ChildProcess server({TROUPE_BINARY, "serve", "--served-model-name", "first", "second",
                             "--port", "0", "--threads", "1", "--kv-cache-gb", "0.02"});
  const auto port = server.wait_for(R"(serving 'first' at http://127\.0\.0\.1:(\d+))", 60s);
  REQUIRE(port);
  const std::string url = "http://127.0.0.1:" + *port;
  const std::string json = " -H 'Content-Type: application/json'";
  const std::string models = curl(url + "/v1/models");
  CHECK_THAT(models, Catch::Contains(R"("id":"first")") && Catch::Contains(R"("id":"second")"));
  const std::string second =
      curl(url + "/v1/completions" + json +
           R"( -d '{"model": "second", "prompt": "Once", "max_tokens": 2}')");
  CHECK_THAT(second, Catch::Contains("HTTP/1.1 200") && Catch::Contains(R"("model":"first")"));
  CHECK_THAT(curl(url + "/v1/models/second"), Catch::Contains("HTTP/1.1 200"));
  CHECK_THAT(curl(url + "/v1/completions" + json +
                  R"( -d '{"model": "third", "prompt": "Once", "max_tokens": 2}')"),
             Catch::Contains("HTTP/1.1 404"));
  server.kill(SIGTERM);
  CHECK(server.wait_exit(30s) == 0);
}
