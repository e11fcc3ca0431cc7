// WebSocket streaming at /v1/ws through a real (blocking Beast) client.
#include <algorithm>
#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <catch2/catch.hpp>
#include <map>
#include <thread>

#include "monitoring/metrics.hpp"
#include "net/http_server.hpp"
#include "net/openai_api.hpp"
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

namespace {

net::ServerConfig with_request_limits(int max_concurrent_requests, int max_requests_per_socket) {
  net::ServerConfig config;
  config.max_concurrent_requests = max_concurrent_requests;
  config.max_requests_per_socket = max_requests_per_socket;
  return config;
}

struct Fixture : test::ServedEngine {
  explicit Fixture(int max_concurrent_requests = 1024, std::int32_t context_length = 512,
                   int max_requests_per_socket = 256)
      : ServedEngine(
            "ws-model", with_request_limits(max_concurrent_requests, max_requests_per_socket),
            context_length, std::max(512, context_length / 2 + 16),  // two whole contexts fit
            [] { std::this_thread::sleep_for(2ms); }) {}
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
  // 8000 tokens each: seconds of generation, far past kv_drains' wait, unless the close
  // cancels them.
  Fixture f(1024, 8192);
  {
    Client c(f.server->port());
    c.send(R"({"type":"generate","id":"a","prompt":"Once","max_tokens":8000,"ignore_eos":true})");
    c.send(R"({"type":"generate","id":"b","prompt":"Twice","max_tokens":8000,"ignore_eos":true})");
    c.receive();  // running
    c.close();
  }
  CHECK(f.kv_drains());
  CHECK(test::num_aborted_is(*f.metrics, 2));  // cancelled, not run to their end
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

TEST_CASE("one socket runs at most its share of requests: another socket is not held up",
          "[net][websocket][integration]") {
  Fixture f(1024, 512, 2);
  Client c(f.server->port());
  c.send(R"({"type":"generate","id":"a","prompt":"Once","max_tokens":300,"ignore_eos":true})");
  c.send(R"({"type":"generate","id":"b","prompt":"Twice","max_tokens":300,"ignore_eos":true})");
  c.send(R"({"type":"generate","id":"c","prompt":"Thrice","max_tokens":3})");
  test::Json refused;
  do refused = c.receive();  // a's and b's tokens stream meanwhile
  while (refused["type"].string != "error");
  CHECK(refused["id"].string == "c");
  CHECK(refused["error"]["code"].number == 429);
  CHECK_THAT(refused["error"]["message"].string,
             Catch::StartsWith("this socket already runs 2 requests"));
  // Another client's socket has its own share.
  Client other(f.server->port());
  other.send(R"({"type":"generate","id":"x","prompt":"Once","max_tokens":3})");
  test::Json last;
  do last = other.receive();
  while (last["type"].string == "token");
  CHECK(last["type"].string == "done");
  other.close();
  // A request that ends gives its place back.
  c.send(R"({"type":"cancel","id":"a"})");
  do last = c.receive();
  while (!(last["type"].string == "done" && last["id"].string == "a"));
  c.send(R"({"type":"generate","id":"d","prompt":"Again","max_tokens":3})");
  do last = c.receive();
  while (!(last["type"].string == "done" && last["id"].string == "d") &&
         last["type"].string != "error");
  CHECK(last["type"].string == "done");
  c.close();
}

TEST_CASE("a chat that must call a tool gets its call on the done frame",
          "[net][websocket][integration]") {
  Fixture f;
  Client c(f.server->port());
  // The random model's free output is gibberish: a well-formed call comes from the
  // constraint a named tool_choice puts on its arguments.
  c.send(R"({"type":"generate","id":"t","messages":[{"role":"user","content":"Weather?"}],)"
         R"("max_tokens":60,"temperature":0,"tools":[{"type":"function","function":)"
         R"({"name":"get_weather","parameters":{"type":"object","properties":)"
         R"({"city":{"type":"string","maxLength":6}},"required":["city"]}}}],)"
         R"("tool_choice":{"type":"function","function":{"name":"get_weather"}}})");
  test::Json done;
  std::string text;
  do {
    done = c.receive();
    text += done["text"].string;
  } while (done["type"].string == "token");
  REQUIRE(done["type"].string == "done");
  CHECK(done["finish_reason"].string == "tool_calls");
  CHECK(text.empty());  // the call is not content
  const auto& calls = done["tool_calls"].array;
  REQUIRE(calls.size() == 1);
  CHECK(calls[0]["type"].string == "function");
  CHECK(calls[0]["function"]["name"].string == "get_weather");
  const auto arguments = test::JsonParser(calls[0]["function"]["arguments"].string).parse();
  CHECK(arguments["city"].kind == test::Json::Kind::string);
  CHECK_THAT(calls[0]["id"].string, Catch::StartsWith("call_"));
  // Without tools, the same socket's chat is plain text.
  c.send(R"({"type":"generate","id":"u","messages":[{"role":"user","content":"Hi"}],)"
         R"("max_tokens":4,"temperature":0,"ignore_eos":true})");
  do done = c.receive();
  while (done["type"].string == "token");
  CHECK(done["finish_reason"].string == "length");
  CHECK_FALSE(done.object.contains("tool_calls"));
  c.close();
}

TEST_CASE("an error from the engine has the same status on the socket as over HTTP",
          "[net][websocket][integration]") {
  Fixture f;
  // The parser lets top_p 7 through; the engine refuses it when it is submitted.
  const std::string body = R"({"prompt":"Hi","max_tokens":3,"top_p":7})";
  test::RawClient http(f.server->port());
  REQUIRE(
      http.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                "Content-Type: application/json\r\nContent-Length: " +
                std::to_string(body.size()) + "\r\n\r\n" + body));
  const std::string answer = http.read_all(10s);
  const auto http_error = test::JsonParser(answer.substr(answer.find("\r\n\r\n") + 4)).parse();
  Client c(f.server->port());
  c.send(R"({"type":"generate","id":"x","prompt":"Hi","max_tokens":3,"top_p":7})");
  const auto frame = c.receive();
  REQUIRE(frame["type"].string == "error");
  CHECK(frame["error"]["code"].number == test::http_status(answer));
  CHECK(frame["error"]["code"].number == http_error["error"]["code"].number);
  CHECK(frame["error"]["type"].string == http_error["error"]["type"].string);
  CHECK(frame["error"]["message"].string == http_error["error"]["message"].string);
  c.close();
}

TEST_CASE("HTTP and the socket map engine errors to one status", "[net][websocket]") {
  // The engine failed: 500, as an HTTP error object and as a socket's error frame.
  const auto failed = net::api_error(Error{ErrorCode::internal, "the worker died"});
  CHECK(failed.status == 500);
  CHECK(failed.type == "internal_error");
  CHECK(failed.message == "the worker died");
  // The engine refused the request: 400.
  for (const auto code : {ErrorCode::invalid_argument, ErrorCode::out_of_range,
                          ErrorCode::unsupported, ErrorCode::invalid_file, ErrorCode::io}) {
    const auto refused = net::api_error(Error{code, "no"});
    CHECK(refused.status == 400);
    CHECK(refused.type == "invalid_request_error");
  }
  // A request that ends on an engine failure: the socket's frame says 500, as HTTP does.
  TokenEvent end;
  end.finished = true;
  end.finish_reason = FinishReason::error;
  end.error = "injected fault";
  CHECK(net::api_error(end).status == 500);
  const auto frame =
      test::JsonParser(net::websocket_event(net::ApiContext{}, "x", end, false)).parse();
  CHECK(frame["type"].string == "error");
  CHECK(frame["error"]["code"].number == 500);
  CHECK(frame["error"]["type"].string == "internal_error");
  CHECK(frame["error"]["message"].string == "injected fault");
}
