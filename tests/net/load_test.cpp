// 200 concurrent streaming clients on loopback, a third of them disconnecting
// at random points: no crash, no leaked blocks or connections, and every
// completed greedy stream equal to what the same request gives alone.
#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <catch2/catch.hpp>
#include <map>
#include <random>
#include <thread>

#include "net/http_server.hpp"
#include "support/small_model.hpp"
#include "troupe/engine.hpp"

using namespace troupe;
using namespace std::chrono_literals;
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

constexpr auto kUseTuple = asio::as_tuple(asio::use_awaitable);

struct Stream {
  std::string prompt;
  std::int32_t disconnect_after = -1;  // events; -1: read to the end
  std::string text;                    // concatenated "text" fields
  bool completed = false;
};

// The "text" values of the SSE events in `body` (our own server's JSON layout).
std::string texts(const std::string& body, int* num_events) {
  std::string out;
  *num_events = 0;
  for (std::size_t pos = 0; (pos = body.find("\"text\":\"", pos)) != std::string::npos;) {
    pos += 8;
    const std::size_t end = body.find("\",\"logprobs\"", pos);
    out += body.substr(pos, end - pos);
    ++*num_events;
  }
  return out;
}

asio::awaitable<void> client(std::uint16_t port, Stream& s) {
  auto ex = co_await asio::this_coro::executor;
  beast::tcp_stream stream(ex);
  auto [cec] = co_await stream.async_connect(
      tcp::endpoint(asio::ip::make_address("127.0.0.1"), port), kUseTuple);
  if (cec) co_return;
  http::request<http::string_body> req{http::verb::post, "/v1/completions", 11};
  req.set(http::field::host, "127.0.0.1");
  req.set(http::field::content_type, "application/json");
  req.body() = R"({"prompt":")" + s.prompt +
               R"(","max_tokens":24,"temperature":0,"ignore_eos":true,"stream":true})";
  req.prepare_payload();
  auto [wec, wn] = co_await http::async_write(stream, req, kUseTuple);
  if (wec) co_return;
  http::response_parser<http::string_body> parser;
  beast::flat_buffer buffer;
  auto [hec, hn] = co_await http::async_read_header(stream, buffer, parser, kUseTuple);
  if (hec) co_return;
  while (!parser.is_done()) {
    auto [ec, n] = co_await http::async_read_some(stream, buffer, parser, kUseTuple);
    if (ec) co_return;
    int events = 0;
    texts(parser.get().body(), &events);
    if (s.disconnect_after >= 0 && events >= s.disconnect_after) {
      beast::error_code ignored;
      stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
      stream.close();  // gone mid-stream
      co_return;
    }
  }
  int events = 0;
  s.text = texts(parser.get().body(), &events);
  s.completed = parser.get().body().find("data: [DONE]") != std::string::npos;
}

}  // namespace

TEST_CASE("200 concurrent streams, a third dropping out, leave nothing behind",
          "[net][load][slow]") {
  EngineConfig e;
  e.model_path = test::write_small_model("load-model",
                                         [](model::RandomModelSpec& s) { s.context_length = 256; });
  e.num_threads = 2;
  e.block_size = 4;
  e.num_kv_blocks = 1024;
  e.max_num_seqs = 64;
  auto engine = std::move(*Engine::create(e));
  net::ServerConfig config;
  config.port = 0;
  config.num_threads = 2;
  net::HttpServer server(*engine, config);
  REQUIRE(server.start().has_value());

  const std::vector<std::string> prompts = {"Once upon a time", "Hello world",
                                            "The quick brown fox", "In a galaxy far away",
                                            "Lily and Ben"};
  // Each prompt alone first: the reference outputs.
  std::map<std::string, std::string> alone;
  for (const auto& p : prompts) {
    Stream s;
    s.prompt = p;
    asio::io_context io;
    asio::co_spawn(io, client(server.port(), s), asio::detached);
    io.run();
    REQUIRE(s.completed);
    alone[p] = s.text;
  }
  // The idle actor count, read once it holds still: the reference requests' actors end a
  // moment after their streams do (a count read too early sat one above the idle one).
  std::int64_t baseline_actors = engine->stats().num_live_actors;
  for (int same = 0, i = 0; same < 10 && i < 500; ++i) {
    std::this_thread::sleep_for(20ms);
    const std::int64_t now = engine->stats().num_live_actors;
    same = now == baseline_actors ? same + 1 : 0;
    baseline_actors = now;
  }
  std::mt19937 rng(3);
  std::vector<Stream> streams(200);
  for (std::size_t i = 0; i < streams.size(); ++i) {
    streams[i].prompt = prompts[rng() % prompts.size()];
    if (i % 3 == 0) streams[i].disconnect_after = static_cast<int>(rng() % 20);
  }
  asio::io_context io;
  for (auto& s : streams) asio::co_spawn(io, client(server.port(), s), asio::detached);
  io.run();  // bounded: every stream ends (24 tokens, or its disconnect)

  int completed = 0;
  for (const auto& s : streams) {
    if (s.disconnect_after >= 0) continue;
    INFO(s.prompt);
    CHECK(s.completed);
    CHECK(s.text == alone[s.prompt]);
    completed += s.completed ? 1 : 0;
  }
  CHECK(completed == 133);
  // Nothing leaked: KV blocks, running sequences, connections.
  // (Up to 20 s: on a loaded machine the cancelled requests' actors take a while to end.)
  bool drained = false;
  EngineStats stats;
  for (int i = 0; i < 2000 && !drained; ++i) {
    stats = engine->stats();
    drained = stats.kv_usage == 0.0 && stats.num_running == 0 && stats.num_waiting == 0 &&
              server.num_connections() == 0 && stats.num_live_actors == baseline_actors;
    if (!drained) std::this_thread::sleep_for(10ms);
  }
  INFO("KV " << stats.kv_usage << ", running " << stats.num_running << ", waiting "
             << stats.num_waiting << ", connections " << server.num_connections() << ", actors "
             << stats.num_live_actors << " (baseline " << baseline_actors << ")");
  CHECK(drained);
  server.stop();
}
