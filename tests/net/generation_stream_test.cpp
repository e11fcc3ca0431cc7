// The generation stream both transports drive (net/generation_stream.hpp): one admission
// slot for all of a generation's choices, each choice's end once, the output bound, the
// scoring token and a read chat's text handled in one place, and one access-log line per
// request over SSE and over the socket.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <sstream>

#include "monitoring/log.hpp"
#include "net/generation_stream.hpp"
#include "net_test_support.hpp"
#include "support/raw_client.hpp"

using namespace troupe;
using namespace std::chrono_literals;
namespace asio = boost::asio;

namespace {

struct Fixture : test::ServedEngine {
  Fixture()
      : ServedEngine("generation-stream", net::ServerConfig{}, 256, 256,
                     [] { std::this_thread::sleep_for(1ms); }) {}
};

// A completion of `n` choices of `max_tokens` greedy tokens each (EOS ignored).
net::CompletionRequest completion(int n, int max_tokens) {
  net::CompletionRequest r;
  r.generate = test::greedy({1, 2, 3, 4, 5}, max_tokens);
  r.n = n;
  return r;
}

// What a stream gave, read to its end on the strand.
struct Run {
  std::vector<net::ChoiceEvent> events;
  net::AccessEntry entry;
  bool ended = false;
};

// The server's side of a generation, without the server: its gate, admission and strand.
struct Streams {
  explicit Streams(Engine& engine, int most_in_flight = 1024)
      : admission(std::make_shared<net::Admission>(most_in_flight)),
        drain(std::make_shared<net::Drain>()),
        shared{engine, std::make_shared<net::CallbackGate>(), admission, drain} {}

  static net::GenerationStream::Options options(bool streamed = true,
                                                std::size_t most_bytes = 1 << 20) {
    net::GenerationStream::Options o;
    o.streamed = streamed;
    o.output = std::make_shared<net::OutputBound>(most_bytes);
    o.busy_message = "full";
    return o;
  }
  tl::expected<std::shared_ptr<net::GenerationStream>, net::ApiError> start(
      const net::CompletionRequest& request, net::GenerationStream::Options o) {
    return net::GenerationStream::start(shared, request, std::move(o), strand);
  }
  Run read(const std::shared_ptr<net::GenerationStream>& stream) {
    Run run;
    auto work = asio::make_work_guard(io);
    auto reader = [&run, stream]() -> asio::awaitable<void> {
      while (true) {
        std::optional<net::ChoiceEvent> next = co_await stream->next(run.entry);
        if (!next) break;
        stream->taken(*next);
        run.events.push_back(std::move(*next));
      }
      run.ended = true;
    };
    asio::co_spawn(strand, reader, [&work](std::exception_ptr e) {
      work.reset();
      if (e) std::rethrow_exception(e);
    });
    io.restart();
    io.run_for(60s);
    return run;
  }

  asio::io_context io;
  asio::strand<asio::io_context::executor_type> strand = asio::make_strand(io);
  std::shared_ptr<net::Admission> admission;
  std::shared_ptr<net::Drain> drain;
  net::GenerationStream::Shared shared;
};

std::map<int, int> ends_per_choice(const Run& run) {
  std::map<int, int> ends;
  for (const auto& e : run.events) {
    if (e.event.finished) ++ends[e.index];
  }
  return ends;
}

}  // namespace

TEST_CASE("a generation holds one admission slot for all its choices, and each choice ends once",
          "[net][generation_stream]") {
  Fixture f;
  Streams streams(*f.engine, /*most_in_flight=*/1);
  auto started = streams.start(completion(3, 4), Streams::options());
  REQUIRE(started.has_value());
  CHECK((*started)->num_choices() == 3);
  CHECK(streams.admission->in_flight.load() == 1);
  // Full: the transport's words, as a 429.
  const auto refused = streams.start(completion(1, 4), Streams::options());
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().status == 429);
  CHECK(refused.error().message == "full");

  const Run run = streams.read(*started);
  REQUIRE(run.ended);
  CHECK(ends_per_choice(run) == std::map<int, int>{{0, 1}, {1, 1}, {2, 1}});
  CHECK(run.entry.output_tokens == 12);
  CHECK(run.entry.finish_reason == "length");
  CHECK(run.entry.ttft_seconds.has_value());
  for (const auto& e : run.events) CHECK_FALSE(e.read.has_value());  // a completion is not read
  // The slot came back when the last choice ended in the engine: the next one is admitted.
  CHECK(streams.admission->in_flight.load() == 0);
  auto again = streams.start(completion(1, 2), Streams::options());
  REQUIRE(again.has_value());
  CHECK(streams.read(*again).entry.output_tokens == 2);
  CHECK(f.kv_drains());
}

TEST_CASE("past the output bound a generation is cancelled once, and each choice's end still comes",
          "[net][generation_stream]") {
  Fixture f;
  Streams streams(*f.engine);
  int overflows = 0;
  auto options = Streams::options(true, /*most_bytes=*/1);  // the first event crosses it
  options.on_overflow = [&overflows] { ++overflows; };
  auto started = streams.start(completion(2, 200), std::move(options));
  REQUIRE(started.has_value());
  const Run run = streams.read(*started);
  REQUIRE(run.ended);
  CHECK(overflows == 1);
  CHECK((*started)->over());
  // Nothing but the choices' ends came through, each once: cancelled, not run to 200.
  for (const auto& e : run.events) CHECK(e.event.finished);
  CHECK(ends_per_choice(run) == std::map<int, int>{{0, 1}, {1, 1}});
  CHECK(run.entry.finish_reason == "abort");
  CHECK(streams.admission->in_flight.load() == 0);
  CHECK(test::num_aborted_is(*f.metrics, 2));
  CHECK(f.kv_drains());
}

TEST_CASE(
    "a drain refuses new generations with 503 and knows the running ones and a cut ends them "
    "as errors",
    "[net][generation_stream][drain]") {
  Fixture f;
  Streams streams(*f.engine);
  auto started = streams.start(completion(2, 200), Streams::options());
  REQUIRE(started.has_value());
  CHECK(streams.drain->num_live() == 1);
  {
    std::lock_guard lock(streams.drain->mutex);
    streams.drain->draining = true;
  }
  // Draining: refused before any slot is taken, with a time to come back.
  const auto refused = streams.start(completion(1, 4), Streams::options());
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().status == 503);
  CHECK(refused.error().retry_after_s == net::kDrainRetryAfterSeconds);
  CHECK(streams.admission->in_flight.load() == 1);
  // The drain's time is up: what runs is cancelled, and each choice ends as a failure the
  // transports turn into an error event (503), not as a client's abort.
  (*started)->cut();
  const Run run = streams.read(*started);
  REQUIRE(run.ended);
  CHECK(ends_per_choice(run) == std::map<int, int>{{0, 1}, {1, 1}});
  for (const auto& e : run.events) {
    if (!e.event.finished) continue;
    CHECK(e.event.finish_reason == FinishReason::error);
    CHECK(net::api_error(e.event).status == 503);
  }
  CHECK(run.entry.output_tokens < 400);
  // The transport is done with it: the drain stops waiting for it.
  CHECK(streams.drain->num_live() == 1);
  (*started)->detach();
  CHECK(streams.drain->num_live() == 1);
  {
    // The socket's way: its last frame holds the stream until the writer drops the frame.
    auto last = (*started)->finished_when_dropped();
    CHECK(streams.drain->num_live() == 1);
  }
  CHECK(streams.drain->num_live() == 0);
  (*started)->finished();  // once: a second time changes nothing
  CHECK(streams.drain->num_live() == 0);
  CHECK(streams.admission->in_flight.load() == 0);
  CHECK(f.kv_drains());
}

TEST_CASE("a prompt-scoring generation drops the one token the engine had to run",
          "[net][generation_stream]") {
  Fixture f;
  Streams streams(*f.engine);
  auto request = completion(1, 1);
  request.echo = true;
  request.score_only = true;
  auto started = streams.start(request, Streams::options(false));
  REQUIRE(started.has_value());
  const Run run = streams.read(*started);
  REQUIRE(run.ended);
  REQUIRE_FALSE(run.events.empty());
  for (const auto& e : run.events) {
    CHECK(e.event.token == kNoToken);
    CHECK(e.event.text.empty());
  }
  CHECK(run.events.back().event.finish_reason == FinishReason::length);
  CHECK(run.entry.output_tokens == 0);
  CHECK(run.entry.finish_reason == "length");
  CHECK_FALSE(run.entry.ttft_seconds.has_value());  // no token was given
}

TEST_CASE("a streamed chat's text is read in the stream: all of it thinking until its marker",
          "[net][generation_stream]") {
  Fixture f;
  Streams streams(*f.engine);
  // The same greedy output, once as it comes and once read as thinking (deepseek_r1
  // starts inside it; the small model never writes </think>).
  auto plain = streams.start(completion(1, 24), Streams::options());
  REQUIRE(plain.has_value());
  std::string text;
  for (const auto& e : streams.read(*plain).events) text += e.event.text;
  REQUIRE_FALSE(text.empty());
  REQUIRE(text.find("</think>") == std::string::npos);

  auto chat = completion(1, 24);
  chat.chat = true;
  chat.reasoning = text::ReasoningParser(text::ReasoningFormat::deepseek_r1, "");
  auto started = streams.start(chat, Streams::options());
  REQUIRE(started.has_value());
  const Run run = streams.read(*started);
  REQUIRE(run.ended);
  std::string reasoning;
  for (const auto& e : run.events) {
    REQUIRE(e.read.has_value());
    CHECK(e.event.text.empty());  // no answer: the text shown is what is read
    CHECK_FALSE(e.called);
    reasoning += e.read->reasoning;
  }
  CHECK(reasoning == text);
  // Not streamed, nothing is read here: the whole answer is read when it is rendered.
  auto whole = streams.start(chat, Streams::options(false));
  REQUIRE(whole.has_value());
  std::string unread;
  for (const auto& e : streams.read(*whole).events) {
    CHECK_FALSE(e.read.has_value());
    unread += e.event.text;
  }
  CHECK(unread == text);
}

namespace {

// What the process writes to stderr (the log) while it lives goes to a file instead.
class StderrCapture {
 public:
  StderrCapture() {
    std::fflush(stderr);
    saved_ = ::dup(2);
    const int fd = ::mkstemp(path_);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ~StderrCapture() {
    monitoring::flush_logging();
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    ::unlink(path_);
  }
  // The lines written so far that contain every one of `parts`.
  int count(std::initializer_list<std::string_view> parts) const {
    monitoring::flush_logging();
    std::fflush(stderr);
    std::ifstream in(path_);
    int n = 0;
    for (std::string line; std::getline(in, line);) {
      n += std::all_of(parts.begin(), parts.end(),
                       [&line](std::string_view p) { return line.find(p) != std::string::npos; });
    }
    return n;
  }
  // Waits (up to 5 s) until at least one such line is there; then how many there are.
  int wait_for(std::initializer_list<std::string_view> parts) const {
    for (int i = 0; i < 500 && count(parts) == 0; ++i) std::this_thread::sleep_for(10ms);
    std::this_thread::sleep_for(200ms);  // a second line would have come by now
    return count(parts);
  }

 private:
  char path_[32] = "/tmp/troupe-log-XXXXXX";
  int saved_ = -1;
};

std::string post(const std::string& path, const std::string& request_id, const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
         "X-Request-Id: " + request_id + "\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

}  // namespace

TEST_CASE("each request gets one access-log line, over SSE, as JSON and on the socket",
          "[net][generation_stream][integration]") {
  const StderrCapture log;
  monitoring::configure_logging(monitoring::LogLevel::info, monitoring::LogFormat::json);
  {
    Fixture f;
    const std::uint16_t port = f.server->port();
    {
      test::RawClient http(port);
      REQUIRE(http.send(
          post("/v1/completions", "sse-once",
               R"({"prompt":"Hi","max_tokens":3,"n":2,"stream":true,"ignore_eos":true})")));
      CHECK_THAT(http.read_until("[DONE]", 30s), Catch::Contains("[DONE]"));
      REQUIRE(http.send(post(
          "/v1/chat/completions", "json-once",
          R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":3,"ignore_eos":true})")));
      CHECK_THAT(http.read_until("\"usage\"", 30s), Catch::Contains("chat.completion"));
    }
    {
      asio::io_context io;
      boost::beast::websocket::stream<asio::ip::tcp::socket> ws(io);
      ws.next_layer().connect({asio::ip::make_address("127.0.0.1"), port});
      ws.handshake("127.0.0.1", "/v1/ws");
      ws.write(asio::buffer(std::string(
          R"({"type":"generate","id":"ws-once","prompt":"Hi","max_tokens":3,"ignore_eos":true})")));
      std::string frames;
      while (frames.find(R"("type":"done")") == std::string::npos) {
        boost::beast::flat_buffer buffer;
        ws.read(buffer);
        frames += boost::beast::buffers_to_string(buffer.data());
      }
      ws.close(boost::beast::websocket::close_code::normal);
    }
    const int sse_lines =
        log.wait_for({R"("message":"request")", R"("request_id":"sse-once")", R"("status":200)",
                      R"("output_tokens":6)", R"("finish_reason":"length")"});
    CHECK(sse_lines == 1);
    const int json_lines = log.wait_for(
        {R"("message":"request")", R"("request_id":"json-once")", R"("output_tokens":3)"});
    CHECK(json_lines == 1);
    const int ws_lines =
        log.wait_for({R"("message":"request")", R"("method":"WS")", R"("request_id":"ws-once")",
                      R"("output_tokens":3)", R"("client_gone":false)"});
    CHECK(ws_lines == 1);
  }
  monitoring::configure_logging(monitoring::LogLevel::info, monitoring::LogFormat::text);
}
