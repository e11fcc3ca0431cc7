// `troupe serve` drained (issue 31, item 2): SIGTERM or POST /v1/admin/drain stops
// admitting, lets what runs end within --shutdown-timeout, ends what is left with an error
// and [DONE], and exits 0; a second signal stops it at once. A real server on an ephemeral
// port with the built-in model, one sequence at a time (--max-num-seqs 1), so that the
// streams wait behind each other and are in flight when the signal comes.
#include <catch2/catch.hpp>
#include <regex>
#include <string>
#include <vector>

#include "support/child_process.hpp"
#include "support/raw_client.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

const std::string kServing = R"(serving '.*' at http://127\.0\.0\.1:(\d+))";
const std::string kDraining = R"(draining \((signal|POST /v1/admin/drain)\))";

std::vector<std::string> serve_args(const std::string& shutdown_timeout,
                                    std::vector<std::string> more = {}) {
  std::vector<std::string> args = {TROUPE_BINARY,
                                   "serve",
                                   "--port",
                                   "0",
                                   "--threads",
                                   "1",
                                   "--max-num-seqs",
                                   "1",
                                   "--kv-cache-gb",
                                   "0.05",
                                   "--disable-log-stats",
                                   "--shutdown-timeout",
                                   shutdown_timeout};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

std::string post(const std::string& path, const std::string& body, const std::string& extra = {}) {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
         extra + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

std::string get(const std::string& path) {
  return "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
}

// A streamed completion long enough to still run (or wait) when the signal comes.
std::string stream_request(int max_tokens) {
  return post("/v1/completions", R"({"prompt":"Once upon a time","max_tokens":)" +
                                     std::to_string(max_tokens) +
                                     R"(,"ignore_eos":true,"temperature":0,"stream":true})");
}

// One short request on a new connection; its whole answer.
std::string ask(std::uint16_t port, const std::string& request) {
  test::RawClient client(port);
  REQUIRE(client.connected());
  REQUIRE(client.send(request));
  return client.read_all(20s);
}

// Opens `n` streams, each admitted (its answer's head read) before the next is sent.
std::vector<std::unique_ptr<test::RawClient>> open_streams(std::uint16_t port, int n,
                                                           int max_tokens) {
  std::vector<std::unique_ptr<test::RawClient>> streams;
  for (int i = 0; i < n; ++i) {
    auto client = std::make_unique<test::RawClient>(port);
    REQUIRE(client->connected());
    REQUIRE(client->send(stream_request(max_tokens)));
    REQUIRE(test::http_status(client->read_until("\r\n\r\n", 20s)) == 200);
    streams.push_back(std::move(client));
  }
  return streams;
}

// A server's close frame with code 1001 (going away) and the drain's reason, as its bytes.
const std::string kGoingAway = std::string("\x88\x1d\x03\xe9") + "the server is shutting down";

std::string ws_text_frame(const std::string& text) {
  std::string frame = "\x81";
  frame += static_cast<char>(0x80 | text.size());  // short frames only
  const char mask[4] = {0x12, 0x34, 0x56, 0x78};
  frame.append(mask, 4);
  for (std::size_t i = 0; i < text.size(); ++i) frame += static_cast<char>(text[i] ^ mask[i % 4]);
  return frame;
}

}  // namespace

TEST_CASE("SIGTERM drains: 8 streams in flight end normally and new requests get 503 and exit 0",
          "[app][serve][drain]") {
  test::ChildProcess server(serve_args("30"));
  const auto port_text = server.wait_for(kServing, 60s);
  REQUIRE(port_text);
  const auto port = static_cast<std::uint16_t>(std::stoi(*port_text));
  CHECK(test::http_status(ask(port, get("/health"))) == 200);
  // A socket opened before the drain: its generate during the drain is refused.
  test::RawClient socket(port);
  REQUIRE(socket.send(
      "GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
      "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"));
  REQUIRE_THAT(socket.read_until("\r\n\r\n", 10s), Catch::StartsWith("HTTP/1.1 101"));
  // A socket with nothing running: it goes away (1001) as soon as the drain starts.
  test::RawClient quiet(port);
  REQUIRE(quiet.send(
      "GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
      "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"));
  REQUIRE_THAT(quiet.read_until("\r\n\r\n", 10s), Catch::StartsWith("HTTP/1.1 101"));
  // A keep-alive connection that waits for its next request: closed when the drain starts.
  test::RawClient idle(port);
  REQUIRE(idle.send("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
  REQUIRE(test::http_status(idle.read_until("\r\n\r\n", 10s)) == 200);

  // A socket's generate running when the drain starts: it ends with its done frame.
  REQUIRE(socket.send(ws_text_frame(
      R"({"type":"generate","id":"early","prompt":"Hi","max_tokens":300,"ignore_eos":true})")));
  REQUIRE_THAT(socket.read_until(R"("type":"token","id":"early")", 20s),
               Catch::Contains(R"("type":"token","id":"early")"));
  // One sequence at a time: 8 x 300 tokens take seconds, so all 8 are in flight.
  auto streams = open_streams(port, 8, 300);
  server.kill(SIGTERM);
  REQUIRE(server.wait_for(kDraining, 10s));
  idle.read_all(5s);
  CHECK(idle.closed_by_peer());
  CHECK_THAT(quiet.read_until(kGoingAway, 5s), Catch::Contains(kGoingAway));

  // The load balancer's check says so; new work is turned away with a time to retry.
  const std::string health = ask(port, get("/health"));
  CHECK(test::http_status(health) == 503);
  CHECK_THAT(health, Catch::Contains(R"({"status":"draining"})"));
  const std::string refused = ask(
      port, post("/v1/completions", R"({"prompt":"Hi","max_tokens":2})", "Connection: close\r\n"));
  CHECK(test::http_status(refused) == 503);
  CHECK_THAT(refused, Catch::Contains("Retry-After: 5"));
  CHECK_THAT(refused, Catch::Contains("shutting down"));
  const std::string metrics = ask(port, get("/metrics"));
  CHECK(std::regex_search(metrics, std::regex(R"(\ntroupe_server_draining\{[^}\n]*\} 1\n)")));
  REQUIRE(socket.send(
      ws_text_frame(R"({"type":"generate","id":"late","prompt":"Hi","max_tokens":2})")));
  const std::string frame = socket.read_until(R"("type":"error")", 10s);
  CHECK_THAT(frame, Catch::Contains(R"("id":"late")") && Catch::Contains(R"("code":503)"));
  const std::string early = socket.read_until(R"("type":"done","id":"early")", 30s);
  CHECK_THAT(early, Catch::Contains(R"("type":"done","id":"early")"));
  CHECK_THAT(early.substr(early.find(R"("type":"done","id":"early")")),
             Catch::Contains(R"("finish_reason":"length")"));
  // Its last request done, the socket goes away too (1001), after its done frame.
  CHECK_THAT(socket.read_until(kGoingAway, 10s), Catch::Contains(kGoingAway));

  // Every stream admitted before the signal runs to its end.
  for (auto& stream : streams) {
    const std::string answer = stream->read_until("data: [DONE]", 30s);
    CHECK_THAT(answer, Catch::Contains("data: [DONE]"));
    CHECK_THAT(answer, Catch::Contains(R"("finish_reason":"length")"));
    CHECK_THAT(answer, !Catch::Contains(R"("error")"));
  }
  CHECK(server.wait_exit(20s) == 0);
  CHECK_THAT(server.output(), Catch::Contains("stopping"));
  CHECK_THAT(server.output(), !Catch::Contains("shutdown timeout: cutting"));
}

TEST_CASE("a drain out of time cuts what runs: an error event and DONE or a 503 answer",
          "[app][serve][drain]") {
  test::ChildProcess server(serve_args("0"));
  const auto port_text = server.wait_for(kServing, 60s);
  REQUIRE(port_text);
  const auto port = static_cast<std::uint16_t>(std::stoi(*port_text));
  auto streams = open_streams(port, 8, 300);
  // And one not streamed, waiting behind them.
  test::RawClient whole(port);
  REQUIRE(whole.send(
      post("/v1/completions", R"({"prompt":"Once","max_tokens":300,"ignore_eos":true})")));
  server.kill(SIGTERM);
  int num_cut = 0;
  for (auto& stream : streams) {
    const std::string answer = stream->read_until("data: [DONE]", 30s);
    CHECK_THAT(answer, Catch::Contains("data: [DONE]"));
    if (answer.find(R"("finish_reason":"error")") != std::string::npos) {
      ++num_cut;
      // The error event after the choice's last chunk, then [DONE].
      const auto last_chunk = answer.find(R"("finish_reason":"error")");
      const auto error_event = answer.find(R"(data: {"error":{"message":"the server shut down)");
      REQUIRE(error_event != std::string::npos);
      CHECK(last_chunk < error_event);
      CHECK(error_event < answer.find("data: [DONE]"));
      CHECK_THAT(answer.substr(error_event), Catch::Contains(R"("code":503)"));
    } else {
      CHECK_THAT(answer, Catch::Contains(R"("finish_reason":"length")"));
    }
  }
  // The last ones still waited for the one sequence the engine runs at a time.
  CHECK(num_cut >= 1);
  const std::string answer = whole.read_until("\"code\":503", 30s);
  CHECK(test::http_status(answer) == 503);
  CHECK_THAT(answer, Catch::Contains("shut down before this request ended"));
  CHECK(server.wait_exit(20s) == 0);
  CHECK_THAT(server.output(), Catch::Contains("shutdown timeout: cutting"));
}

TEST_CASE("a second SIGTERM stops a draining server at once", "[app][serve][drain]") {
  test::ChildProcess server(serve_args("600"));
  const auto port_text = server.wait_for(kServing, 60s);
  REQUIRE(port_text);
  const auto port = static_cast<std::uint16_t>(std::stoi(*port_text));
  auto streams = open_streams(port, 4, 1000);
  server.kill(SIGTERM);
  REQUIRE(server.wait_for(kDraining, 10s));
  server.kill(SIGTERM);
  const auto start = std::chrono::steady_clock::now();
  CHECK(server.wait_exit(10s) == 0);
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  CHECK_THAT(server.output(), Catch::Contains("second signal: stopping at once"));
}

TEST_CASE("POST /v1/admin/drain drains behind the API key and the server exits 0",
          "[app][serve][drain]") {
  test::ChildProcess server(serve_args("30", {"--api-key", "sk-drain"}));
  const auto port_text = server.wait_for(kServing, 60s);
  REQUIRE(port_text);
  const auto port = static_cast<std::uint16_t>(std::stoi(*port_text));
  const std::string anyone = ask(port, post("/v1/admin/drain", "", "Connection: close\r\n"));
  CHECK(test::http_status(anyone) == 401);
  CHECK(test::http_status(ask(port, get("/health"))) == 200);
  const std::string drained = ask(
      port, post("/v1/admin/drain", "", "Authorization: Bearer sk-drain\r\nConnection: close\r\n"));
  CHECK(test::http_status(drained) == 202);
  CHECK_THAT(drained, Catch::Contains(R"("status":"draining")") &&
                          Catch::Contains(R"("shutdown_timeout_s":30)"));
  REQUIRE(server.wait_for(kDraining, 10s));
  // Nothing ran: the drain is over at once, and the process ends by itself.
  CHECK(server.wait_exit(20s) == 0);
}
