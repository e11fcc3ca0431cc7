// bench/serve_client without a real server: what it reads of /v1/models, what it refuses
// before sending a request, and vLLM's summary block, line for line. A small in-process HTTP
// server stands in where the client must ask one.
#include "bench/serve_client.hpp"

#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <boost/json.hpp>
#include <catch2/catch.hpp>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>

using namespace troupe;
using bench::ServedModel;

namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;

// Answers every request on loopback with `answer(target)` (status, JSON body) and records the
// targets asked, one connection and one request at a time.
class FakeServer {
 public:
  using Answer = std::function<std::pair<unsigned, std::string>(const std::string& target)>;

  explicit FakeServer(Answer answer) : answer_(std::move(answer)) {
    acceptor_.open(tcp::v4());
    acceptor_.bind({asio::ip::make_address("127.0.0.1"), 0});
    acceptor_.listen();
    accept();
    thread_ = std::thread([this] { io_.run(); });
  }
  FakeServer(const FakeServer&) = delete;
  FakeServer& operator=(const FakeServer&) = delete;
  ~FakeServer() {
    io_.stop();
    thread_.join();
  }

  std::uint16_t port() const { return acceptor_.local_endpoint().port(); }

  std::vector<std::string> targets() const {
    std::lock_guard lock(mutex_);
    return targets_;
  }

 private:
  void accept() {
    acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
      if (ec) return;
      boost::beast::flat_buffer buffer;
      http::request<http::string_body> request;
      http::read(socket, buffer, request, ec);
      if (!ec) {
        const std::string target(request.target());
        {
          std::lock_guard lock(mutex_);
          targets_.push_back(target);
        }
        const auto [status, body] = answer_(target);
        http::response<http::string_body> response{static_cast<http::status>(status), 11};
        // A body of server-sent events streams as a server's does: chunked.
        const bool events = body.rfind("data: ", 0) == 0;
        response.set(http::field::content_type, events ? "text/event-stream" : "application/json");
        response.body() = body;
        if (events) {
          response.chunked(true);
        } else {
          response.prepare_payload();
        }
        http::write(socket, response, ec);
      }
      accept();
    });
  }

  Answer answer_;
  asio::io_context io_;
  tcp::acceptor acceptor_{io_};
  std::thread thread_;
  mutable std::mutex mutex_;
  std::vector<std::string> targets_;
};

bench::ServeOptions options_for(std::uint16_t port) {
  bench::ServeOptions o;
  o.port = port;
  o.workload.num_prompts = 4;
  o.workload.input_len = 16;
  o.workload.output_len = 8;
  o.progress = false;
  return o;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

TEST_CASE("/v1/models gives the model's name, vocabulary and context length", "[bench]") {
  const std::string two =
      R"({"object":"list","data":[{"id":"a","vocab_size":512,"max_model_len":256},)"
      R"({"id":"b","vocab_size":32000,"max_model_len":4096}]})";
  SECTION("without --model, the first model served") {
    const auto m = bench::parse_served_model(two, "");
    REQUIRE(m);
    CHECK(m->id == "a");
    CHECK(m->vocab_size == 512);
    CHECK(m->max_model_len == 256);
  }
  SECTION("with --model, that one") {
    const auto m = bench::parse_served_model(two, "b");
    REQUIRE(m);
    CHECK(m->id == "b");
    CHECK(m->vocab_size == 32000);
  }
  SECTION("a model the server does not serve is an error naming those it does") {
    const auto m = bench::parse_served_model(two, "c");
    REQUIRE_FALSE(m);
    CHECK(m.error().message == "the server does not serve 'c' (it serves 'a', 'b')");
  }
  SECTION("vLLM's entries have no vocab_size: it reads as 0") {
    const auto m = bench::parse_served_model(R"({"data":[{"id":"x","max_model_len":2048}]})", "");
    REQUIRE(m);
    CHECK(m->vocab_size == 0);
    CHECK(m->max_model_len == 2048);
  }
  SECTION("no model, or no JSON, is an error") {
    CHECK_FALSE(bench::parse_served_model(R"({"data":[]})", ""));
    CHECK_FALSE(bench::parse_served_model("not json", ""));
  }
}

TEST_CASE("a request longer than max_model_len is refused before anything is sent", "[bench]") {
  const std::vector<bench::BenchRequest> requests{{std::vector<TokenId>(100, 300), 28},
                                                  {std::vector<TokenId>(100, 300), 29}};
  CHECK(bench::check_fits(requests, 129));
  CHECK(bench::check_fits(requests, 0));  // unknown: nothing to check
  const auto refused = bench::check_fits(requests, 128);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().message ==
        "a request of 100 prompt and 29 output tokens exceeds the server's max_model_len of "
        "128: lower --random-input-len or --random-output-len");

  FakeServer server([](const std::string&) {
    return std::pair{200u,
                     std::string(R"({"data":[{"id":"m","vocab_size":512,"max_model_len":20}]})")};
  });
  const auto result = bench::run_serve_benchmark(options_for(server.port()));
  REQUIRE_FALSE(result);
  CHECK(result.error().message.find("max_model_len of 20") != std::string::npos);
  for (const auto& target : server.targets()) CHECK(target != "/v1/completions");
}

TEST_CASE("a server that does not report its vocabulary asks for --vocab-size", "[bench]") {
  FakeServer server([](const std::string&) {
    return std::pair{200u, std::string(R"({"data":[{"id":"m","max_model_len":2048}]})")};
  });
  const auto result = bench::run_serve_benchmark(options_for(server.port()));
  REQUIRE_FALSE(result);
  CHECK(result.error().message.find("pass --vocab-size") != std::string::npos);
  CHECK(server.targets() == std::vector<std::string>{"/v1/models"});
}

TEST_CASE("a vocabulary with no ids past the byte tokens is refused, saying so", "[bench]") {
  FakeServer server([](const std::string& target) {
    if (target == "/detokenize") return std::pair{200u, std::string(R"({"prompt":"x"})")};
    return std::pair{200u, std::string(R"({"data":[{"id":"m","vocab_size":259}]})")};
  });
  const auto result = bench::run_serve_benchmark(options_for(server.port()));
  REQUIRE_FALSE(result);
  CHECK(result.error().message ==
        "prompt ids are drawn from 259 (past the byte tokens) up, but the vocabulary has 259 "
        "tokens");
}

TEST_CASE("a server that cannot be reached is an error naming it", "[bench]") {
  std::uint16_t port = 0;
  {
    FakeServer closed([](const std::string&) { return std::pair{200u, std::string()}; });
    port = closed.port();
  }
  const auto result = bench::run_serve_benchmark(options_for(port));
  REQUIRE_FALSE(result);
  CHECK(result.error().message.rfind("cannot reach http://127.0.0.1:" + std::to_string(port), 0) ==
        0);
}

TEST_CASE("a stream's events: tokens, and the usage wherever a server puts it", "[bench]") {
  SECTION("troupe's and vLLM's: text events, then the usage with no choices") {
    const auto token = bench::read_stream_event(
        R"({"id":"c","object":"text_completion","choices":[{"index":0,"text":" a",)"
        R"("logprobs":null,"finish_reason":null}]})");
    CHECK(token.token);
    CHECK(token.completion_tokens == -1);
    const auto last = bench::read_stream_event(
        R"({"choices":[{"index":0,"text":"b","finish_reason":"length"}]})");
    CHECK(last.token);
    const auto usage = bench::read_stream_event(
        R"({"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":7,"total_tokens":11}})");
    CHECK_FALSE(usage.token);
    CHECK(usage.completion_tokens == 7);
  }
  SECTION("llama.cpp's: the usage on a final choice with no text, which is no token") {
    const auto last = bench::read_stream_event(
        R"({"choices":[{"text":"","index":0,"logprobs":null,"finish_reason":"length"}],)"
        R"("object":"text_completion","usage":{"completion_tokens":8,"prompt_tokens":16}})");
    CHECK_FALSE(last.token);
    CHECK(last.completion_tokens == 8);
  }
  SECTION("a chat stream's deltas, and an event with no text yet whose stream goes on") {
    CHECK(bench::read_stream_event(R"({"choices":[{"delta":{"content":"x"}}]})").token);
    CHECK(bench::read_stream_event(R"({"choices":[{"text":"","finish_reason":null}]})").token);
  }
  SECTION("what is not an event of a completion is no token and no usage") {
    for (const char* other : {"not json", "[1,2]", "{}", R"({"choices":[1]})", R"({"error":{}})",
                              R"({"usage":{"completion_tokens":"7"}})"}) {
      const auto read = bench::read_stream_event(other);
      CHECK_FALSE(read.token);
      CHECK(read.completion_tokens == -1);
    }
  }
}

namespace {

// A stream of `tokens` text events as llama.cpp's server sends it, its usage on the last.
std::string llama_cpp_stream(std::int32_t tokens, bool with_usage) {
  std::string body;
  for (std::int32_t i = 0; i < tokens; ++i) {
    body += R"(data: {"choices":[{"text":"t","index":0,"logprobs":null,"finish_reason":null}],)"
            R"("object":"text_completion"})"
            "\n\n";
  }
  body += R"(data: {"choices":[{"text":"","index":0,"logprobs":null,"finish_reason":"length"}])";
  if (with_usage) body += R"(,"usage":{"completion_tokens":)" + std::to_string(tokens) + "}";
  return body + "}\n\ndata: [DONE]\n\n";
}

}  // namespace

TEST_CASE("llama.cpp's server is measured: its usage, or its events where it sends none",
          "[bench]") {
  const bool with_usage = GENERATE(true, false);
  FakeServer server([with_usage](const std::string& target) {
    if (target == "/v1/completions") return std::pair{200u, llama_cpp_stream(8, with_usage)};
    if (target == "/detokenize") return std::pair{200u, std::string(R"({"content":"x"})")};
    // llama.cpp's /v1/models reports no vocabulary size: the command line gives it.
    return std::pair{200u, std::string(R"({"object":"list","data":[{"id":"m"}]})")};
  });
  auto o = options_for(server.port());
  o.workload.vocab_size = 512;
  const auto result = bench::run_serve_benchmark(o);
  REQUIRE(result);
  CHECK(result->first_error.empty());
  CHECK(result->totals.completed == 4);
  CHECK(result->totals.failed == 0);
  // Eight tokens a request: the closing event, with no text, is none.
  CHECK(result->totals.total_output_tokens == 32);
}

TEST_CASE("the summary is vLLM's block, line for line", "[bench]") {
  bench::ServeOptions o;
  o.max_concurrency = 4;
  bench::ServeResult r;
  r.totals.completed = 8;
  r.totals.total_input_tokens = 128;
  r.totals.total_output_tokens = 64;
  r.totals.set_duration(2.0);
  r.total_token_throughput = 96.0;
  r.latency.ttft_ms = {10.0, 9.5, 20.25};
  r.latency.tpot_ms = {1.0, 1.0, 2.0};
  r.latency.itl_ms = {1.5, 1.25, 3.0};
  r.percentiles = {{"ttft", {{99.0, 20.25}}}, {"tpot", {{99.0, 2.0}}}, {"itl", {{99.0, 3.0}}}};
  const auto lines = lines_of(bench::summary(o, r));
  const std::vector<std::string> expected{
      "============ Serving Benchmark Result ============",
      "Successful requests:                     8         ",
      "Failed requests:                         0         ",
      "Maximum request concurrency:             4         ",
      "Benchmark duration (s):                  2.00      ",
      "Total input tokens:                      128       ",
      "Total generated tokens:                  64        ",
      "Request throughput (req/s):              4.00      ",
      "Output token throughput (tok/s):         32.00     ",
      "Total Token throughput (tok/s):          96.00     ",
      "---------------Time to First Token----------------",
      "Mean TTFT (ms):                          10.00     ",
      "Median TTFT (ms):                        9.50      ",
      "P99 TTFT (ms):                           20.25     ",
      "-----Time per Output Token (excl. 1st token)------",
      "Mean TPOT (ms):                          1.00      ",
      "Median TPOT (ms):                        1.00      ",
      "P99 TPOT (ms):                           2.00      ",
      "---------------Inter-token Latency----------------",
      "Mean ITL (ms):                           1.50      ",
      "Median ITL (ms):                         1.25      ",
      "P99 ITL (ms):                            3.00      ",
      "==================================================",
  };
  CHECK(lines == expected);
  SECTION("a configured rate is shown, no concurrency line without a limit") {
    o.max_concurrency = 0;
    o.request_rate = 2.5;
    const auto with_rate = lines_of(bench::summary(o, r));
    CHECK(with_rate[3] == "Request rate configured (RPS):           2.50      ");
    CHECK(std::find(with_rate.begin(), with_rate.end(), expected[3]) == with_rate.end());
  }
  SECTION("objectives add vLLM's goodput line after the request throughput") {
    o.goodput.ttft_ms = 4000.0;
    r.request_goodput = 3.5;
    const auto with_goodput = lines_of(bench::summary(o, r));
    REQUIRE(with_goodput.size() == expected.size() + 1);
    CHECK(with_goodput[7] == expected[7]);
    CHECK(with_goodput[8] == "Request goodput (req/s):                 3.50      ");
    CHECK(with_goodput[9] == expected[8]);
  }
  SECTION("the metrics and percentiles asked for, in vLLM's order and labels") {
    o.percentile_metrics = {"ttft", "e2el"};
    o.metric_percentiles = {50.0, 99.9};
    r.latency.e2el_ms = {100.0, 90.0, 300.0};
    r.percentiles = {{"ttft", {{50.0, 9.5}, {99.9, 20.25}}},
                     {"e2el", {{50.0, 90.0}, {99.9, 300.0}}}};
    const auto lines_asked = lines_of(bench::summary(o, r));
    const std::vector<std::string> tail(lines_asked.begin() + 10, lines_asked.end());
    CHECK(tail == std::vector<std::string>{
                      "---------------Time to First Token----------------",
                      "Mean TTFT (ms):                          10.00     ",
                      "Median TTFT (ms):                        9.50      ",
                      "P50 TTFT (ms):                           9.50      ",
                      "P99.9 TTFT (ms):                         20.25     ",
                      "----------------End-to-end Latency----------------",
                      "Mean E2EL (ms):                          100.00    ",
                      "Median E2EL (ms):                        90.00     ",
                      "P50 E2EL (ms):                           90.00     ",
                      "P99.9 E2EL (ms):                         300.00    ",
                      "==================================================",
                  });
  }
}

TEST_CASE("the asked percentiles are the nearest ranks of each metric's samples", "[bench]") {
  bench::ServeOptions o;
  o.percentile_metrics = {"ttft", "tpot", "e2el"};
  o.metric_percentiles = {25.0, 50.0, 100.0};
  bench::LatencySamples samples;
  const auto t0 = bench::LatencySamples::Clock::now();
  using ms = std::chrono::milliseconds;
  // Four requests: TTFT 10, 20, 30, 40 ms; 5 tokens each, 10 ms apart (TPOT 10 ms).
  for (int i = 1; i <= 4; ++i) {
    samples.add(t0, t0 + ms(10 * i), t0 + ms(10 * i + 40), 5, {10.0, 10.0, 10.0, 10.0});
  }
  const auto selected = bench::select_percentiles(o, samples);
  REQUIRE(selected.size() == 3u);
  CHECK(selected[0].metric == "ttft");
  CHECK(selected[0].values ==
        std::vector<std::pair<double, double>>{{25.0, 10.0}, {50.0, 20.0}, {100.0, 40.0}});
  CHECK(selected[1].metric == "tpot");
  CHECK(selected[1].values[2].second == Approx(10.0));
  CHECK(selected[2].metric == "e2el");
  CHECK(selected[2].values[0].second == Approx(50.0));
  CHECK(selected[2].values[2].second == Approx(80.0));
}

TEST_CASE("the JSON result carries vLLM's totals", "[bench]") {
  bench::ServeOptions o;
  bench::ServeResult r;
  r.server.id = "stories";
  r.totals.completed = 3;
  r.totals.total_input_tokens = 30;
  r.totals.total_output_tokens = 12;
  r.totals.set_duration(1.0);
  r.total_token_throughput = 42.0;
  const auto json = boost::json::parse(bench::to_json(o, r)).as_object();
  CHECK(json.at("model_id").as_string() == "stories");
  CHECK(json.at("completed").to_number<int>() == 3);
  CHECK(json.at("failed").to_number<int>() == 0);
  CHECK(json.at("total_input_tokens").to_number<int>() == 30);
  CHECK(json.at("total_output_tokens").to_number<int>() == 12);
  CHECK(json.at("request_throughput").to_number<double>() == 3.0);
  CHECK(json.at("output_throughput").to_number<double>() == 12.0);
  CHECK(json.at("total_token_throughput").to_number<double>() == 42.0);
  CHECK(json.at("request_rate").as_string() == "inf");
  for (const char* field : {"mean_ttft_ms", "median_tpot_ms", "p99_itl_ms", "mean_e2el_ms"}) {
    CHECK(json.contains(field));
  }
  CHECK(json.at("burstiness").to_number<double>() == 1.0);
  CHECK(json.at("request_goodput").is_null());  // no objectives given, as vLLM writes
  SECTION("with objectives, the goodput and the good requests") {
    o.goodput.tpot_ms = 250.0;
    r.num_good = 2;
    r.request_goodput = 2.0;
    r.percentiles = {{"ttft", {{90.0, 12.5}, {99.5, 13.0}}}};
    const auto with = boost::json::parse(bench::to_json(o, r)).as_object();
    CHECK(with.at("request_goodput").to_number<double>() == 2.0);
    CHECK(with.at("good_completed").to_number<int>() == 2);
    CHECK(with.at("p90_ttft_ms").to_number<double>() == 12.5);
    CHECK(with.at("p99.5_ttft_ms").to_number<double>() == 13.0);
  }
}
