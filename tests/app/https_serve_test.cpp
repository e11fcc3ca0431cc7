// `troupe serve` over HTTPS from vLLM's launch line: it starts, answers curl --cacert,
// tells a plain HTTP client where to go, and refuses bad TLS flags before loading a model.
#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

#include "support/child_process.hpp"
#include "support/shell.hpp"
#include "support/test_support.hpp"
#include "support/tls_certificates.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

// What a shell command prints (stdout and stderr) and its exit code.
std::pair<int, std::string> shell(const std::string& command) {
  const test::ShellRun run = test::run_shell(command + " 2>&1");
  return {run.exit_code, run.output};
}

}  // namespace

TEST_CASE("troupe serve takes the vLLM launch line with --ssl-keyfile and --ssl-certfile",
          "[app][serve][tls]") {
  const std::string model = test::shared_file("models/stories260K.gguf");
  test::TlsCertificates certs("serve-https");
  REQUIRE(certs.made);
  test::ChildProcess server(
      {TROUPE_BINARY, "serve", model, "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
       "--disable-log-requests", "--ssl-keyfile", certs.key("self"), "--ssl-certfile",
       certs.cert("self"), "--port", "0", "--threads", "1", "--kv-cache-gb", "0.02"});
  const auto port = server.wait_for(R"(serving '(?:[^']*)' at https://127\.0\.0\.1:(\d+))", 60s);
  REQUIRE(port);
  const std::string url = "https://127.0.0.1:" + *port;
  const std::string curl = "curl -s -i --max-time 30 --cacert " + certs.cert("self") + " ";

  auto [code, models] = shell(curl + url + "/v1/models");
  CHECK(code == 0);
  CHECK_THAT(models,
             Catch::StartsWith("HTTP/1.1 200") && Catch::Contains("\"id\":\"" + model + "\""));
  auto [chat_code, chat] =
      shell(curl + url + "/v1/chat/completions -H 'Content-Type: application/json' -d " +
            R"('{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}')");
  CHECK(chat_code == 0);
  CHECK_THAT(chat, Catch::StartsWith("HTTP/1.1 200") && Catch::Contains("chat.completion"));
  // A plain HTTP client is told to use https:// (and its failed handshake, the first,
  // is logged: the rest of the second are counted into the next warning).
  auto [plain_code, plain] =
      shell("curl -s -i --max-time 30 http://127.0.0.1:" + *port + "/health");
  CHECK_THAT(plain, Catch::StartsWith("HTTP/1.1 400") && Catch::Contains("https://"));
  // A client that does not trust the certificate refuses the server (curl's 60).
  CHECK(shell("curl -s --max-time 30 " + url + "/health").first == 60);

  server.kill(SIGTERM);
  REQUIRE(server.wait_exit(30s) == 0);
  CHECK_THAT(server.output(), Catch::Contains("TLS handshake with 127.0.0.1:") &&
                                  Catch::Contains("the client spoke plain HTTP"));
}

TEST_CASE("troupe serve refuses bad TLS flags before it loads the model", "[app][serve][tls]") {
  test::TlsCertificates certs("serve-https-bad");
  REQUIRE(certs.made);
  const std::string serve =
      "timeout 60 " + std::string(TROUPE_BINARY) + " serve --port 0 --kv-cache-gb 0.02 ";
  auto [code, out] = shell(serve + "--ssl-keyfile " + certs.dir + "/missing.key --ssl-certfile " +
                           certs.cert("self"));
  CHECK(code == 1);
  CHECK_THAT(out, Catch::Contains("troupe serve: --ssl-keyfile " + certs.dir +
                                  "/missing.key: no such file"));
  CHECK_THAT(out, !Catch::Contains("loading"));
  std::tie(code, out) = shell(serve + "--ssl-ca-certs " + certs.cert("ca"));
  CHECK(code == 1);
  CHECK_THAT(out, Catch::Contains("--ssl-ca-certs and --ssl-cert-reqs need --ssl-certfile"));
  std::tie(code, out) = shell(serve + "--ssl-keyfile " + certs.key("self") + " --ssl-certfile " +
                              certs.cert("self") + " --ssl-cert-reqs 3");
  CHECK(code != 0);
  CHECK_THAT(out, Catch::Contains("--ssl-cert-reqs"));
  CHECK_THAT(out, !Catch::Contains("loading"));
}
