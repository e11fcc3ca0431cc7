// A request moved mid-stream (issue 31, item 1) keeps everything the client asked for: its
// worker fails a step while every request below has sent tokens, the engine moves them with
// their tokens, and each answer is the one an undisturbed run gives, field for field: n
// choices with seeded sampling and logprobs, a stop string met after the move, a streamed
// forced tool call (its grammar and its hold-back), and a JSON schema's output.
#include <algorithm>
#include <atomic>
#include <boost/json.hpp>
#include <catch2/catch.hpp>
#include <thread>

#include "http_exchange.hpp"
#include "net_test_support.hpp"

using namespace troupe;
namespace json = boost::json;

namespace {

// The worker's steps, slowed a little so that the requests have many steps to run; one
// fails once a step's number reaches `fail_at`.
struct Fault {
  std::atomic<int> steps{0};
  std::atomic<int> fail_at{-1};
  // Fails a step soon: one a few steps from now.
  void arm() { fail_at = steps.load() + 3; }
  void before_step() {
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    if (++steps == fail_at.load()) throw std::runtime_error("injected fault");
  }
};

// `value` without the keys that differ between two runs of the same request: ids and
// creation times.
json::value comparable(const json::value& value) {
  if (value.is_array()) {
    json::array out;
    for (const auto& v : value.as_array()) out.push_back(comparable(v));
    return out;
  }
  if (!value.is_object()) return value;
  json::object out;
  for (const auto& [key, v] : value.as_object()) {
    // A second run's prompt may come from the prefix cache: its usage says so.
    if (key == "id" || key == "created" || key == "system_fingerprint" ||
        key == "prompt_tokens_details") {
      continue;
    }
    out[key] = comparable(v);
  }
  return out;
}

// What a client reads of an answer: a JSON answer's choices and usage, or a stream's
// events' choices in order, each without its ids and times; a stream must end with [DONE].
std::string what_the_client_read(const test::HttpReply& reply, bool streamed) {
  INFO(reply.body);
  REQUIRE(reply.status == 200);
  if (!streamed) {
    const json::value answer = json::parse(reply.body);
    return json::serialize(json::object{{"choices", comparable(answer.at("choices"))},
                                        {"usage", comparable(answer.at("usage"))}});
  }
  json::array events;
  const test::SseEvents sse = test::sse_events(reply.body);
  for (const std::string& event : sse.data) {
    const json::value parsed = json::parse(event);
    CHECK_FALSE(parsed.as_object().contains("error"));
    events.push_back(comparable(parsed.at("choices")));
  }
  CHECK(sse.done);
  return json::serialize(events);
}

struct Job {
  std::string target;
  json::object body;
  bool streamed = false;
};

// Every job at once, one client thread each; the answers in job order.
std::vector<test::HttpReply> run_together(std::uint16_t port, const std::vector<Job>& jobs) {
  std::vector<test::HttpReply> replies(jobs.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    threads.emplace_back([&, i] {
      replies[i] = test::post_json(port, jobs[i].target, json::serialize(jobs[i].body));
    });
  }
  for (auto& t : threads) t.join();
  return replies;
}

}  // namespace

TEST_CASE(
    "a request moved mid-stream keeps its choices, logprobs, stop strings, tool call and "
    "schema",
    "[net][failover][integration]") {
  auto fault = std::make_shared<Fault>();
  test::ServedEngine s("failover-fields", {}, 1024, 2048, [fault] { fault->before_step(); });
  const std::uint16_t port = s.server->port();

  // A stop string the greedy stream meets late: taken from an undisturbed run's text, past
  // the step the fault will hit.
  json::object plain{
      {"prompt", "Once upon a time"}, {"max_tokens", 48}, {"temperature", 0}, {"ignore_eos", true}};
  const auto probe = test::post_json(port, "/v1/completions", json::serialize(plain));
  REQUIRE(probe.status == 200);
  const std::string probe_text(json::parse(probe.body).at("choices").at(0).at("text").as_string());
  REQUIRE(probe_text.size() > 40);
  // The shortest whole characters first found in its second half; none a replacement
  // character (what the text shows for a token's bytes that make no character: a stop
  // string is matched against the output's own bytes).
  const auto continues = [&](std::size_t at) {
    return at < probe_text.size() && (static_cast<unsigned char>(probe_text[at]) & 0xC0) == 0x80;
  };
  std::string stop;
  for (std::size_t at = probe_text.size() / 2; at < probe_text.size() && stop.empty(); ++at) {
    for (std::size_t n = 1; n <= 16 && at + n <= probe_text.size() && stop.empty(); ++n) {
      if (continues(at) || continues(at + n)) continue;
      if (probe_text.substr(at, n).find("\xEF\xBF\xBD") != std::string::npos) continue;
      if (probe_text.find(probe_text.substr(at, n)) == at) stop = probe_text.substr(at, n);
    }
  }
  REQUIRE_FALSE(stop.empty());

  std::vector<Job> jobs;
  jobs.push_back({"/v1/completions",
                  {{"prompt", "The king said"},
                   {"max_tokens", 40},
                   {"n", 2},
                   {"temperature", 0.8},
                   {"seed", 7},
                   {"logprobs", 2},
                   {"ignore_eos", true}},
                  false});
  json::object stopped = plain;
  stopped["stop"] = json::array{json::value(stop)};
  stopped["stream"] = true;
  stopped["logprobs"] = 1;
  jobs.push_back({"/v1/completions", stopped, true});
  jobs.push_back(
      {"/v1/chat/completions",
       {{"messages", json::array{json::object{{"role", "user"}, {"content", "Weather?"}}}},
        {"tools", json::parse(R"([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string",
            "maxLength": 24}, "days": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["city", "days"], "additionalProperties": false}}}])")},
        {"tool_choice",
         json::parse(R"({"type": "function", "function": {"name": "get_weather"}})")},
        {"max_tokens", 80},
        {"temperature", 0},
        {"stream", true}},
       true});
  jobs.push_back(
      {"/v1/chat/completions",
       {{"messages", json::array{json::object{{"role", "user"}, {"content", "A record."}}}},
        {"response_format",
         json::parse(R"({"type": "json_schema", "json_schema": {"name": "r", "schema": {
            "type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 6},
            "minItems": 2, "maxItems": 3}}, "required": ["name", "tags"],
            "additionalProperties": false}}})")},
        {"max_tokens", 120},
        {"temperature", 0.7},
        {"seed", 3}},
       false});

  const auto undisturbed = run_together(port, jobs);
  const auto restarts = s.engine->stats().num_worker_restarts;
  // The fault comes once every request has run a few steps.
  // The fault comes once every request runs (the five sequences of n = 2 and the others).
  std::vector<test::HttpReply> moved;
  std::thread clients([&] { moved = run_together(port, jobs); });
  for (int i = 0; i < 20000 && s.engine->stats().num_running < 5; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const bool all_running = s.engine->stats().num_running == 5;
  fault->arm();
  clients.join();
  REQUIRE(all_running);
  CHECK(s.engine->stats().num_worker_restarts == restarts + 1);
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    INFO(jobs[i].target << " " << json::serialize(jobs[i].body));
    const std::string want = what_the_client_read(undisturbed[i], jobs[i].streamed);
    const std::string got = what_the_client_read(moved[i], jobs[i].streamed);
    CHECK(got == want);
  }
  // The stop string ended the stream; the tool call was read back as a call.
  INFO("stop string: " << stop);
  CHECK(what_the_client_read(undisturbed[1], true).find(R"("finish_reason":"stop")") !=
        std::string::npos);
  CHECK(what_the_client_read(undisturbed[2], true).find(R"("finish_reason":"tool_calls")") !=
        std::string::npos);
  // Every request was running when its worker went: each moved (n = 2 is two).
  const std::string metrics = s.metrics->serialize();
  CHECK(metrics.find(R"(troupe_request_migrations_total{model_name="troupe"} 5)") !=
        std::string::npos);
  CHECK(s.kv_drains());
}
