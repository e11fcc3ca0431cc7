// HTTP client coroutines on Boost.Beast: one per request, each timing the SSE
// events of its stream as they arrive.
#include "bench/serve_client.hpp"

#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <boost/json/serialize.hpp>
#include <chrono>
#include <cstdio>
#include <random>

namespace troupe::bench {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kUseTuple = asio::as_tuple(asio::use_awaitable);

struct Sample {
  bool ok = false;
  std::string error;
  std::int32_t num_input = 0;
  std::int32_t num_output = 0;
  Clock::time_point start, first, last;
  std::vector<double> gaps_ms;
};

struct Shared {
  const ServeOptions& options;
  std::vector<Sample> samples;
  std::int32_t in_flight = 0;
  std::unique_ptr<asio::steady_timer> slot_freed;  // wakes the dispatcher when a request ends
};

std::string request_body(const ServeOptions& o, const BenchRequest& request) {
  boost::json::object body;
  body["model"] = o.model;
  body["prompt"] = boost::json::array(request.prompt.begin(), request.prompt.end());
  body["max_tokens"] = request.output_len;
  body["ignore_eos"] = true;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  return boost::json::serialize(body);
}

asio::awaitable<void> one_request(Shared& shared, std::size_t index, std::string body) {
  Sample& s = shared.samples[index];
  auto executor = co_await asio::this_coro::executor;
  tcp::resolver resolver(executor);
  beast::tcp_stream stream(executor);
  s.start = Clock::now();
  auto [rec, endpoints] = co_await resolver.async_resolve(
      shared.options.host, std::to_string(shared.options.port), kUseTuple);
  if (!rec) {
    stream.expires_after(std::chrono::seconds(30));
    auto [cec, ep] = co_await stream.async_connect(endpoints, kUseTuple);
    rec = cec;
  }
  if (rec) {
    s.error = "connect: " + rec.message();
  } else {
    http::request<http::string_body> req{http::verb::post, "/v1/completions", 11};
    req.set(http::field::host, shared.options.host);
    req.set(http::field::content_type, "application/json");
    if (!shared.options.api_key.empty())
      req.set(http::field::authorization, "Bearer " + shared.options.api_key);
    req.body() = std::move(body);
    req.prepare_payload();
    stream.expires_never();
    auto [wec, wn] = co_await http::async_write(stream, req, kUseTuple);
    http::response_parser<http::string_body> parser;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    std::string pending;
    // Every SSE event is timed as its bytes arrive.
    auto on_chunk = [&](std::uint64_t, std::string_view data, beast::error_code&) -> std::size_t {
      const auto now = Clock::now();
      pending.append(data);
      for (std::size_t end; (end = pending.find("\n\n")) != std::string::npos;
           pending.erase(0, end + 2)) {
        const std::string event = pending.substr(0, end);
        if (event.rfind("data: ", 0) != 0 || event == "data: [DONE]") continue;
        if (event.find("\"usage\":{") != std::string::npos &&
            event.find("\"choices\":[]") != std::string::npos) {
          const auto at = event.find("\"completion_tokens\":");
          if (at != std::string::npos) s.num_output = std::atoi(event.c_str() + at + 20);
          continue;
        }
        if (s.first.time_since_epoch().count() == 0)
          s.first = now;
        else
          s.gaps_ms.push_back(std::chrono::duration<double, std::milli>(now - s.last).count());
        s.last = now;
      }
      return data.size();
    };
    parser.on_chunk_body(on_chunk);
    beast::flat_buffer buffer;
    auto [ec, n] = wec ? std::tuple(wec, std::size_t{0})
                       : co_await http::async_read(stream, buffer, parser, kUseTuple);
    if (ec) {
      s.error = "read: " + ec.message();
    } else if (parser.get().result() != http::status::ok) {
      s.error = "HTTP " + std::to_string(parser.get().result_int()) + ": " + parser.get().body();
    } else {
      s.ok = s.num_output > 0;
      if (!s.ok) s.error = "no tokens";
    }
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  }
  --shared.in_flight;
  shared.slot_freed->cancel_one();
}

asio::awaitable<void> dispatch(Shared& shared, std::vector<std::string> bodies) {
  const auto& o = shared.options;
  auto executor = co_await asio::this_coro::executor;
  std::mt19937_64 rng(o.workload.seed + 1);
  std::exponential_distribution<double> gap(o.request_rate > 0 ? o.request_rate : 1.0);
  asio::steady_timer timer(executor);
  for (std::size_t i = 0; i < bodies.size(); ++i) {
    while (o.max_concurrency > 0 && shared.in_flight >= o.max_concurrency) {
      shared.slot_freed->expires_at(asio::steady_timer::time_point::max());
      co_await shared.slot_freed->async_wait(kUseTuple);
    }
    ++shared.in_flight;
    asio::co_spawn(executor, one_request(shared, i, std::move(bodies[i])), asio::detached);
    if (o.request_rate > 0) {  // Poisson arrivals
      timer.expires_after(
          std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap(rng))));
      co_await timer.async_wait(kUseTuple);
    }
  }
}

}  // namespace

Result<ServeResult> run_serve_benchmark(const ServeOptions& o) {
  const WorkloadOptions& w = o.workload;
  if (w.num_prompts <= 0 || w.input_len <= 0 || w.output_len <= 0) {
    return make_error(ErrorCode::invalid_argument,
                      "num-prompts, input-len, output-len must be positive");
  }
  TROUPE_TRY(const auto requests, make_workload(w));
  asio::io_context io;
  Shared shared{o, std::vector<Sample>(requests.size()), 0,
                std::make_unique<asio::steady_timer>(io)};
  std::vector<std::string> bodies;
  ServeResult result;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    shared.samples[i].num_input = static_cast<std::int32_t>(requests[i].prompt.size());
    bodies.push_back(request_body(o, requests[i]));
  }
  const auto start = Clock::now();
  asio::co_spawn(io, dispatch(shared, std::move(bodies)), asio::detached);
  io.run();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  RequestTotals& totals = result.totals;
  LatencySamples samples;
  for (const Sample& s : shared.samples) {
    if (!s.ok) {
      ++totals.failed;
      if (result.first_error.empty()) result.first_error = s.error;
      continue;
    }
    ++totals.completed;
    totals.total_input_tokens += s.num_input;
    totals.total_output_tokens += s.num_output;
    samples.add(s.start, s.first, s.last, s.num_output, s.gaps_ms);
  }
  totals.set_duration(seconds);
  result.latency = samples.summarize();
  return result;
}

std::string to_json(const ServeOptions& o, const ServeResult& r) {
  boost::json::object json;
  json["num_prompts"] = o.workload.num_prompts;
  if (o.request_rate > 0)
    json["request_rate"] = o.request_rate;
  else
    json["request_rate"] = "inf";
  json["max_concurrency"] = o.max_concurrency;
  add_totals(json, r.totals);
  add_latencies(json, r.latency);
  return boost::json::serialize(json) + "\n";
}

void print(const ServeOptions& o, const ServeResult& r) {
  std::printf("============ Serving benchmark (%s:%u) ============\n", o.host.c_str(), o.port);
  std::printf("%-36s %d / %d\n", "Completed / failed requests:", r.totals.completed,
              r.totals.failed);
  if (!r.first_error.empty()) std::printf("%-36s %s\n", "First error:", r.first_error.c_str());
  std::printf("%-36s %.2f\n", "Duration (s):", r.totals.duration_s);
  std::printf("%-36s %.3f\n", "Request throughput (req/s):", r.totals.request_throughput);
  std::printf("%-36s %.1f\n", "Output token throughput (tok/s):", r.totals.output_throughput);
  print_latencies(r.latency);
}

}  // namespace troupe::bench
