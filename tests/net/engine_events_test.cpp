// GET /v1/engine/events, the live page's view of the engine: one event per step with who
// ran and how, over a real server; the API key there and on a browser's WebSocket.
#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <catch2/catch.hpp>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "monitoring/step_events.hpp"
#include "net/http_server.hpp"
#include "support/engine_support.hpp"
#include "support/mini_json.hpp"
#include "support/raw_client.hpp"
#include "support/small_model.hpp"
#include "troupe/engine.hpp"

using namespace troupe;
using namespace std::chrono_literals;
namespace asio = boost::asio;
namespace http = boost::beast::http;
namespace websocket = boost::beast::websocket;
using tcp = asio::ip::tcp;

namespace {

constexpr std::int32_t kBlocks = 256;

// A server and its engine publishing into one hub.
struct Watched {
  // `draft`: the model is its own draft model (speculative decoding, 3 tokens a step).
  explicit Watched(std::string api_key = {}, std::int32_t num_replicas = 1, bool draft = false) {
    EngineConfig e = test::small_engine_config(test::write_small_model("events-model"), 2, kBlocks);
    e.data_parallel_size = num_replicas;
    e.max_model_len = 512;
    e.max_num_batched_tokens = 4;  // a 10-token prompt runs in chunks of 4, 4 and 2
    e.step_events = events;
    if (draft) {
      e.max_num_batched_tokens = 64;
      e.speculative.num_speculative_tokens = 3;
      e.speculative.draft_model = e.model_path;
    }
    auto created = Engine::create(e);
    INFO((created ? std::string() : created.error().message));
    REQUIRE(created.has_value());
    engine = std::move(*created);
    net::ServerConfig config;
    config.port = 0;
    config.api_key = std::move(api_key);
    config.step_events = events;
    server = std::make_unique<net::HttpServer>(*engine, config);
    REQUIRE(server->start().has_value());
  }
  ~Watched() { server->stop(); }

  // Runs one greedy request to its end; its engine id.
  RequestId generate(std::vector<TokenId> prompt, int max_tokens) {
    std::mutex mutex;
    std::condition_variable cv;
    bool finished = false;
    auto id = engine->submit(test::greedy(std::move(prompt), max_tokens), [&](const TokenEvent& t) {
      std::lock_guard lock(mutex);
      if (t.finished) {
        finished = true;
        cv.notify_all();
      }
    });
    REQUIRE(id.has_value());
    std::unique_lock lock(mutex);
    REQUIRE(cv.wait_for(lock, 30s, [&] { return finished; }));
    return *id;
  }

  bool unwatched_soon() const {
    for (int i = 0; i < 200 && events->watched(); ++i) std::this_thread::sleep_for(10ms);
    return !events->watched();
  }

  std::shared_ptr<monitoring::StepEvents> events = std::make_shared<monitoring::StepEvents>();
  std::unique_ptr<Engine> engine;
  std::unique_ptr<net::HttpServer> server;
};

std::string events_request(const std::string& key = {}) {
  return "GET /v1/engine/events HTTP/1.1\r\nHost: localhost\r\n" +
         (key.empty() ? std::string() : "Authorization: Bearer " + key + "\r\n") + "\r\n";
}

// The stream up to `marker` and the end of the line it is in: a read stops wherever the
// marker arrived, which may be in the middle of its event.
std::string read_event(test::RawClient& viewer, const std::string& marker,
                       std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string stream = viewer.read_until(marker, timeout);
  while (true) {
    const auto at = stream.find(marker);
    if (at == std::string::npos || stream.find('\n', at) != std::string::npos) return stream;
    if (std::chrono::steady_clock::now() > deadline) return stream;
    stream = viewer.read_until("\n\n\n", 10ms);  // never sent: what comes in 10 ms
  }
}

// Every whole `data:` line's object, in order (a line the read stopped inside is left out).
std::vector<test::Json> data_objects(const std::string& stream) {
  std::vector<test::Json> objects;
  std::size_t at = 0;
  while ((at = stream.find("data: ", at)) != std::string::npos) {
    const auto end = stream.find('\n', at);
    if (end == std::string::npos) break;
    objects.push_back(test::JsonParser(stream.substr(at + 6, end - at - 6)).parse());
    at = end;
  }
  return objects;
}

std::string base64url(const std::string& bytes) {
  static constexpr char kDigits[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  std::uint32_t bits = 0;
  int num_bits = 0;
  for (const unsigned char c : bytes) {
    bits = (bits << 8) | c;
    num_bits += 8;
    while (num_bits >= 6) {
      num_bits -= 6;
      out += kDigits[(bits >> num_bits) & 63];
    }
  }
  if (num_bits > 0) out += kDigits[(bits << (6 - num_bits)) & 63];
  return out;
}

// A WebSocket handshake offering these subprotocols; the answer's status and protocol.
std::pair<int, std::string> ws_handshake(std::uint16_t port, const std::string& protocols,
                                         websocket::stream<tcp::socket>& ws) {
  tcp::resolver resolver(ws.get_executor());
  asio::connect(ws.next_layer(), resolver.resolve("127.0.0.1", std::to_string(port)));
  ws.set_option(websocket::stream_base::decorator([protocols](websocket::request_type& r) {
    r.set(http::field::sec_websocket_protocol, protocols);
  }));
  websocket::response_type response;
  boost::system::error_code ec;
  ws.handshake(response, "127.0.0.1", "/v1/ws", ec);
  return {static_cast<int>(response.result_int()),
          std::string(response[http::field::sec_websocket_protocol])};
}

}  // namespace

TEST_CASE("the event stream shows a request's prefill chunks, its decodes and its end",
          "[net][integration]") {
  Watched w;
  test::RawClient viewer(w.server->port());
  REQUIRE(viewer.send(events_request()));
  const std::string head = viewer.read_until(R"("type":"hello")", 5s);
  CHECK(test::http_status(head) == 200);
  CHECK(head.find("Content-Type: text/event-stream") != std::string::npos);
  REQUIRE(w.events->watched());

  std::vector<TokenId> prompt;
  for (int i = 0; i < 10; ++i) prompt.push_back(static_cast<TokenId>(5 + 7 * i));
  const RequestId id = w.generate(prompt, 5);
  const std::string ended =
      R"("finished":[{"id":)" + std::to_string(id) + R"(,"reason":"length"}])";
  const auto objects = data_objects(read_event(viewer, ended, 5s));
  REQUIRE(!objects.empty());
  CHECK(objects.front()["type"].string == "hello");
  CHECK(objects.front()["replicas"].number == 1);

  // The request's share of each step: prefill chunks of the budget, then one-token decodes.
  std::vector<int> prefill_chunks;
  int num_decodes = 0;
  int num_first_tokens = 0;
  int num_generated = 0;
  double last_step = 0;
  std::string reason;
  for (std::size_t i = 1; i < objects.size(); ++i) {
    const test::Json& e = objects[i];
    REQUIRE(e["type"].string == "step");
    CHECK(e["step"].number > last_step);
    last_step = e["step"].number;
    CHECK(e["dropped"].number == 0);
    CHECK(e["kv_blocks"].number == kBlocks);
    CHECK(e["step_ms"].number >= 0);
    CHECK(e["round_trip_ms"].number >= e["step_ms"].number);
    num_generated += static_cast<int>(e["generated_tokens"].number);
    for (const auto& b : e["batch"].array) {
      if (b["id"].number != static_cast<double>(id)) continue;
      if (b.object.count("prefill"))
        prefill_chunks.push_back(static_cast<int>(b["prefill"].number));
      if (b.object.count("decode")) {
        CHECK(b["decode"].number == 1);
        CHECK(!prefill_chunks.empty());  // after its prompt
        ++num_decodes;
      }
    }
    for (const auto& f : e["first_tokens"].array) {
      if (f["id"].number != static_cast<double>(id)) continue;
      ++num_first_tokens;
      CHECK(f["ttft_ms"].number > 0);
      CHECK(num_decodes == 0);  // with the last chunk of its prompt
    }
    for (const auto& f : e["finished"].array) {
      if (f["id"].number == static_cast<double>(id)) reason = f["reason"].string;
    }
  }
  CHECK(prefill_chunks == std::vector<int>{4, 4, 2});
  CHECK(num_decodes == 4);  // the first of its 5 tokens came with the prompt's last chunk
  CHECK(num_first_tokens == 1);
  CHECK(num_generated == 5);  // every token sampled, the first one too
  CHECK(reason == "length");
  const test::Json& last = objects.back();
  CHECK(last["running"].number == 0);
  CHECK(last["kv_usage"].number == 0);
  CHECK(last["prefix_queried_tokens"].number > 0);

  // A cancel comes with the next step.
  GenerateRequest held = test::greedy({3, 4, 5, 6}, 400);
  std::atomic<int> num_tokens{0};
  const auto cancelled = w.engine->submit(held, [&](const TokenEvent&) { ++num_tokens; });
  REQUIRE(cancelled.has_value());
  while (num_tokens.load() < 3) std::this_thread::sleep_for(1ms);
  w.engine->cancel(*cancelled);
  w.generate({9, 10}, 2);
  CHECK(viewer.read_until(R"({"id":)" + std::to_string(*cancelled) + R"(,"reason":"abort"})", 5s)
            .find(R"(,"reason":"abort"})") != std::string::npos);

  viewer.close();
  CHECK(w.unwatched_soon());  // seen at once, though the engine is idle
}

TEST_CASE("a decode with a draft shows how many tokens it proposed and how many were accepted",
          "[net][integration][speculative]") {
  Watched w({}, 1, /*draft=*/true);
  test::RawClient viewer(w.server->port());
  REQUIRE(viewer.send(events_request()));
  viewer.read_until(R"("type":"hello")", 5s);
  REQUIRE(w.events->watched());
  const RequestId id = w.generate({5, 12, 19, 26, 33}, 24);
  const auto objects = data_objects(
      read_event(viewer, R"("finished":[{"id":)" + std::to_string(id) + R"(,"reason")", 5s));
  int drafted = 0, accepted = 0, steps_with_drafts = 0;
  for (const auto& e : objects) {
    if (e["type"].string != "step") continue;
    for (const auto& b : e["batch"].array) {
      if (b["id"].number != static_cast<double>(id) || !b.object.count("drafted")) continue;
      ++steps_with_drafts;
      // The decode runs its own token and the proposed ones.
      CHECK(b["decode"].number == 1 + b["drafted"].number);
      CHECK(b["accepted"].number <= b["drafted"].number);
      CHECK(e["drafted_tokens"].number >= b["drafted"].number);
      drafted += static_cast<int>(b["drafted"].number);
      accepted += static_cast<int>(b["accepted"].number);
    }
  }
  CHECK(steps_with_drafts > 0);
  // The model is its own draft and decodes greedily: it accepts every proposal.
  CHECK(accepted == drafted);
  CHECK(accepted > 0);
}

TEST_CASE("a viewer that reads nothing never holds the engine up", "[net][integration]") {
  Watched w;
  test::RawClient viewer(w.server->port(), 2048);
  REQUIRE(viewer.send(events_request()));
  REQUIRE(viewer.read_until(R"("type":"hello")", 5s).find("hello") != std::string::npos);
  // Many steps of output while it reads nothing: more than its socket's buffers hold.
  std::vector<std::thread> clients;
  for (int c = 0; c < 4; ++c) {
    clients.emplace_back([&w, c] {
      for (int r = 0; r < 3; ++r) w.generate({static_cast<TokenId>(3 + c), 8, 9, 10, 11}, 120);
    });
  }
  for (auto& t : clients) t.join();  // generate() REQUIREs each end within 30 s
  CHECK(test::kv_drains(*w.engine));
  // What it reads now is a stream still whole: events, each told what it missed before it.
  const auto objects = data_objects(read_event(viewer, "\"running\":0,", 5s));
  CHECK(objects.size() > 1);
  viewer.close();
  CHECK(w.unwatched_soon());
}

TEST_CASE(
    "with an API key, the stream needs it, and a browser's socket offers it as a "
    "subprotocol",
    "[net][integration]") {
  Watched w("s3cret key/+");
  {
    test::RawClient anonymous(w.server->port());
    REQUIRE(anonymous.send(events_request()));
    CHECK(test::http_status(anonymous.read_until("\r\n\r\n", 5s)) == 401);
    test::RawClient keyed(w.server->port());
    REQUIRE(keyed.send(events_request("s3cret key/+")));
    CHECK(test::http_status(keyed.read_until("hello", 5s)) == 200);
  }
  asio::io_context io;
  SECTION("the right key, beside 'troupe': the socket opens and names 'troupe'") {
    websocket::stream<tcp::socket> ws(io);
    const auto [status, protocol] =
        ws_handshake(w.server->port(), "troupe, troupe.bearer." + base64url("s3cret key/+"), ws);
    CHECK(status == 101);
    CHECK(protocol == "troupe");
    // Its frames name the engine's id, as the event stream does.
    ws.write(asio::buffer(std::string(
        R"({"type":"generate","id":"a","prompt":[5,6,7],"max_tokens":2,"ignore_eos":true})")));
    boost::beast::flat_buffer buffer;
    ws.read(buffer);
    const auto frame = test::JsonParser(boost::beast::buffers_to_string(buffer.data())).parse();
    CHECK(frame["id"].string == "a");
    CHECK(frame["request"].kind == test::Json::Kind::number);
    ws.close(websocket::close_code::normal);
  }
  SECTION("a wrong key: refused") {
    websocket::stream<tcp::socket> ws(io);
    CHECK(ws_handshake(w.server->port(), "troupe, troupe.bearer." + base64url("guess"), ws).first ==
          401);
  }
  SECTION("no key: refused") {
    websocket::stream<tcp::socket> ws(io);
    CHECK(ws_handshake(w.server->port(), "troupe", ws).first == 401);
  }
}

TEST_CASE("with two replicas, each one's steps come with its number", "[net][integration]") {
  Watched w({}, 2);
  test::RawClient viewer(w.server->port());
  REQUIRE(viewer.send(events_request()));
  const auto hello = viewer.read_until(R"("type":"hello")", 5s);
  REQUIRE(hello.find(R"("replicas":2)") != std::string::npos);
  // Enough requests at once that the router spreads them over both.
  std::vector<std::thread> clients;
  for (int c = 0; c < 6; ++c) {
    clients.emplace_back([&w, c] { w.generate({static_cast<TokenId>(40 + 9 * c), 5, 6}, 30); });
  }
  for (auto& t : clients) t.join();
  // Either replica's steps may come first: read until both have (the reads accumulate).
  viewer.read_until(R"("replica":1,)", 5s);
  const std::string stream = viewer.read_until(R"("replica":0,)", 5s);
  CHECK(stream.find(R"("replica":0,)") != std::string::npos);
  CHECK(stream.find(R"("replica":1,)") != std::string::npos);
}

TEST_CASE("without a hub the stream is a 404", "[net][integration]") {
  EngineConfig e;
  e.model_path = test::write_small_model("events-model");
  e.num_threads = 1;
  e.num_kv_blocks = 64;
  e.max_model_len = 128;
  auto engine = Engine::create(e);
  INFO((engine ? std::string() : engine.error().message));
  REQUIRE(engine.has_value());
  net::ServerConfig config;
  config.port = 0;
  net::HttpServer server(**engine, config);
  REQUIRE(server.start().has_value());
  test::RawClient client(server.port());
  REQUIRE(client.send(events_request()));
  CHECK(test::http_status(client.read_until("\r\n\r\n", 5s)) == 404);
  server.stop();
}
