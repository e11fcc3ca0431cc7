// The HTTP server on an ephemeral port, through a real client (curl).
#include <sys/wait.h>
#include <algorithm>
#include <array>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <thread>

#include <boost/asio.hpp>

#include "monitoring/metrics.hpp"
#include "net/http_server.hpp"
#include "net_test_support.hpp"
#include "support/engine_support.hpp"
#include "support/mini_json.hpp"
#include "support/shell.hpp"
#include "support/small_model.hpp"
#include "troupe/engine.hpp"

using namespace troupe;
using namespace std::chrono_literals;
namespace asio = boost::asio;

namespace {

struct Reply {
  int status = 0;
  std::string body;
};

class Server : public test::ServedEngine {
 public:
  explicit Server(net::ServerConfig config = {}, std::function<void()> before_step = {},
                  std::int32_t context_length = 256)
      : ServedEngine("server-model", std::move(config), context_length,
                     std::max(512, context_length / 4 + 16),  // one whole context fits
                     std::move(before_step)) {}

  // curl with `args`; the body goes in through a file (no shell quoting trouble).
  Reply curl(const std::string& args, const std::string& body = {}, const std::string& path = "") {
    const test::CurlReply r = test::curl(server->port(), path, body, "-s -N " + args);
    return {r.status, r.body};
  }
  Reply get(const std::string& path, const std::string& args = "") { return curl(args, {}, path); }
  Reply post(const std::string& path, const std::string& body, const std::string& args = "") {
    return curl(args, body, path);
  }
};

test::Json parse(const std::string& s) {
  return test::JsonParser(s).parse();
}

}  // namespace

TEST_CASE("health, version and models answer", "[net][integration]") {
  Server s;
  CHECK(s.get("/health").status == 200);
  CHECK(parse(s.get("/version").body)["version"].string == "0.1.0");
  const auto models = parse(s.get("/v1/models").body);
  CHECK(models["data"].array[0]["id"].string == "troupe");
  CHECK(models["data"].array[0]["max_model_len"].number == 256);
}

TEST_CASE("a completion returns OpenAI's object, the same text each time when greedy",
          "[net][integration]") {
  Server s;
  const std::string body =
      R"({"model":"troupe","prompt":"Hello world","max_tokens":7,"temperature":0})";
  const auto first = s.post("/v1/completions", body);
  REQUIRE(first.status == 200);
  const auto r = parse(first.body);
  CHECK(r["object"].string == "text_completion");
  CHECK(r["choices"].array[0]["finish_reason"].string == "length");
  CHECK(r["usage"]["completion_tokens"].number == 7);
  CHECK(r["usage"]["prompt_tokens"].number > 0);
  CHECK(parse(s.post("/v1/completions", body).body)["choices"].array[0]["text"].string ==
        r["choices"].array[0]["text"].string);
  SECTION("token ids as the prompt, and logprobs") {
    const auto ids = s.post("/v1/completions",
                            R"({"prompt":[1,5,9],"max_tokens":3,"temperature":0,"logprobs":2})");
    REQUIRE(ids.status == 200);
    const auto lp = parse(ids.body)["choices"].array[0]["logprobs"];
    CHECK(lp["token_logprobs"].array.size() == 3);
    CHECK(lp["top_logprobs"].array[0].object.size() == 2);
  }
}

TEST_CASE("streaming sends SSE chunks, usage and [DONE]", "[net][integration]") {
  Server s;
  const auto r = s.post(
      "/v1/completions",
      R"({"prompt":"Hi","max_tokens":5,"temperature":0,"stream":true,"stream_options":{"include_usage":true}})");
  REQUIRE(r.status == 200);
  std::vector<std::string> events;
  for (std::size_t pos = 0; (pos = r.body.find("data: ", pos)) != std::string::npos;) {
    const auto end = r.body.find("\n\n", pos);
    events.push_back(r.body.substr(pos + 6, end - pos - 6));
    pos = end;
  }
  REQUIRE(events.size() == 7);  // 5 tokens, usage, [DONE]
  CHECK(events.back() == "[DONE]");
  CHECK(parse(events[4])["choices"].array[0]["finish_reason"].string == "length");
  CHECK(parse(events[5])["usage"]["completion_tokens"].number == 5);
  std::string streamed;
  for (int i = 0; i < 5; ++i) streamed += parse(events[i])["choices"].array[0]["text"].string;
  const auto whole =
      parse(s.post("/v1/completions", R"({"prompt":"Hi","max_tokens":5,"temperature":0})").body);
  CHECK(streamed == whole["choices"].array[0]["text"].string);
}

TEST_CASE("every failure is an OpenAI error object with the right status", "[net][integration]") {
  net::ServerConfig config;
  config.api_key = "sekrit";
  config.max_body_bytes = 4096;
  Server s(config);
  const std::string auth = "-H 'Authorization: Bearer sekrit'";
  auto error_of = [](const Reply& r) { return parse(r.body)["error"]["message"].string; };
  CHECK(s.post("/v1/completions", R"({"prompt":"x"})").status == 401);
  CHECK(s.post("/v1/completions", R"({"prompt":"x"})", "-H 'Authorization: Bearer wrong'").status ==
        401);
  CHECK(s.get("/v1/models", auth).status == 200);
  const auto malformed = s.post("/v1/completions", "{nope", auth);
  CHECK(malformed.status == 400);
  CHECK(error_of(malformed).find("not valid JSON") != std::string::npos);
  const auto bad_param = s.post("/v1/completions", R"({"prompt":"x","top_p":2})", auth);
  CHECK(bad_param.status == 400);
  CHECK(error_of(bad_param).find("top_p") != std::string::npos);
  const auto wrong_type = s.post("/v1/completions", R"({"prompt":"x","max_tokens":"many"})", auth);
  CHECK(wrong_type.status == 400);
  const auto too_long = s.post("/v1/completions", R"({"prompt":"x","max_tokens":1000})", auth);
  CHECK(too_long.status == 400);
  CHECK(error_of(too_long).find("maximum context length is 256 tokens") != std::string::npos);
  CHECK(s.post("/v1/completions", R"({"prompt":"x","model":"other"})", auth).status == 404);
  // Nothing is silently ignored: an unknown field is named; the documented no-ops pass.
  const auto unknown = s.post("/v1/completions", R"({"prompt":"x","top_a":0.5})", auth);
  CHECK(unknown.status == 400);
  CHECK(error_of(unknown) == "Unrecognized request argument supplied: top_a (completions)");
  CHECK(parse(unknown.body)["error"]["param"].string == "top_a");
  CHECK(s.post("/v1/completions", R"({"prompt":"x","messages":[]})", auth).status == 400);
  CHECK(s.post("/v1/chat/completions",
               R"({"messages":[{"role":"user","content":"x"}],"functions":[]})", auth)
            .status == 400);
  CHECK(
      s.post("/v1/completions", R"({"prompt":"x","max_tokens":1,"user":"u1","store":false})", auth)
          .status == 200);
  // Unset fields, and fields set to what leaving them out means, ask nothing.
  CHECK(s.post("/v1/completions",
               R"({"prompt":"x","max_tokens":1,"logit_bias":null,"best_of":1,"echo":false,)"
               R"("suffix":null})",
               auth)
            .status == 200);
  CHECK(s.post("/v1/completions", R"({"prompt":"x","logit_bias":{}})", auth).status == 200);
  // A chat client that sends the completions' defaults too.
  CHECK(s.post("/v1/chat/completions",
               R"({"messages":[{"role":"user","content":"x"}],"max_tokens":1,"echo":false,)"
               R"("best_of":1})",
               auth)
            .status == 200);
  CHECK(s.post("/v1/chat/completions",
               R"({"messages":[{"role":"user","content":"x"}],"max_tokens":1,"echo":true})", auth)
            .status == 400);
  // A suffix needs fill-in-the-middle tokens, which this model has not.
  const auto suffix = s.post("/v1/completions", R"({"prompt":"x","suffix":"y"})", auth);
  CHECK(suffix.status == 400);
  CHECK(parse(suffix.body)["error"]["param"].string == "suffix");
  CHECK(s.get("/nowhere", auth).status == 404);
  CHECK(s.get("/v1/completions", auth).status == 405);
  CHECK(s.post("/v1/completions", std::string(8000, ' '), auth).status == 413);
  CHECK(s.get("/health").status == 200);  // outside /v1: no key needed
}

TEST_CASE("a client that disconnects mid-stream frees its KV blocks", "[net][integration]") {
  Server s({}, {}, 16384);
  // curl gives up after 0.5 s of a stream of 16000 tokens: seconds of generation, far
  // past kv_drains' wait, unless the disconnect cancels it.
  const auto r = s.post("/v1/completions",
                        R"({"prompt":"Hi","max_tokens":16000,"stream":true,"ignore_eos":true})",
                        "--max-time 0.5");
  CHECK(r.body.find("[DONE]") == std::string::npos);
  CHECK(s.kv_drains());
  CHECK(test::num_aborted_is(*s.metrics, 1));  // cancelled, not run to its end
  CHECK(s.get("/health").status == 200);       // and the server carries on
}

TEST_CASE("tokenize and detokenize round-trip", "[net][integration]") {
  Server s;
  const auto t = parse(s.post("/tokenize", R"({"prompt":"Hello world"})").body);
  CHECK(t["count"].number == t["tokens"].array.size());
  std::string ids;
  for (const auto& id : t["tokens"].array)
    ids += (ids.empty() ? "" : ",") + std::to_string(static_cast<int>(id.number));
  const auto d = parse(s.post("/detokenize", "{\"tokens\":[" + ids + "]}").body);
  CHECK(d["prompt"].string == " Hello world");
  CHECK(s.post("/detokenize", R"({"tokens":[999999]})").status == 400);
}

TEST_CASE("chat completions render the template and answer in chat objects", "[net][integration]") {
  Server s;
  const std::string body =
      R"({"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],"max_tokens":6,"temperature":0})";
  const auto r = s.post("/v1/chat/completions", body);
  REQUIRE(r.status == 200);
  const auto j = parse(r.body);
  CHECK(j["object"].string == "chat.completion");
  CHECK(j["choices"].array[0]["message"]["role"].string == "assistant");
  CHECK(j["usage"]["completion_tokens"].number == 6);
  // The prompt is the ChatML rendering (this model has no template of its own).
  const auto t = parse(
      s.post(
           "/tokenize",
           R"({"prompt":"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"})")
          .body);
  CHECK(j["usage"]["prompt_tokens"].number == t["count"].number);

  const std::string stream_body =
      R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":4,"temperature":0,"stream":true,"logprobs":true,"top_logprobs":1})";
  const auto st = s.post("/v1/chat/completions", stream_body);
  REQUIRE(st.status == 200);
  std::vector<std::string> events;
  for (std::size_t pos = 0; (pos = st.body.find("data: ", pos)) != std::string::npos;) {
    const auto end = st.body.find("\n\n", pos);
    events.push_back(st.body.substr(pos + 6, end - pos - 6));
    pos = end;
  }
  REQUIRE(events.size() == 6);  // role, 4 tokens, [DONE]
  CHECK(parse(events[0])["choices"].array[0]["delta"]["role"].string == "assistant");
  CHECK(parse(events[1])["object"].string == "chat.completion.chunk");
  CHECK(parse(events[1])["choices"].array[0]["logprobs"]["content"].array.size() == 1);
  CHECK(parse(events[4])["choices"].array[0]["finish_reason"].string == "length");
  CHECK(events[5] == "[DONE]");
  CHECK(s.post("/v1/chat/completions", R"({"messages":[]})").status == 400);
  CHECK(s.post("/v1/chat/completions", R"({"messages":[{"role":"robot","content":"x"}]})").status ==
        400);
}

TEST_CASE("/metrics exposes the engine's metrics and passes promtool",
          "[net][integration][metrics]") {
  Server s;
  REQUIRE(
      s.post("/v1/completions", R"({"prompt":"Hello","max_tokens":5,"temperature":0})").status ==
      200);
  REQUIRE(s.post("/v1/completions", R"({"prompt":"Hello","max_tokens":5,"stream":true})").status ==
          200);
  s.get("/nowhere");
  const auto r = s.get("/metrics");
  REQUIRE(r.status == 200);
  for (const char* name :
       {"troupe_num_requests_running",
        "troupe_num_requests_waiting",
        "troupe_kv_cache_usage_ratio",
        "troupe_prompt_tokens_total",
        "troupe_generation_tokens_total",
        "troupe_num_preemptions_total",
        "troupe_prefix_cache_queries_total",
        "troupe_prefix_cache_hits_total",
        "troupe_request_success_total{model_name=\"troupe\",finish_reason=\"length\"} 2",
        "troupe_time_to_first_token_seconds_bucket",
        "troupe_inter_token_latency_seconds_count",
        "troupe_time_per_output_token_seconds_sum",
        "troupe_e2e_request_latency_seconds_count{model_name=\"troupe\"} 2",
        "troupe_request_queue_time_seconds_count{model_name=\"troupe\"} 2",
        "troupe_iteration_duration_seconds_count",
        "troupe_request_prefill_time_seconds_count{model_name=\"troupe\"} 2",
        "troupe_request_decode_time_seconds_count{model_name=\"troupe\"} 2",
        "troupe_iteration_tokens_bucket",
        "troupe_generation_tokens_total{model_name=\"troupe\"} 10",
        "troupe_http_requests_total{model_name=\"troupe\",route=\"/v1/"
        "completions\",status=\"200\"} 2",
        "troupe_http_requests_total{model_name=\"troupe\",route=\"other\",status=\"404\"} 1"}) {
    INFO(name);
    CHECK(r.body.find(name) != std::string::npos);
  }
  // promtool (Debian's prometheus package) lints the exposition.
  const std::string file = test::temp_path("metrics.txt");
  std::FILE* f = std::fopen(file.c_str(), "wb");
  std::fwrite(r.body.data(), 1, r.body.size(), f);
  std::fclose(f);
  const int status =
      std::system(("promtool check metrics < " + file + " > " + file + ".out 2>&1").c_str());
  INFO(test::read_text(file + ".out"));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("past its limits the server answers 429 and 503", "[net][integration]") {
  SECTION("too many requests in flight: 429") {
    net::ServerConfig config;
    config.max_concurrent_requests = 1;
    Server s(config, [] { std::this_thread::sleep_for(5ms); });
    // One long stream holds the only slot while a second request arrives.
    std::thread holder([&] {
      s.post("/v1/completions",
             R"({"prompt":"Hi","max_tokens":200,"ignore_eos":true,"stream":true})");
    });
    for (int i = 0; i < 1000 && s.engine->stats().num_running == 0; ++i)
      std::this_thread::sleep_for(5ms);
    const Reply busy = s.post("/v1/completions", R"({"prompt":"Hi","max_tokens":2})");
    holder.join();
    CHECK(busy.status == 429);
    CHECK(parse(busy.body)["error"]["type"].string == "rate_limit_error");
    CHECK(s.post("/v1/completions", R"({"prompt":"Hi","max_tokens":2})").status ==
          200);  // free again
  }
  SECTION("too many connections: 503") {
    net::ServerConfig config;
    config.max_connections = 1;
    Server s(config);
    // An idle connection takes the only place.
    asio::io_context io;
    asio::ip::tcp::socket idle(io);
    idle.connect({asio::ip::make_address("127.0.0.1"), s.server->port()});
    for (int i = 0; i < 1000 && s.server->num_connections() == 0; ++i)
      std::this_thread::sleep_for(5ms);
    const auto refused = s.get("/health");
    CHECK(refused.status == 503);
    idle.close();
  }
}

TEST_CASE("n choices come back as n indexed choices, streamed or not", "[net][integration]") {
  Server s;
  const auto r = s.post("/v1/completions", R"({"prompt":"Hi","max_tokens":4,"n":3,"seed":5})");
  REQUIRE(r.status == 200);
  const auto j = parse(r.body);
  REQUIRE(j["choices"].array.size() == 3);
  for (int i = 0; i < 3; ++i) CHECK(j["choices"].array[i]["index"].number == i);
  CHECK(j["usage"]["completion_tokens"].number == 12);
  const auto st =
      s.post("/v1/chat/completions",
             R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":3,"n":2,"stream":true})");
  REQUIRE(st.status == 200);
  int roles = 0, finishes = 0;
  for (std::size_t pos = 0; (pos = st.body.find("data: ", pos)) != std::string::npos;) {
    const auto end = st.body.find("\n\n", pos);
    const std::string event = st.body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (event == "[DONE]") continue;
    const auto choice = parse(event)["choices"].array[0];
    if (choice["delta"].object.count("role")) ++roles;
    if (choice["finish_reason"].kind == test::Json::Kind::string) ++finishes;
  }
  CHECK(roles == 2);
  CHECK(finishes == 2);
  CHECK(st.body.find("data: [DONE]") != std::string::npos);
  CHECK(s.post("/v1/completions", R"({"prompt":"Hi","n":17})").status == 400);
}

TEST_CASE("a failure inside the engine is a 500 error object, and serving goes on",
          "[net][integration]") {
  // Each failing step costs the replica its worker; a request resumes on the next one
  // (issue 31), and ends with the error only when its steps keep failing.
  auto failures = std::make_shared<std::atomic<int>>(0);
  Server s({}, [failures] {
    if (failures->load() > 0) {
      failures->fetch_sub(1);
      throw std::runtime_error("injected fault");
    }
  });
  const std::string greedy = R"({"prompt":"Hi","max_tokens":3,"temperature":0})";
  const auto undisturbed = s.post("/v1/completions", greedy);
  REQUIRE(undisturbed.status == 200);
  failures->store(1);  // one lost worker: the request resumes and completes
  const auto resumed = s.post("/v1/completions", greedy);
  CHECK(resumed.status == 200);
  CHECK(parse(resumed.body)["choices"].array[0]["text"].string ==
        parse(undisturbed.body)["choices"].array[0]["text"].string);
  failures->store(1000);  // every step fails: given up after a few workers
  const auto r = s.post("/v1/completions", R"({"prompt":"Hi","max_tokens":3})");
  CHECK(r.status == 500);
  CHECK(parse(r.body)["error"]["message"].string.find("injected fault") != std::string::npos);
  CHECK(parse(r.body)["error"]["type"].string == "internal_error");
  failures->store(0);
  CHECK(s.post("/v1/completions", R"({"prompt":"Hi","max_tokens":3})").status == 200);
}
