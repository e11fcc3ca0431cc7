// HTTP client coroutines on Boost.Beast: a few questions to the server first (its model, its
// vocabulary), then one coroutine per request, each timing the SSE events of its stream as
// they arrive.
#include "bench/serve_client.hpp"

#include <unistd.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <chrono>
#include <cstdarg>
#include <cstdio>

namespace troupe::bench {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kUseTuple = asio::as_tuple(asio::use_awaitable);
// Control tokens sit at a vocabulary's end (Llama-3 has 256 of them); past this many probes
// the rest of the vocabulary is kept as it is.
constexpr std::int32_t kMaxControlProbes = 1024;

// Requests done of a run, on stderr: a redrawn bar on a terminal; elsewhere a line each time
// another tenth is done, so that a log gets ten lines at most.
class Progress {
 public:
  Progress(std::int32_t total, bool enabled)
      : total_(total), enabled_(enabled && total > 0), tty_(::isatty(STDERR_FILENO) == 1) {
    if (enabled_ && tty_) draw();
  }

  void add_one() {
    ++done_;
    if (!enabled_) return;
    const auto now = Clock::now();
    if (tty_) {
      // Redrawn at most ten times a second, and once at the end.
      if (done_ == total_ || now - drawn_ >= std::chrono::milliseconds(100)) draw();
      return;
    }
    const std::int32_t tenths = done_ * 10 / total_;
    if (tenths > tenths_shown_) {
      tenths_shown_ = tenths;
      std::fprintf(stderr, "troupe bench serve: %3d%% (%d/%d requests, %.1f s)\n",
                   done_ * 100 / total_, done_, total_, seconds(now));
    }
  }

  void finish() {
    if (enabled_ && tty_) std::fputc('\n', stderr);
  }

 private:
  double seconds(Clock::time_point now) const {
    return std::chrono::duration<double>(now - start_).count();
  }

  // tqdm's layout: " 45%|██████▊        | 45/100 [00:03<00:04, 12.30it/s]".
  void draw() {
    constexpr int kWidth = 30;
    static const char* const kEighths[] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
    drawn_ = Clock::now();
    const double elapsed = seconds(drawn_);
    const int eighths = done_ * kWidth * 8 / total_;
    std::string bar;
    for (int i = 0; i < eighths / 8; ++i) bar += "█";
    bar += kEighths[eighths % 8];
    bar.append(static_cast<std::size_t>(kWidth - eighths / 8 - (eighths % 8 ? 1 : 0)), ' ');
    const double rate = elapsed > 0 ? done_ / elapsed : 0.0;
    const double left = rate > 0 ? (total_ - done_) / rate : 0.0;
    std::fprintf(stderr, "\r%3d%%|%s| %d/%d [%s<%s, %.2fit/s]", done_ * 100 / total_, bar.c_str(),
                 done_, total_, clock_text(elapsed).c_str(), clock_text(left).c_str(), rate);
    std::fflush(stderr);
  }

  static std::string clock_text(double seconds) {
    const auto s = static_cast<long>(seconds);
    char text[32];
    std::snprintf(text, sizeof text, "%02ld:%02ld", s / 60, s % 60);
    return text;
  }

  std::int32_t total_;
  bool enabled_, tty_;
  std::int32_t done_ = 0, tenths_shown_ = 0;
  Clock::time_point start_ = Clock::now(), drawn_;
};

struct Sample {
  bool ok = false;
  std::string error;
  std::int32_t num_input = 0;
  std::int32_t num_output = 0;
  std::int32_t num_token_events = 0;
  Clock::time_point start, first, last;
  std::vector<double> gaps_ms;
};

struct Shared {
  const ServeOptions& options;
  std::vector<Sample> samples;
  Progress& progress;
  std::int32_t in_flight = 0;
  std::unique_ptr<asio::steady_timer> slot_freed;  // wakes the dispatcher when a request ends
};

void set_common_fields(http::request<http::string_body>& req, const ServeOptions& o) {
  req.set(http::field::host, o.host);
  if (!o.api_key.empty()) req.set(http::field::authorization, "Bearer " + o.api_key);
}

// A whole (not streamed) answer to one of the questions asked before the run.
struct Reply {
  std::string error;  // empty when an HTTP answer came
  unsigned status = 0;
  std::string body;
};

asio::awaitable<Reply> fetch(const ServeOptions& o, http::verb verb, std::string target,
                             std::string body) {
  Reply reply;
  auto executor = co_await asio::this_coro::executor;
  tcp::resolver resolver(executor);
  beast::tcp_stream stream(executor);
  auto [rec, endpoints] =
      co_await resolver.async_resolve(o.host, std::to_string(o.port), kUseTuple);
  if (rec) {
    reply.error = rec.message();
    co_return reply;
  }
  stream.expires_after(std::chrono::seconds(30));
  auto [cec, ep] = co_await stream.async_connect(endpoints, kUseTuple);
  if (cec) {
    reply.error = cec.message();
    co_return reply;
  }
  http::request<http::string_body> req{verb, target, 11};
  set_common_fields(req, o);
  if (verb == http::verb::post) req.set(http::field::content_type, "application/json");
  req.body() = std::move(body);
  req.prepare_payload();
  auto [wec, wn] = co_await http::async_write(stream, req, kUseTuple);
  http::response<http::string_body> res;
  beast::flat_buffer buffer;
  auto [ec, n] = wec ? std::tuple(wec, std::size_t{0})
                     : co_await http::async_read(stream, buffer, res, kUseTuple);
  if (ec) {
    reply.error = ec.message();
  } else {
    reply.status = res.result_int();
    reply.body = std::move(res.body());
  }
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  co_return reply;
}

Reply call(const ServeOptions& o, http::verb verb, std::string target, std::string body = {}) {
  asio::io_context io;
  Reply reply;
  asio::co_spawn(io, fetch(o, verb, std::move(target), std::move(body)),
                 [&reply](std::exception_ptr e, Reply r) {
                   reply = std::move(r);
                   if (e) reply.error = "the client failed";
                 });
  io.run();
  return reply;
}

std::string server_name(const ServeOptions& o) {
  return "http://" + o.host + ":" + std::to_string(o.port);
}

}  // namespace

StreamEvent read_stream_event(std::string_view data) {
  StreamEvent read;
  boost::system::error_code ec;
  const boost::json::value json = boost::json::parse(data, ec);
  if (ec || !json.is_object()) return read;
  const boost::json::object& event = json.as_object();
  if (const auto* usage = event.if_contains("usage"); usage != nullptr && usage->is_object()) {
    if (const auto* n = usage->as_object().if_contains("completion_tokens");
        n != nullptr && n->is_int64()) {
      read.completion_tokens = static_cast<std::int32_t>(n->as_int64());
    }
  }
  const auto* choices = event.if_contains("choices");
  if (choices == nullptr || !choices->is_array() || choices->as_array().empty()) return read;
  const auto* choice = choices->as_array().front().if_object();
  if (choice == nullptr) return read;
  const auto* text = choice->if_contains("text");
  if (const auto* delta = choice->if_contains("delta");
      text == nullptr && delta != nullptr && delta->is_object()) {
    text = delta->as_object().if_contains("content");
  }
  const bool has_text = text != nullptr && text->is_string() && !text->as_string().empty();
  const auto* finish = choice->if_contains("finish_reason");
  const bool finished = finish != nullptr && !finish->is_null();
  // An event with text is a token; so is one without whose stream goes on (a token held back
  // or cut into bytes that make no text yet); an empty one that finishes closes the stream.
  read.token = has_text || !finished;
  return read;
}

namespace {

// The model and its bounds: from GET /v1/models, with the command line's overrides.
Result<ServedModel> ask_served_model(const ServeOptions& o) {
  const Reply reply = call(o, http::verb::get, "/v1/models");
  if (!reply.error.empty()) {
    return make_error(ErrorCode::unavailable,
                      "cannot reach " + server_name(o) + " (" + reply.error + ")");
  }
  ServedModel model;
  model.id = o.model;
  model.vocab_size = o.workload.vocab_size;
  if (reply.status != 200) {
    // A server without /v1/models still works when the command line says everything.
    if (!o.model.empty() && o.workload.vocab_size > 0) return model;
    return make_error(ErrorCode::unavailable,
                      "GET " + server_name(o) + "/v1/models answered HTTP " +
                          std::to_string(reply.status) + ": " + reply.body.substr(0, 200));
  }
  TROUPE_TRY(const ServedModel served, parse_served_model(reply.body, o.model));
  model.id = served.id;
  model.max_model_len = served.max_model_len;
  if (model.vocab_size > 0) return model;  // --vocab-size overrides
  if (served.vocab_size <= 0) {
    return make_error(ErrorCode::invalid_argument,
                      "the server at " + server_name(o) +
                          " does not report its vocabulary size in /v1/models (vocab_size is "
                          "troupe's own field: an older troupe or another server has none); "
                          "pass --vocab-size");
  }
  model.vocab_size = served.vocab_size;
  return model;
}

// Ids at the vocabulary's end that decode to no text are control tokens (<|eot_id|>, the
// reserved ones), not prompt text: /detokenize tells them, one id at a time. A server without
// /detokenize keeps its whole vocabulary.
std::int32_t without_trailing_control_tokens(const ServeOptions& o, std::int32_t vocab_size) {
  std::int32_t end = vocab_size;
  for (std::int32_t probes = 0; end - 1 > kFirstPromptToken && probes < kMaxControlProbes;
       ++probes) {
    const Reply r =
        call(o, http::verb::post, "/detokenize", "{\"tokens\":[" + std::to_string(end - 1) + "]}");
    if (!r.error.empty() || r.status != 200) break;
    boost::system::error_code ec;
    const auto json = boost::json::parse(r.body, ec);
    const auto* text = !ec && json.is_object() ? json.as_object().if_contains("prompt") : nullptr;
    if (text == nullptr || !text->is_string() || !text->get_string().empty()) break;
    --end;
  }
  return end;
}

std::string request_body(const std::string& model, const BenchRequest& request) {
  boost::json::object body;
  body["model"] = model;
  body["prompt"] = boost::json::array(request.prompt.begin(), request.prompt.end());
  body["max_tokens"] = request.output_len;
  // As vLLM's client for the random dataset: every request generates exactly max_tokens.
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
    set_common_fields(req, shared.options);
    req.set(http::field::content_type, "application/json");
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
        const StreamEvent read = read_stream_event(std::string_view(event).substr(6));
        if (read.completion_tokens >= 0) s.num_output = read.completion_tokens;
        if (!read.token) continue;
        ++s.num_token_events;
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
      // A server that reports no usage: each event with text is a token (as llama.cpp's and
      // vLLM's streams send them).
      if (s.num_output == 0) s.num_output = s.num_token_events;
      s.ok = s.num_output > 0;
      if (!s.ok) s.error = "no tokens";
    }
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  }
  --shared.in_flight;
  shared.progress.add_one();
  shared.slot_freed->cancel_one();
}

asio::awaitable<void> dispatch(Shared& shared, std::vector<std::string> bodies) {
  const auto& o = shared.options;
  auto executor = co_await asio::this_coro::executor;
  const std::vector<double> gaps =
      arrival_gaps(o.request_rate, o.burstiness, o.workload.seed + 1, bodies.size());
  asio::steady_timer timer(executor);
  for (std::size_t i = 0; i < bodies.size(); ++i) {
    while (o.max_concurrency > 0 && shared.in_flight >= o.max_concurrency) {
      shared.slot_freed->expires_at(asio::steady_timer::time_point::max());
      co_await shared.slot_freed->async_wait(kUseTuple);
    }
    ++shared.in_flight;
    asio::co_spawn(executor, one_request(shared, i, std::move(bodies[i])), asio::detached);
    if (gaps[i] > 0) {  // open-loop arrivals: Poisson, or gamma of another burstiness
      timer.expires_after(
          std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gaps[i])));
      co_await timer.async_wait(kUseTuple);
    }
  }
}

// Python's str.format, as vLLM prints: "{:<40} {:<10}" and a title centred in 50 columns.
__attribute__((format(printf, 2, 3))) void append(std::string& out, const char* format, ...) {
  char line[256];
  va_list args;
  va_start(args, format);
  std::vsnprintf(line, sizeof line, format, args);
  va_end(args);
  out += line;
}

void append_title(std::string& out, const std::string& title, char fill) {
  const std::size_t pad = title.size() < 50 ? 50 - title.size() : 0;
  out += std::string(pad / 2, fill) + title + std::string(pad - pad / 2, fill) + "\n";
}

// One metric's block, as vLLM's process_one_metric: mean, median, then each percentile asked.
void append_metric(std::string& out, const char* header, const char* name, const Percentiles& p,
                   const MetricPercentiles* asked) {
  append_title(out, header, '-');
  append(out, "%-40s %-10.2f\n", ("Mean " + std::string(name) + " (ms):").c_str(), p.mean);
  append(out, "%-40s %-10.2f\n", ("Median " + std::string(name) + " (ms):").c_str(), p.median);
  if (asked == nullptr) return;
  for (const auto& [percentile, value] : asked->values) {
    append(out, "%-40s %-10.2f\n",
           ("P" + percentile_word(percentile) + " " + name + " (ms):").c_str(), value);
  }
}

const MetricPercentiles* find_metric(const ServeResult& r, std::string_view metric) {
  for (const MetricPercentiles& m : r.percentiles) {
    if (m.metric == metric) return &m;
  }
  return nullptr;
}

}  // namespace

Result<ServedModel> parse_served_model(std::string_view models_json, std::string_view wanted) {
  boost::system::error_code ec;
  const auto json = boost::json::parse(models_json, ec);
  const auto* data = !ec && json.is_object() ? json.as_object().if_contains("data") : nullptr;
  if (data == nullptr || !data->is_array() || data->as_array().empty()) {
    return make_error(ErrorCode::invalid_argument,
                      "/v1/models lists no model: " + std::string(models_json.substr(0, 200)));
  }
  std::string served;
  for (const auto& entry : data->as_array()) {
    const auto* o = entry.if_object();
    const auto* id = o ? o->if_contains("id") : nullptr;
    if (id == nullptr || !id->is_string()) continue;
    if (!wanted.empty() && id->get_string() != wanted) {
      served += (served.empty() ? "'" : ", '") + std::string(id->get_string()) + "'";
      continue;
    }
    ServedModel model;
    model.id = std::string(id->get_string());
    // A number that is not a positive 32-bit integer reads as absent.
    auto number = [o](const char* key) -> std::int32_t {
      const auto* v = o->if_contains(key);
      if (v == nullptr || !v->is_int64() || v->get_int64() <= 0 || v->get_int64() > INT32_MAX)
        return 0;
      return static_cast<std::int32_t>(v->get_int64());
    };
    model.vocab_size = number("vocab_size");
    model.max_model_len = number("max_model_len");
    return model;
  }
  return make_error(ErrorCode::invalid_argument,
                    "the server does not serve '" + std::string(wanted) + "' (it serves " +
                        (served.empty() ? std::string("none by name") : served) + ")");
}

Result<void> check_fits(const std::vector<BenchRequest>& requests, std::int32_t max_model_len) {
  if (max_model_len <= 0) return {};
  for (const BenchRequest& r : requests) {
    const auto length = static_cast<std::int64_t>(r.prompt.size()) + r.output_len;
    if (length > max_model_len) {
      return make_error(ErrorCode::out_of_range,
                        "a request of " + std::to_string(r.prompt.size()) + " prompt and " +
                            std::to_string(r.output_len) + " output tokens exceeds the server's " +
                            "max_model_len of " + std::to_string(max_model_len) +
                            ": lower --random-input-len or --random-output-len");
    }
  }
  return {};
}

Result<ServeResult> run_serve_benchmark(const ServeOptions& o) {
  const WorkloadOptions& w = o.workload;
  if (w.num_prompts <= 0 || w.input_len <= 0 || w.output_len <= 0) {
    return make_error(ErrorCode::invalid_argument,
                      "num-prompts, input-len, output-len must be positive");
  }
  ServeResult result;
  TROUPE_TRY(result.server, ask_served_model(o));
  if (o.workload.vocab_size <= 0) {
    result.server.vocab_size = without_trailing_control_tokens(o, result.server.vocab_size);
  }
  if (result.server.vocab_size <= kFirstPromptToken) {
    return make_error(ErrorCode::invalid_argument,
                      "prompt ids are drawn from " + std::to_string(kFirstPromptToken) +
                          " (past the byte tokens) up, but the vocabulary has " +
                          std::to_string(result.server.vocab_size) + " tokens");
  }
  WorkloadOptions drawn = w;
  drawn.vocab_size = result.server.vocab_size;
  TROUPE_TRY(const auto requests, make_workload(drawn));
  TROUPE_TRY_VOID(check_fits(requests, result.server.max_model_len));

  asio::io_context io;
  Progress progress(static_cast<std::int32_t>(requests.size()), o.progress);
  Shared shared{o, std::vector<Sample>(requests.size()), progress, 0,
                std::make_unique<asio::steady_timer>(io)};
  std::vector<std::string> bodies;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    shared.samples[i].num_input = static_cast<std::int32_t>(requests[i].prompt.size());
    bodies.push_back(request_body(result.server.id, requests[i]));
  }
  const auto start = Clock::now();
  asio::co_spawn(io, dispatch(shared, std::move(bodies)), asio::detached);
  io.run();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  progress.finish();
  RequestTotals& totals = result.totals;
  LatencySamples samples;
  std::vector<RequestLatency> completed;
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
    using ms = std::chrono::duration<double, std::milli>;
    completed.push_back({ms(s.first - s.start).count(),
                         s.num_output > 1 ? ms(s.last - s.first).count() / (s.num_output - 1) : 0.0,
                         ms(s.last - s.start).count()});
  }
  totals.set_duration(seconds);
  result.num_good = count_good(completed, o.goodput);
  result.request_goodput = result.num_good / seconds;
  result.percentiles = select_percentiles(o, samples);
  result.total_token_throughput =
      static_cast<double>(totals.total_input_tokens + totals.total_output_tokens) / seconds;
  result.latency = samples.summarize();
  return result;
}

std::vector<MetricPercentiles> select_percentiles(const ServeOptions& o,
                                                  const LatencySamples& samples) {
  std::vector<MetricPercentiles> selected;
  for (const std::string& metric : o.percentile_metrics) {
    MetricPercentiles m{metric, {}};
    std::vector<double> sorted = samples.values(metric);
    std::sort(sorted.begin(), sorted.end());
    for (const double p : o.metric_percentiles) {
      m.values.emplace_back(p, sorted.empty() ? 0.0 : nearest_rank(sorted, p / 100.0));
    }
    selected.push_back(std::move(m));
  }
  return selected;
}

std::string to_json(const ServeOptions& o, const ServeResult& r) {
  boost::json::object json;
  json["model_id"] = r.server.id;
  json["num_prompts"] = o.workload.num_prompts;
  if (o.request_rate > 0)
    json["request_rate"] = o.request_rate;
  else
    json["request_rate"] = "inf";
  json["burstiness"] = o.burstiness;
  json["max_concurrency"] = o.max_concurrency;
  add_totals(json, r.totals);
  if (o.goodput.any()) {
    json["request_goodput"] = r.request_goodput;
    json["good_completed"] = r.num_good;  // troupe's: the requests that met every objective
  } else {
    json["request_goodput"] = nullptr;
  }
  json["total_token_throughput"] = r.total_token_throughput;
  add_latencies(json, r.latency);
  for (const MetricPercentiles& m : r.percentiles) {
    for (const auto& [p, value] : m.values) {
      json["p" + percentile_word(p) + "_" + m.metric + "_ms"] = value;
    }
  }
  return boost::json::serialize(json) + "\n";
}

std::string summary(const ServeOptions& o, const ServeResult& r) {
  const RequestTotals& t = r.totals;
  std::string out;
  append_title(out, " Serving Benchmark Result ", '=');
  append(out, "%-40s %-10d\n", "Successful requests:", t.completed);
  append(out, "%-40s %-10d\n", "Failed requests:", t.failed);
  if (o.max_concurrency > 0)
    append(out, "%-40s %-10d\n", "Maximum request concurrency:", o.max_concurrency);
  if (o.request_rate > 0)
    append(out, "%-40s %-10.2f\n", "Request rate configured (RPS):", o.request_rate);
  append(out, "%-40s %-10.2f\n", "Benchmark duration (s):", t.duration_s);
  append(out, "%-40s %-10lld\n",
         "Total input tokens:", static_cast<long long>(t.total_input_tokens));
  append(out, "%-40s %-10lld\n",
         "Total generated tokens:", static_cast<long long>(t.total_output_tokens));
  append(out, "%-40s %-10.2f\n", "Request throughput (req/s):", t.request_throughput);
  if (o.goodput.any()) {
    append(out, "%-40s %-10.2f\n", "Request goodput (req/s):", r.request_goodput);
  }
  append(out, "%-40s %-10.2f\n", "Output token throughput (tok/s):", t.output_throughput);
  append(out, "%-40s %-10.2f\n", "Total Token throughput (tok/s):", r.total_token_throughput);
  struct Block {
    const char* metric;
    const char* header;
    const char* name;
    const Percentiles& values;
  };
  for (const Block& b :
       {Block{"ttft", "Time to First Token", "TTFT", r.latency.ttft_ms},
        Block{"tpot", "Time per Output Token (excl. 1st token)", "TPOT", r.latency.tpot_ms},
        Block{"itl", "Inter-token Latency", "ITL", r.latency.itl_ms},
        Block{"e2el", "End-to-end Latency", "E2EL", r.latency.e2el_ms}}) {
    const auto& asked = o.percentile_metrics;
    if (std::find(asked.begin(), asked.end(), b.metric) == asked.end()) continue;
    append_metric(out, b.header, b.name, b.values, find_metric(r, b.metric));
  }
  out += std::string(50, '=') + "\n";
  return out;
}

}  // namespace troupe::bench
