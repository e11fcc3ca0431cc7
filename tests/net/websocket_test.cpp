// WebSocket streaming at /v1/ws through a real (blocking Beast) client.
#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <catch2/catch.hpp>
#include <map>
#include <thread>

#include "net/http_server.hpp"
#include "support/engine_support.hpp"
#include "support/mini_json.hpp"
#include "support/small_model.hpp"
#include "troupe/engine.hpp"

using namespace troupe;
using namespace std::chrono_literals;
namespace asio = boost::asio;
namespace websocket = boost::beast::websocket;
using tcp = asio::ip::tcp;

namespace {

struct Fixture {
  explicit Fixture(int max_concurrent_requests = 1024) {
    EngineConfig e;
    e.model_path = test::write_small_model(
        "ws-model", [](model::RandomModelSpec& s) { s.context_length = 512; });
    e.num_threads = 2;
    e.block_size = 4;
    e.num_kv_blocks = 512;
    e.before_step = [] { std::this_thread::sleep_for(2ms); };
    engine = std::move(*Engine::create(e));
    net::ServerConfig config;
    config.port = 0;
    config.max_concurrent_requests = max_concurrent_requests;
    server = std::make_unique<net::HttpServer>(*engine, config);
    REQUIRE(server->start().has_value());
  }
  ~Fixture() { server->stop(); }

  bool kv_drains() const { return test::kv_drains(*engine); }

  std::unique_ptr<Engine> engine;
  std::unique_ptr<net::HttpServer> server;
};

class Client {
 public:
  explicit Client(std::uint16_t port) : ws_(io_) {
    tcp::resolver resolver(io_);
    asio::connect(ws_.next_layer(), resolver.resolve("127.0.0.1", std::to_string(port)));
    ws_.handshake("127.0.0.1", "/v1/ws");
  }
  void send(const std::string& text) { ws_.write(asio::buffer(text)); }
  test::Json receive() {
    boost::beast::flat_buffer buffer;
    ws_.read(buffer);
    return test::JsonParser(boost::beast::buffers_to_string(buffer.data())).parse();
  }
  void close() { ws_.close(websocket::close_code::normal); }

 private:
  asio::io_context io_;
  websocket::stream<tcp::socket> ws_;
};

}  // namespace

TEST_CASE("two requests stream on one socket and one is cancelled",
          "[net][websocket][integration]") {
  Fixture f;
  Client c(f.server->port());
  c.send(
      R"({"type":"generate","id":"long","prompt":"Once","max_tokens":300,"ignore_eos":true,"temperature":0})");
  c.send(
      R"({"type":"generate","id":"short","prompt":"Hi","max_tokens":5,"temperature":0,"logprobs":1})");
  std::map<std::string, int> tokens;
  std::map<std::string, std::string> finish;
  while (finish.size() < 2) {
    const auto frame = c.receive();
    const std::string& id = frame["id"].string;
    if (frame["type"].string == "token") {
      ++tokens[id];
      if (id == "short") CHECK(frame["top_logprobs"].array.size() == 1);
    } else {
      REQUIRE(frame["type"].string == "done");
      if (frame.object.count("token")) ++tokens[id];  // the last token rides on the done frame
      finish[id] = frame["finish_reason"].string;
      if (id == "short") {
        CHECK(frame["usage"]["completion_tokens"].number == 5);
        c.send(R"({"type":"cancel","id":"long"})");  // the other is still running
      }
    }
  }
  CHECK(finish["short"] == "length");
  CHECK(tokens["short"] == 5);
  CHECK(finish["long"] == "abort");
  CHECK(tokens["long"] < 300);
  CHECK(f.kv_drains());
  c.close();
}

TEST_CASE("bad messages on the socket get error frames", "[net][websocket][integration]") {
  Fixture f;
  Client c(f.server->port());
  c.send("not json");
  CHECK(c.receive()["type"].string == "error");
  c.send(R"({"type":"generate","id":"x","prompt":"Hi","top_p":7})");
  const auto e = c.receive();
  CHECK(e["type"].string == "error");
  CHECK(e["id"].string == "x");
  CHECK(e["error"]["message"].string.find("top_p") != std::string::npos);
  c.close();
}

TEST_CASE("closing the socket cancels its requests and frees their blocks",
          "[net][websocket][integration]") {
  Fixture f;
  {
    Client c(f.server->port());
    c.send(R"({"type":"generate","id":"a","prompt":"Once","max_tokens":300,"ignore_eos":true})");
    c.send(R"({"type":"generate","id":"b","prompt":"Twice","max_tokens":300,"ignore_eos":true})");
    c.receive();  // running
    c.close();
  }
  CHECK(f.kv_drains());
}

TEST_CASE("socket requests count against the server's request limit",
          "[net][websocket][integration]") {
  Fixture f(1);
  Client c(f.server->port());
  c.send(R"({"type":"generate","id":"a","prompt":"Once","max_tokens":300,"ignore_eos":true})");
  c.send(R"({"type":"generate","id":"b","prompt":"Twice","max_tokens":3})");
  test::Json refused;
  while (true) {  // a's tokens stream meanwhile
    refused = c.receive();
    if (refused["type"].string == "error") break;
  }
  CHECK(refused["id"].string == "b");
  CHECK(refused["error"]["code"].number == 429);
  c.send(R"({"type":"cancel","id":"a"})");
  while (c.receive()["type"].string != "done") {
  }
  c.send(
      R"({"type":"generate","id":"c","prompt":"Again","max_tokens":3})");  // the slot is free again
  test::Json last;
  do last = c.receive();
  while (last["type"].string == "token");
  CHECK(last["type"].string == "done");
  CHECK(last["id"].string == "c");
  c.close();
}
