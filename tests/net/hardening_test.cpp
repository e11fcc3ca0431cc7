// The server against hostile and careless clients: each case here was a defect found by
// attacking `troupe serve` on loopback (a crash, an accept loop that died, a client that
// held every slot, work for clients long gone, a stalled I/O thread, lost precision).
#include <sys/resource.h>

#include <dirent.h>
#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <catch2/catch.hpp>
#include <thread>

#include "monitoring/metrics.hpp"
#include "net/http_server.hpp"
#include "net_test_support.hpp"
#include "support/engine_support.hpp"
#include "support/mini_json.hpp"
#include "support/raw_client.hpp"
#include "support/small_model.hpp"
#include "troupe/engine.hpp"

using namespace troupe;
using namespace std::chrono_literals;
namespace asio = boost::asio;
namespace websocket = boost::beast::websocket;
using tcp = asio::ip::tcp;
using test::RawClient;

namespace {

struct Served : test::ServedEngine {
  explicit Served(net::ServerConfig config = {}, std::int32_t context_length = 256,
                  std::function<void()> before_step = {})
      : ServedEngine("hardening", std::move(config), context_length,
                     std::max(2048, context_length / 4 + 16),  // one whole context fits
                     std::move(before_step)) {}

  std::uint16_t port() const { return server->port(); }

  // One request on a fresh connection; the whole answer, read until the server closes.
  std::string exchange(const std::string& bytes, std::chrono::milliseconds timeout = 10s) {
    RawClient c(port());
    REQUIRE(c.connected());
    REQUIRE(c.send(bytes));
    return c.read_all(timeout);
  }
  std::string post(const std::string& path, const std::string& body,
                   const std::string& headers = "") {
    return exchange("POST " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + headers +
                    "Content-Type: application/json\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\n\r\n" + body);
  }
  std::string get(const std::string& path) {
    return exchange("GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  }
  bool healthy() { return test::http_status(get("/health")) == 200; }
  std::string metrics_text() { return metrics->serialize(); }
};

std::string body_of(const std::string& response) {
  const auto at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

test::Json json_body(const std::string& response) {
  return test::JsonParser(body_of(response)).parse();
}

template <class Predicate>
bool eventually(Predicate done, std::chrono::milliseconds timeout = 20s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return done();
}

int open_descriptors() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n - 3;  // ".", ".." and the directory's own descriptor
}

}  // namespace

TEST_CASE("chunked trailers past the header limit are a 431, and the server lives on",
          "[net][hardening]") {
  Served s;
  // 64 KB in one trailer field made Beast throw out of the connection's coroutine.
  const std::string request =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5\r\nhello\r\n0\r\nX-Big: " +
      std::string(70000, 'a') + "\r\n\r\n";
  const auto answer = s.exchange(request);
  CHECK(test::http_status(answer) == 431);
  CHECK(s.healthy());
  SECTION("many small trailers add up the same way") {
    std::string trailers;
    for (int i = 0; i < 2000; ++i) trailers += "X-T" + std::to_string(i) + ": value\r\n";
    CHECK(test::http_status(s.exchange("POST /health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
                                       "chunked\r\n\r\n0\r\n" +
                                       trailers + "\r\n")) == 431);
    CHECK(s.healthy());
  }
}

TEST_CASE("malformed requests get 400 and oversized headers 431, not a silent close",
          "[net][hardening]") {
  Served s;
  CHECK(test::http_status(s.exchange("GARBAGE\r\n\r\n")) == 400);
  CHECK(test::http_status(s.exchange("GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")) == 400);
  CHECK(test::http_status(s.exchange("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
                                     "zz\r\n\r\n")) == 400);
  CHECK(test::http_status(s.exchange("GET /health HTTP/1.1\r\nHost: x\r\nX-Long: " +
                                     std::string(20000, 'b') + "\r\n\r\n")) == 431);
  CHECK(s.healthy());
}

TEST_CASE("a body past the limit gets its 413 even when the client sends it all before reading",
          "[net][hardening]") {
  Served s;
  // As Python's http.client and requests do: the whole body, and only then the answer.
  // The 413 goes out once the header is read; the server must not close with the rest
  // of the body unread (a reset), or such a client sees a broken pipe instead.
  const std::string body(5 << 20, 'a');  // past the 4 MiB limit
  RawClient c(s.port());
  REQUIRE(c.connected());
  REQUIRE(
      c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
             "application/json\r\nContent-Length: " +
             std::to_string(body.size()) + "\r\n\r\n"));
  CHECK(c.send(body));
  const std::string reply = c.read_all(20s);
  CHECK(test::http_status(reply) == 413);
  CHECK(reply.find("the request body is larger than 4194304 bytes") != std::string::npos);
  CHECK(c.closed_by_peer());
  // A client that stops sending but never closes is let go after a while.
  RawClient stalled(s.port());
  REQUIRE(stalled.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                       std::to_string(body.size()) + "\r\n\r\nabc"));
  CHECK(test::http_status(stalled.read_all(20s)) == 413);
  CHECK(eventually([&] { return s.server->num_connections() == 0; }, 20s));
  CHECK(s.healthy());
}

TEST_CASE("Expect: 100-continue is answered before the body is sent", "[net][hardening]") {
  Served s;
  const std::string body = R"({"prompt":"Hi","max_tokens":2,"temperature":0})";
  RawClient c(s.port());
  REQUIRE(
      c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
             "Content-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: " +
             std::to_string(body.size()) + "\r\n\r\n"));
  const auto interim = c.read_until("\r\n\r\n", 5s);
  REQUIRE(interim.rfind("HTTP/1.1 100 Continue\r\n\r\n", 0) == 0);
  REQUIRE(c.send(body));
  const auto answer = c.read_all(10s).substr(interim.size());
  CHECK(test::http_status(answer) == 200);
  SECTION("a body larger than the limit is refused without waiting for it") {
    RawClient big(s.port());
    REQUIRE(
        big.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                 "Content-Length: 999999999\r\n\r\n"));
    CHECK(test::http_status(big.read_all(5s)) == 413);
  }
}

TEST_CASE("accepting survives running out of descriptors", "[net][hardening]") {
  Served s;
  rlimit saved{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
  {
    // Room for a few connections only: the clients here fill the table, and the
    // server's accept() meets EMFILE.
    rlimit tight = saved;
    tight.rlim_cur = static_cast<rlim_t>(open_descriptors() + 16);
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &tight) == 0);
    std::vector<std::unique_ptr<RawClient>> clients;
    while (clients.size() < 64) {
      auto c = std::make_unique<RawClient>(s.port());
      if (!c->connected()) break;
      clients.push_back(std::move(c));
    }
    std::this_thread::sleep_for(300ms);  // the server tries to accept the backlog, and fails
    clients.clear();
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &saved) == 0);
  }
  // The test did reach EMFILE: the server counted failed accepts (present and not 0).
  const std::string text = s.metrics_text();
  const std::string series = "\ntroupe_http_accept_errors_total{model_name=\"troupe\"} ";
  const auto at = text.find(series);
  REQUIRE(at != std::string::npos);
  CHECK(text.compare(at, series.size() + 2, series + "0\n") != 0);
  // The accept loop is still there: new clients are served.
  CHECK(test::http_status(
            s.exchange("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 5s)) == 200);
  CHECK(s.healthy());
}

TEST_CASE("a WebSocket client that never reads is cut off, and its slots go to others",
          "[net][hardening][websocket]") {
  net::ServerConfig config;
  config.max_concurrent_requests = 16;
  Served s(config, 512);
  // A client with a small receive window that asks for a lot and reads nothing.
  asio::io_context io;
  websocket::stream<tcp::socket> ws(io);
  ws.next_layer().open(tcp::v4());
  ws.next_layer().set_option(asio::socket_base::receive_buffer_size(4096));
  ws.next_layer().connect({asio::ip::make_address("127.0.0.1"), s.port()});
  ws.handshake("127.0.0.1", "/v1/ws");
  for (int i = 0; i < 16; ++i) {
    ws.write(asio::buffer(R"({"type":"generate","id":"r)" + std::to_string(i) +
                          R"(","prompt":"Once upon a time","max_tokens":480,"ignore_eos":true,)"
                          R"("temperature":0,"logprobs":20})"));
  }
  // The server gives up on it ...
  const std::string gave_up =
      R"(troupe_http_connection_errors_total{model_name="troupe",reason="slow_reader"} 1)";
  REQUIRE(eventually([&] { return s.metrics_text().find(gave_up) != std::string::npos; }));
  const auto gave_up_at = std::chrono::steady_clock::now();
  // ... and every slot comes back once the requests end in the engine, while the client
  // still reads nothing.
  REQUIRE(eventually([&] {
    const auto st = s.engine->stats();
    return st.num_running == 0 && st.num_waiting == 0 && st.kv_usage == 0.0;
  }));
  SECTION("a client that reads again is told why: a policy close (1008)") {
    // The close frame follows what was already on its way, once the client takes that:
    // the server waits 2 s for it (from when it gave up), far more than reading takes.
    INFO("reading from "
         << std::chrono::duration<double>(std::chrono::steady_clock::now() - gave_up_at).count()
         << " s after the server gave up");
    boost::beast::flat_buffer buffer;
    boost::system::error_code ec;
    while (!ec) ws.read(buffer, ec), buffer.consume(buffer.size());
    INFO(ec.message());
    REQUIRE(ec == websocket::error::closed);
    CHECK(ws.reason().code == websocket::close_code::policy_error);
    CHECK(std::string(ws.reason().reason.c_str()).find("client too slow") == 0);
  }
  SECTION("a client that cannot take even the close frame is dropped") {
    CHECK(eventually([&] { return s.server->num_connections() == 0; }, 10s));
  }
  const auto answer =
      s.post("/v1/completions", R"({"prompt":"Hi","max_tokens":2,"temperature":0})");
  CHECK(test::http_status(answer) == 200);
  CHECK(eventually([&] { return s.server->num_requests_in_flight() == 0; }, 5s));
  CHECK(eventually([&] { return s.server->num_connections() == 0; }, 10s));
}

TEST_CASE("an SSE client that never reads is cut off, and its slot goes to others",
          "[net][hardening]") {
  net::ServerConfig config;
  config.max_concurrent_requests = 1;
  // Queued events are counted by the memory they hold, far less than their JSON on the
  // wire: a small bound makes the kernel's socket buffers a small part of the story.
  config.max_buffered_output_bytes = 64 << 10;
  Served s(config, 512);
  const std::string body =
      R"({"prompt":"Once upon a time","max_tokens":480,"ignore_eos":true,"n":16,)"
      R"("logprobs":20,"stream":true})";
  RawClient idle(s.port(), 4096);
  REQUIRE(
      idle.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                "application/json\r\nContent-Length: " +
                std::to_string(body.size()) + "\r\n\r\n" + body));
  REQUIRE(eventually([&] { return s.engine->stats().num_running > 0; }));
  REQUIRE(eventually([&] {
    const auto st = s.engine->stats();
    return st.num_running == 0 && st.num_waiting == 0 && st.kv_usage == 0.0;
  }));
  // The only slot is free although the client has read (almost) nothing.
  CHECK(test::http_status(s.post("/v1/completions", R"({"prompt":"Hi","max_tokens":2})")) == 200);
  CHECK(s.metrics_text().find(
            R"(troupe_http_connection_errors_total{model_name="troupe",reason="slow_reader"} 1)") !=
        std::string::npos);
}

TEST_CASE("a non-streaming client that disconnects cancels its generation", "[net][hardening]") {
  Served s({}, 256, [] { std::this_thread::sleep_for(20ms); });
  {
    RawClient c(s.port());
    const std::string body = R"({"prompt":"Hi","max_tokens":240,"ignore_eos":true})";
    REQUIRE(
        c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
               "application/json\r\nContent-Length: " +
               std::to_string(body.size()) + "\r\n\r\n" + body));
    REQUIRE(eventually([&] { return s.engine->stats().num_running == 1; }));
  }  // gone, some 5 s of generation before its end
  CHECK(test::kv_drains(*s.engine));
  CHECK(test::num_aborted_is(*s.metrics, 1));  // recorded a moment after the blocks are freed
  CHECK(s.healthy());
}

TEST_CASE("tokenizing a huge prompt holds up no other client", "[net][hardening]") {
  Served s({}, 131072);
  // Half a megabyte fits this context (in bytes), so it is tokenized: for a while.
  std::string prompt;
  while (prompt.size() < 500000) prompt += "Once upon a time, there was a little dog. ";
  const std::string body = R"({"prompt":")" + prompt + R"("})";
  RawClient big(s.port());
  const auto started = std::chrono::steady_clock::now();
  REQUIRE(big.send("POST /tokenize HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: " +
                   std::to_string(body.size()) + "\r\n\r\n" + body));
  std::this_thread::sleep_for(20ms);
  // /health is answered while the tokenizer works: the big answer has not come yet (on one
  // I/O thread that tokenizes, /health waited, and the big answer came first).
  CHECK(s.healthy());
  CHECK(big.read_all(0ms).empty());
  CHECK(test::http_status(big.read_all(30s)) == 200);
  const auto took = std::chrono::steady_clock::now() - started;
  INFO("tokenizing took " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                          << " ms");
  CHECK(took > 40ms);  // else this test proves nothing: give it a longer prompt
}

TEST_CASE("a prompt longer than the context can hold is refused before it is tokenized",
          "[net][hardening]") {
  Served s;  // 256 tokens
  const std::string prompt(3000000, 'a');
  const auto answer = s.post("/v1/completions", R"({"prompt":")" + prompt + R"("})");
  CHECK(test::http_status(answer) == 400);
  CHECK(json_body(answer)["error"]["message"].string.find("maximum context length is 256") !=
        std::string::npos);
  CHECK(test::http_status(s.post("/tokenize", R"({"prompt":")" + prompt + R"("})")) == 400);
  const auto chat = s.post("/v1/chat/completions",
                           R"({"messages":[{"role":"user","content":")" + prompt + R"("}]})");
  CHECK(test::http_status(chat) == 400);
}

TEST_CASE("/tokenize and /detokenize need the API key when one is set", "[net][hardening]") {
  net::ServerConfig config;
  config.api_key = "sekrit";
  Served s(config);
  CHECK(test::http_status(s.post("/tokenize", R"({"prompt":"Hi"})")) == 401);
  CHECK(test::http_status(s.post("/detokenize", R"({"tokens":[1]})")) == 401);
  CHECK(test::http_status(
            s.post("/tokenize", R"({"prompt":"Hi"})", "Authorization: Bearer sekrit\r\n")) == 200);
  CHECK(s.healthy());
}

TEST_CASE("seeds are exact 64-bit integers", "[net][hardening]") {
  Served s;
  auto text_for = [&](const std::string& seed) {
    const auto answer =
        s.post("/v1/completions",
               R"({"prompt":"Hi","max_tokens":12,"temperature":1,"seed":)" + seed + "}");
    REQUIRE(test::http_status(answer) == 200);
    return json_body(answer)["choices"].array[0]["text"].string;
  };
  // Above 2^63 they all became one seed; above 2^53 neighbours did.
  CHECK(text_for("9223372036854775809") != text_for("9223372036854775810"));
  CHECK(text_for("18446744073709551615") != text_for("18446744073709551614"));
  CHECK(text_for("9007199254740993") != text_for("9007199254740992"));
  CHECK(text_for("18446744073709551615") == text_for("18446744073709551615"));
  CHECK(test::http_status(s.post("/v1/completions", R"({"prompt":"Hi","seed":1.5})")) == 400);
  CHECK(test::http_status(s.post("/v1/completions", R"({"prompt":"Hi","seed":-2})")) == 400);
  CHECK(test::http_status(
            s.post("/v1/completions", R"({"prompt":"Hi","seed":18446744073709551616})")) == 400);
}

TEST_CASE("errors quote what the client sent, not a clamped value", "[net][hardening]") {
  Served s;
  const auto answer = s.post("/v1/completions", R"({"prompt":"Hi","max_tokens":1000000000000})");
  CHECK(test::http_status(answer) == 400);
  CHECK(json_body(answer)["error"]["message"].string.find("1000000000000 in the completion") !=
        std::string::npos);
}

TEST_CASE("HTTP/1.0 clients get their stream as a close-delimited body", "[net][hardening]") {
  Served s;
  const std::string body = R"({"prompt":"Hi","max_tokens":3,"temperature":0,"stream":true})";
  const auto answer = s.exchange(
      "POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body);
  CHECK(test::http_status(answer) == 200);
  const auto head = answer.substr(0, answer.find("\r\n\r\n"));
  CHECK(head.find("chunked") == std::string::npos);
  CHECK(body_of(answer).rfind("data: {", 0) == 0);
  CHECK(body_of(answer).find("data: [DONE]\n\n") != std::string::npos);
}

TEST_CASE("the socket parses a message before choosing chat or completion",
          "[net][hardening][websocket]") {
  Served s;
  asio::io_context io;
  websocket::stream<tcp::socket> ws(io);
  ws.next_layer().connect({asio::ip::make_address("127.0.0.1"), s.port()});
  ws.handshake("127.0.0.1", "/v1/ws");
  // "messages" as a prompt, a stop string and an id made it a chat without messages.
  const std::string message =
      R"({"type":"generate","id":"messages","prompt":"messages","stop":["messages"],"max_tokens":2})";
  ws.write(asio::buffer(message));
  test::Json frame;
  do {
    boost::beast::flat_buffer buffer;
    ws.read(buffer);
    frame = test::JsonParser(boost::beast::buffers_to_string(buffer.data())).parse();
  } while (frame["type"].string == "token");
  INFO((frame.object.count("error") ? frame["error"]["message"].string : std::string()));
  CHECK(frame["type"].string == "done");
  CHECK(frame["id"].string == "messages");
  ws.close(websocket::close_code::normal);
}
