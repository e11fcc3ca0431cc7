// Output constraints that would crash or freeze a server, sent to a real one: schemas whose
// conversion recurses without end, and grammars whose token masks cost without end. Each
// must be refused (a 400 at admission, or an error that ends its own request), while a
// plain request beside it streams at its own pace and the engine is idle again after.
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/json.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "net_test_support.hpp"
#include "support/raw_client.hpp"

using namespace troupe;
using namespace std::chrono_literals;
namespace json = boost::json;
using Clock = std::chrono::steady_clock;

namespace {

// A model with a vocabulary of 32000 tokens: a mask walks as many as a real model's.
constexpr std::int32_t kVocabulary = 32000;

struct Server : test::ServedEngine {
  Server() : ServedEngine("grammar-limits", {}, 1024, 2048, {}, kVocabulary) {}
  std::uint16_t port() const { return server->port(); }
};

std::string http_post(const std::string& target, const json::object& body) {
  const std::string text = json::serialize(body);
  return "POST " + target +
         " HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
         "Content-Length: " +
         std::to_string(text.size()) + "\r\n\r\n" + text;
}

struct Answer {
  int status = 0;
  std::string body;
};

Answer post(std::uint16_t port, const std::string& target, const json::object& body,
            std::chrono::milliseconds timeout = 60s) {
  test::RawClient client(port);
  client.send(http_post(target, body));
  const std::string raw = client.read_all(timeout);
  Answer answer;
  if (raw.size() > 12) answer.status = std::atoi(raw.substr(9, 3).c_str());
  if (const auto at = raw.find("\r\n\r\n"); at != std::string::npos)
    answer.body = raw.substr(at + 4);
  return answer;
}

// A streamed completion, read as it comes: each event's arrival time and text.
struct Stream {
  std::vector<Clock::time_point> arrivals;
  std::string text;
  std::string finish_reason;
  std::string error;  // an error event's message
  bool done = false;
};

Stream stream(std::uint16_t port, const json::object& body, std::chrono::milliseconds timeout) {
  test::RawClient client(port);
  client.send(http_post("/v1/completions", body));
  Stream out;
  std::string got;
  std::size_t parsed = 0;
  const auto deadline = Clock::now() + timeout;
  while (!out.done && Clock::now() < deadline) {
    pollfd p{client.fd(), POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char buffer[65536];
    const auto n = ::recv(client.fd(), buffer, sizeof buffer, 0);
    if (n <= 0) break;
    got.append(buffer, static_cast<std::size_t>(n));
    const auto now = Clock::now();
    // Whole events only: a read may end inside one.
    for (std::size_t end; (end = got.find("\n\n", parsed)) != std::string::npos;) {
      const auto start = got.find("data: ", parsed);
      const std::string event =
          start < end ? got.substr(start + 6, end - start - 6) : std::string();
      parsed = end + 2;
      if (event.empty()) continue;
      if (event == "[DONE]") {
        out.done = true;
        break;
      }
      const json::value v = json::parse(event);
      if (const auto* e = v.as_object().if_contains("error")) {
        out.error = std::string(e->at("message").as_string());
        continue;
      }
      const auto& choice = v.at("choices").as_array().at(0).as_object();
      out.text += choice.at("text").as_string();
      out.arrivals.push_back(now);
      if (choice.at("finish_reason").is_string()) {
        out.finish_reason = std::string(choice.at("finish_reason").as_string());
      }
    }
  }
  return out;
}

double largest_gap_seconds(const Stream& s) {
  double gap = 0.0;
  for (std::size_t i = 1; i < s.arrivals.size(); ++i) {
    gap = std::max(gap, std::chrono::duration<double>(s.arrivals[i] - s.arrivals[i - 1]).count());
  }
  return gap;
}

// A schema whose $defs are a flat chain of `hops` references: shallow as JSON.
json::value ref_chain(int hops) {
  json::object defs;
  for (int i = 0; i < hops; ++i) {
    defs["a" + std::to_string(i)] = json::object{{"$ref", "#/$defs/a" + std::to_string(i + 1)}};
  }
  defs["a" + std::to_string(hops)] = json::object{{"type", "integer"}};
  return json::object{{"$defs", std::move(defs)}, {"$ref", "#/$defs/a0"}};
}

json::object chat(json::object body) {
  body["messages"] = json::array{json::object{{"role", "user"}, {"content", "hello"}}};
  body["max_tokens"] = 4;
  return body;
}

json::object plain_stream(int max_tokens) {
  return json::object{{"prompt", "Once upon a time"},
                      {"max_tokens", max_tokens},
                      {"temperature", 0},
                      {"ignore_eos", true},
                      {"stream", true}};
}

// CPU seconds this process has used.
double cpu_seconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
}

}  // namespace

TEST_CASE("a chain of 10 000 or 100 000 $ref hops is a 400 through every field that takes a schema",
          "[integration]") {
  Server server;
  for (const int hops : {10'000, 100'000}) {
    const json::value schema = ref_chain(hops);
    struct Field {
      std::string target;
      json::object body;
      std::string param;
    };
    const std::vector<Field> fields = {
        {"/v1/completions",
         json::object{{"prompt", "x"}, {"max_tokens", 4}, {"guided_json", schema}}, "guided_json"},
        {"/v1/chat/completions",
         chat({{"response_format",
                json::object{
                    {"type", "json_schema"},
                    {"json_schema", json::object{{"name", "chain"}, {"schema", schema}}}}}}),
         "response_format"},
        {"/v1/chat/completions",
         chat({{"tools", json::array{json::object{
                             {"type", "function"},
                             {"function", json::object{{"name", "f"}, {"parameters", schema}}}}}},
               {"tool_choice", "required"}}),
         "tools"},
        {"/v1/chat/completions",
         chat({{"tools", json::array{json::object{
                             {"type", "function"},
                             {"function", json::object{{"name", "f"}, {"parameters", schema}}}}}},
               {"tool_choice",
                json::object{{"type", "function"}, {"function", json::object{{"name", "f"}}}}}}),
         "tools"},
    };
    for (const Field& field : fields) {
      INFO(hops << " hops through " << field.param);
      const Answer answer = post(server.port(), field.target, field.body);
      INFO(answer.body.substr(0, 500));
      REQUIRE(answer.status == 400);
      const auto error = json::parse(answer.body).at("error").as_object();
      CHECK_THAT(std::string(error.at("message").as_string()),
                 Catch::Contains("nested too deep") && Catch::Contains("$ref hops"));
      CHECK_THAT(std::string(error.at("param").as_string()), Catch::StartsWith(field.param));
    }
  }
  // The server lives on.
  const Answer after =
      post(server.port(), "/v1/completions", json::object{{"prompt", "x"}, {"max_tokens", 2}});
  CHECK(after.status == 200);
}

TEST_CASE("a regex whose first mask is past the work budget is a 400 that says why",
          "[integration]") {
  Server server;
  std::string regex;
  for (int i = 0; i < 200; ++i) regex += ".*";
  regex += "z";
  // A plain stream beside it keeps its pace and its text.
  const Stream alone = stream(server.port(), plain_stream(64), 60s);
  REQUIRE(alone.done);
  Stream beside;
  std::thread plain([&] { beside = stream(server.port(), plain_stream(64), 60s); });
  const auto start = Clock::now();
  const Answer refused =
      post(server.port(), "/v1/completions",
           json::object{{"prompt", "x"}, {"max_tokens", 8}, {"guided_regex", regex}});
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  plain.join();
  INFO(refused.body);
  REQUIRE(refused.status == 400);
  const auto error = json::parse(refused.body).at("error").as_object();
  CHECK_THAT(std::string(error.at("message").as_string()), Catch::Contains("too costly"));
  CHECK(error.at("param").as_string() == "guided_regex");
  CHECK(seconds < 30.0);  // the budget's time, with a loaded machine's margin (was: never)
  REQUIRE(beside.done);
  CHECK(beside.text == alone.text);
  CHECK(largest_gap_seconds(beside) < 3.0);
  // Sent again, it is refused from what was learned, at once.
  const auto again = Clock::now();
  CHECK(post(server.port(), "/v1/completions",
             json::object{{"prompt", "x"}, {"max_tokens", 8}, {"guided_regex", regex}})
            .status == 400);
  CHECK(std::chrono::duration<double>(Clock::now() - again).count() < 5.0);
}

TEST_CASE("a constraint that grows too costly mid-output ends with an error, and holds no one up",
          "[integration]") {
  Server server;
  // Cheap at its start (a literal), past the budget once the literal is written.
  std::string regex = "abcdefgh";
  for (int i = 0; i < 200; ++i) regex += ".*";
  regex += "z";
  const Stream alone = stream(server.port(), plain_stream(256), 60s);
  REQUIRE(alone.done);

  Stream constrained, beside;
  std::thread costly([&] {
    json::object body = plain_stream(32);
    body["guided_regex"] = regex;
    constrained = stream(server.port(), body, 60s);
  });
  std::this_thread::sleep_for(20ms);
  beside = stream(server.port(), plain_stream(256), 60s);
  costly.join();
  INFO("constrained: '" << constrained.text << "' " << constrained.error);
  CHECK(constrained.done);
  CHECK(constrained.finish_reason == "error");
  CHECK_THAT(constrained.error, Catch::Contains("work budget"));
  // What it wrote before is kept: a part of the literal (its mask fails once a token
  // could run past the literal into the stars).
  CHECK_FALSE(constrained.text.empty());
  CHECK(std::string("abcdefgh").rfind(constrained.text, 0) == 0);
  REQUIRE(beside.done);
  CHECK(beside.text == alone.text);
  CHECK(largest_gap_seconds(beside) < 1.0);  // was: the whole mask (23 s at K = 80)
  CHECK(server.kv_drains());
}

TEST_CASE("a client that gives up on a costly constraint leaves the engine idle", "[integration]") {
  Server server;
  std::string regex = "abcdefgh";
  for (int i = 0; i < 200; ++i) regex += ".*";
  regex += "z";
  {
    json::object body = plain_stream(32);
    body["guided_regex"] = regex;
    test::RawClient client(server.port());
    client.send(http_post("/v1/completions", body));
    client.read_until("abcdefgh", 10s);  // streaming, its mask on its way past the budget
  }                                      // gone
  CHECK(server.kv_drains());
  // Whatever was computing for it stops within the budget's time: then the process is
  // quiet (a mask that ran on, as before, burnt a core for ever).
  double quiet = 1.0;
  for (int attempt = 0; attempt < 20 && quiet > 0.3; ++attempt) {
    const double before = cpu_seconds();
    std::this_thread::sleep_for(1s);
    quiet = cpu_seconds() - before;
  }
  CHECK(quiet <= 0.3);
  const Stream after = stream(server.port(), plain_stream(16), 30s);
  CHECK(after.done);
}
