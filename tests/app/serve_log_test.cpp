// `troupe serve` as an operator runs it: the access log's fields, the engine's periodic
// line, CORS on the wire, and flags from a --config file, all in one server.
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "support/child_process.hpp"
#include "support/raw_client.hpp"
#include "support/shell.hpp"
#include "support/test_support.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

// curl's answer: the response headers and body (-i), or what curl said.
std::string curl(const std::string& args) {
  return test::run_shell("curl -s -i --max-time 30 " + args + " 2>&1").output;
}

// A client's WebSocket text frame: masked, as a client's must be (RFC 6455, 5.3).
std::string ws_text_frame(const std::string& text) {
  std::string frame = "\x81";
  if (text.size() < 126) {
    frame += static_cast<char>(0x80 | text.size());
  } else {
    frame += static_cast<char>(0x80 | 126);
    frame += static_cast<char>(text.size() >> 8);
    frame += static_cast<char>(text.size() & 0xff);
  }
  const char mask[4] = {0x12, 0x34, 0x56, 0x78};
  frame.append(mask, 4);
  for (std::size_t i = 0; i < text.size(); ++i) frame += static_cast<char>(text[i] ^ mask[i % 4]);
  return frame;
}

std::string ws_upgrade(const std::string& key) {
  return "GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\n"
         "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
         "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nAuthorization: Bearer " +
         key + "\r\n\r\n";
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

TEST_CASE("serve logs each request and the engine as JSON, answers CORS, and reads --config",
          "[app][serve][log]") {
  const std::string model = test::shared_file("models/stories260K.gguf");
  const auto config = std::filesystem::path(test::temp_path("serve-config")) / "troupe.yaml";
  std::filesystem::create_directories(config.parent_path());
  std::ofstream(config) << "# what an operator keeps in a file\n"
                           "log-format: json\n"
                           "log_stats_interval: 0.2\n"
                           "allowed-origins: [\"https://app.example\"]\n"
                           "threads: 1\n"
                           "max-num-seqs: 1\n"  // one runs, the rest wait (ws-d below)
                           "port: 8000\n";
  // --port on the command line wins over the file's.
  test::ChildProcess server({TROUPE_BINARY, "serve", "-m", model, "--config", config.string(),
                             "--port", "0", "--api-key", "sk-test", "--kv-cache-gb", "0.02"});
  const auto port = server.wait_for(R"(serving '.*' at http://127\.0\.0\.1:(\d+))", 60s);
  REQUIRE(port);
  const std::string url = "http://127.0.0.1:" + *port;
  const std::string key = " -H 'Authorization: Bearer sk-test'";

  // A completion from a page at the allowed origin: its answer names the origin.
  const std::string answer =
      curl(url + "/v1/completions" + key + " -H 'Origin: https://app.example'" +
           " -H 'Content-Type: application/json'" +
           R"( -d '{"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0}')");
  CHECK_THAT(answer, Catch::Contains("HTTP/1.1 200"));
  CHECK_THAT(answer, Catch::Contains("Access-Control-Allow-Origin: https://app.example"));
  // Its preflight needs no key; another origin's is refused.
  const std::string preflight =
      curl("-X OPTIONS " + url + "/v1/completions -H 'Origin: https://app.example'" +
           " -H 'Access-Control-Request-Method: POST'" +
           " -H 'Access-Control-Request-Headers: authorization, content-type'");
  CHECK_THAT(preflight, Catch::Contains("HTTP/1.1 200"));
  CHECK_THAT(preflight,
             Catch::Contains("Access-Control-Allow-Headers: authorization, content-type"));
  CHECK_THAT(curl("-X OPTIONS " + url + "/v1/completions -H 'Origin: https://evil.example'" +
                  " -H 'Access-Control-Request-Method: POST'"),
             Catch::Contains("HTTP/1.1 400") && Catch::Contains("Disallowed CORS origin"));
  // A browser applies no CORS to a socket: the server refuses another origin's upgrade.
  const std::string upgrade =
      " -H 'Connection: Upgrade' -H 'Upgrade: websocket'"
      " -H 'Sec-WebSocket-Version: 13'"
      " -H 'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=='";
  CHECK_THAT(curl(url + "/v1/ws" + key + upgrade + " -H 'Origin: https://evil.example'"),
             Catch::Contains("HTTP/1.1 403"));
  // A request the API refuses is logged too.
  CHECK_THAT(curl(url + "/v1/completions" + key + R"( -d '{"prompt": 1}')"),
             Catch::Contains("HTTP/1.1 400"));

  // The completion's line: every field, as JSON.
  const auto line = server.wait_for(
      R"((\{[^\n]*"message":"request"[^\n]*"path":"/v1/completions","status":200[^\n]*\}))", 10s);
  REQUIRE(line);
  CHECK_THAT(*line,
             Catch::Matches(R"(\{"time":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z","level":"info",)"
                            R"("message":"request","method":"POST","path":"/v1/completions",)"
                            R"("status":200,"request_id":"cmpl-\d+","prompt_tokens":\d+,)"
                            R"("output_tokens":5,"ttft_ms":[0-9.e+-]+,"total_ms":[0-9.e+-]+,)"
                            R"("finish_reason":"length","client_gone":false,)"
                            R"("client":"127\.0\.0\.1:\d+"\})"));
  CHECK(server.wait_for(R"("path":"/v1/completions","status":400,"request_id":null)", 10s));

  // Each of a socket's requests gets its own line, like an HTTP request's: one that ends,
  // one refused, and one whose client leaves while it streams.
  const auto ws_port = static_cast<std::uint16_t>(std::stoi(*port));
  {
    test::RawClient socket(ws_port);
    REQUIRE(socket.send(ws_upgrade("sk-test")));
    REQUIRE_THAT(socket.read_until("\r\n\r\n", 10s), Catch::StartsWith("HTTP/1.1 101"));
    REQUIRE(socket.send(ws_text_frame(
        R"({"type":"generate","id":"ws-a","prompt":"Once upon a time","max_tokens":4,)"
        R"("temperature":0,"ignore_eos":true})")));
    CHECK_THAT(socket.read_until(R"("type":"done")", 30s), Catch::Contains(R"("id":"ws-a")"));
    REQUIRE(socket.send(ws_text_frame(R"({"type":"generate","id":"ws-b","prompt":1})")));
    CHECK_THAT(socket.read_until(R"("type":"error")", 30s), Catch::Contains(R"("id":"ws-b")"));
    // Two at once, and gone before either ends: one server sequence at a time, so ws-d still
    // waits while ws-c runs its 120 tokens.
    REQUIRE(socket.send(ws_text_frame(
        R"({"type":"generate","id":"ws-c","prompt":"Once","max_tokens":120,"ignore_eos":true})")));
    REQUIRE(socket.send(ws_text_frame(
        R"({"type":"generate","id":"ws-d","prompt":"Twice","max_tokens":120,"ignore_eos":true})")));
    CHECK_THAT(socket.read_until(R"("type":"token","id":"ws-c")", 30s),
               Catch::Contains(R"("type":"token","id":"ws-c")"));
  }
  const auto ws_line = server.wait_for(
      R"((\{[^\n]*"message":"request","method":"WS","path":"/v1/ws",[^\n]*"ws-a"[^\n]*\}))", 10s);
  REQUIRE(ws_line);
  CHECK_THAT(*ws_line, Catch::Matches(R"(.*"status":200,"request_id":"ws-a","prompt_tokens":\d+,)"
                                      R"("output_tokens":4,"ttft_ms":[0-9.e+-]+,)"
                                      R"("total_ms":[0-9.e+-]+,"finish_reason":"length",)"
                                      R"("client_gone":false,"client":"127\.0\.0\.1:\d+"\})"));
  CHECK(server.wait_for(R"("method":"WS","path":"/v1/ws","status":400,"request_id":"ws-b",)", 10s));
  CHECK(server.wait_for(R"("method":"WS","path":"/v1/ws","status":200,"request_id":"ws-d",)"
                        R"([^\n]*"finish_reason":"abort","client_gone":true,)",
                        10s));

  // The engine's line while it was busy.
  CHECK(server.wait_for(R"("message":"engine","prompt_throughput_tok_s":[0-9.]+,)"
                        R"("generation_throughput_tok_s":[0-9.]+,"running":\d+,"waiting":\d+,)"
                        R"("kv_cache_usage_pct":[0-9.]+,"prefix_cache_hit_rate_pct":[0-9.]+\})",
                        10s));

  server.kill(SIGTERM);
  REQUIRE(server.wait_exit(30s) == 0);
  // Every line the server wrote is one JSON object.
  for (const auto& text : lines_of(server.output())) {
    INFO(text);
    CHECK(
        std::regex_match(text, std::regex(R"(\{"time":"[^"]+","level":"[a-z]+","message":.*\})")));
  }
  CHECK_THAT(server.output(), Catch::Contains(R"("message":"stopping")"));
}

TEST_CASE("the access log turned off, or a warning level, keeps requests out of the log",
          "[app][serve][log]") {
  const std::string model = test::shared_file("models/stories260K.gguf");
  test::ChildProcess server({TROUPE_BINARY, "serve", "-m", model, "--port", "0", "--threads", "1",
                             "--kv-cache-gb", "0.02", "--disable-access-log"});
  const auto port = server.wait_for(R"(serving '.*' at http://127\.0\.0\.1:(\d+))", 60s);
  REQUIRE(port);
  CHECK_THAT(curl("http://127.0.0.1:" + *port + "/v1/models"), Catch::Contains("HTTP/1.1 200"));
  server.kill(SIGTERM);
  REQUIRE(server.wait_exit(30s) == 0);
  CHECK_THAT(server.output(), !Catch::Contains("request method="));
  // Text lines: time, level, message.
  CHECK_THAT(server.output(),
             Catch::Matches(R"((.|\n)*\d\d:\d\d:\d\d\.\d{3}Z INFO    serving (.|\n)*)"));

  test::ChildProcess quiet({TROUPE_BINARY, "serve", "-m", model, "--port", "0", "--threads", "1",
                            "--kv-cache-gb", "0.02", "--log-level", "WARNING"});
  // Nothing at info: the port is found by asking, not read from the log.
  std::this_thread::sleep_for(3s);
  quiet.kill(SIGTERM);
  REQUIRE(quiet.wait_exit(30s) == 0);
  CHECK_THAT(quiet.output(), !Catch::Contains("serving"));
}
