// Structured outputs end to end: requests that carry a JSON schema, a regex, a choice list or
// a GBNF grammar, served over HTTP and the WebSocket by a random-weight model. Its free output
// is gibberish, so whatever comes back well-formed was made so by the constraint. JSON schema
// outputs are judged by Python's jsonschema (tests/net/validate_json_schema.py).
#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <boost/json.hpp>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include "http_exchange.hpp"
#include "net/http_server.hpp"
#include "net_test_support.hpp"
#include "support/test_support.hpp"

using namespace troupe;
using namespace std::chrono_literals;
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace json = boost::json;
using tcp = asio::ip::tcp;

namespace {

// The served model's context: room for the longest schema output below.
constexpr std::int32_t kContextLength = 1024;

struct Server : test::ServedEngine {
  explicit Server(std::function<void()> before_step = {},
                  std::int32_t context_length = kContextLength, std::int32_t num_kv_blocks = 2048,
                  SpeculativeConfig speculative = {})
      : ServedEngine("structured-model", {}, context_length, num_kv_blocks, std::move(before_step),
                     0, std::move(speculative)) {}
  std::uint16_t port() const { return server->port(); }
};

using Reply = test::HttpReply;

// One POST on a connection of its own, read to the end of the response (a whole SSE stream
// too), within 120 s.
Reply post(std::uint16_t port, const std::string& target, const json::object& body) {
  return test::post_json(port, target, json::serialize(body));
}

bool is_chat(const std::string& target) {
  return target == "/v1/chat/completions";
}

// A request for `target` with `prompt` as its prompt or its one user message.
json::object request_for(const std::string& target, const std::string& prompt) {
  json::object body;
  if (is_chat(target)) {
    body["messages"] = json::array{json::object{{"role", "user"}, {"content", prompt}}};
  } else {
    body["prompt"] = prompt;
  }
  return body;
}

struct Output {
  std::string text;
  std::string finish_reason;
};

// The choices of a non-streamed reply, in order.
std::vector<Output> outputs_of(const std::string& target, const Reply& reply) {
  INFO(reply.body);
  REQUIRE(reply.status == 200);
  std::vector<Output> out;
  const json::value parsed = json::parse(reply.body);
  for (const auto& c : parsed.at("choices").as_array()) {
    const auto& choice = c.as_object();
    const auto& text = is_chat(target) ? choice.at("message").at("content") : choice.at("text");
    out.push_back(
        {std::string(text.as_string()), std::string(choice.at("finish_reason").as_string())});
  }
  return out;
}

// The one output of a streamed (SSE) reply: its deltas joined, and its finish reason.
Output streamed_output(const std::string& target, const Reply& reply) {
  INFO(reply.body);
  REQUIRE(reply.status == 200);
  Output out;
  const test::SseEvents events = test::sse_events(reply.body);
  for (const std::string& event : events.data) {
    const json::value parsed = json::parse(event);
    const auto& choices = parsed.at("choices").as_array();
    if (choices.empty()) continue;  // the usage chunk
    const auto& choice = choices[0].as_object();
    if (is_chat(target)) {
      const auto& delta = choice.at("delta").as_object();
      if (const auto* content = delta.if_contains("content"); content && content->is_string())
        out.text += content->as_string();
    } else {
      out.text += choice.at("text").as_string();
    }
    if (const auto& reason = choice.at("finish_reason"); reason.is_string())
      out.finish_reason = reason.as_string();
  }
  CHECK(events.done);
  return out;
}

// The error object of a refused request.
json::object error_of(const Reply& reply) {
  INFO(reply.body);
  REQUIRE(reply.status == 400);
  return json::parse(reply.body).at("error").as_object();
}

// Python with jsonschema's verdict on each (schema, output): "ok" or "invalid: why".
// Skips the running test when python3 or its jsonschema is absent.
std::vector<std::string> python_verdicts(const json::array& cases) {
  if (!test::python_has("jsonschema")) {
    test::skip_test(std::string(test::kPython) +
                    " with jsonschema is absent (Debian: python3-jsonschema)");
  }
  const std::string in = test::temp_path("structured-cases.json");
  const std::string out = test::temp_path("structured-verdicts.txt");
  std::ofstream(in) << json::serialize(cases);
  const std::string script = std::string(TROUPE_SOURCE_DIR) + "/tests/net/validate_json_schema.py";
  const std::string command =
      std::string(test::kPython) + " '" + script + "' '" + in + "' > '" + out + "' 2>&1";
  const int status = std::system(command.c_str());
  std::vector<std::string> verdicts;
  std::ifstream lines(out);
  for (std::string line; std::getline(lines, line);) verdicts.push_back(line);
  INFO(test::read_text(out));
  REQUIRE(status == 0);
  REQUIRE(verdicts.size() == cases.size());
  return verdicts;
}

// Checks each (schema, output) against its schema, saying which fail and why.
void check_valid(const json::array& cases) {
  const auto verdicts = python_verdicts(cases);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    INFO("schema: " << json::serialize(cases[i].at("schema")));
    INFO("output: " << cases[i].at("output").as_string());
    CHECK(verdicts[i] == "ok");
  }
}

// Objects in objects, a list and a pattern: the schema the streaming tests use too.
const char* const kNestedSchema = R"({"type": "object", "properties": {"user": {"type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8},
                       "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
                       "home": {"type": "object", "properties": {"zip": {"type": "string",
                                "pattern": "^[0-9]{5}$"}}, "required": ["zip"],
                                "additionalProperties": false}},
        "required": ["name", "tags", "home"], "additionalProperties": false}},
        "required": ["user"], "additionalProperties": false})";

// At least one schema per supported keyword. Strings carry a maxLength (or a format, a
// pattern or an enum) and lists a maxItems where the keyword allows: a random model closes
// an open string or list only by chance, and the outputs here must finish.
const std::vector<const char*> kSchemas = {
    R"({"type": "string", "maxLength": 12})",
    R"({"type": "integer"})",
    R"({"type": "number"})",
    R"({"type": "boolean"})",
    R"({"type": "null"})",
    R"({"type": ["integer", "null"]})",
    R"({"type": ["boolean", "string"], "maxLength": 5})",
    R"({"enum": ["red", "green", 3, null, true, {"a": 1}]})",
    R"({"const": {"a": [1, 2], "b": "x"}})",
    R"({"type": ["string", "null"], "enum": ["red", 3, null, true, "blue"]})",
    R"({"type": "string", "minLength": 3, "maxLength": 6})",
    R"({"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"})",
    R"({"type": "string", "pattern": "^(ab|c)*[0-9]{2}$"})",
    R"({"type": "string", "format": "date"})",
    R"({"type": "string", "format": "time"})",
    R"({"type": "string", "format": "date-time"})",
    R"({"type": "string", "format": "uuid"})",
    R"({"type": "string", "format": "email"})",
    R"({"type": "string", "format": "ipv4"})",
    R"({"type": "integer", "minimum": 5, "maximum": 123})",
    R"({"type": "integer", "exclusiveMinimum": -20, "exclusiveMaximum": -3})",
    R"({"type": "integer", "minimum": 100})",
    R"({"type": "integer", "maximum": -7})",
    R"({"type": "number", "minimum": 0})",
    R"({"type": "number", "exclusiveMinimum": 0})",
    R"({"type": "array", "items": {"type": "integer"}, "maxItems": 4})",
    R"({"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 3})",
    R"({"type": "array", "prefixItems": [{"type": "string", "maxLength": 4}, {"type": "integer"}],
        "items": false})",
    R"({"type": "array", "prefixItems": [{"const": "head"}, {"type": "boolean"}],
        "items": {"type": "null"}})",
    R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 150}},
        "required": ["name", "age"], "additionalProperties": false})",
    R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"},
        "c": {"type": "null"}}, "additionalProperties": false})",
    kNestedSchema,
    R"({"anyOf": [{"type": "string", "maxLength": 3},
                  {"type": "array", "items": {"type": "integer"}, "maxItems": 2}]})",
    R"({"oneOf": [{"const": 1}, {"const": "one"}, {"type": "boolean"}]})",
    R"({"allOf": [{"type": "integer", "minimum": 0, "maximum": 9}]})",
    R"({"$defs": {"node": {"type": "object", "properties": {"value": {"type": "integer"},
        "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
        "required": ["value", "next"], "additionalProperties": false}},
        "$ref": "#/$defs/node"})",
    R"({"definitions": {"tag": {"type": "string", "maxLength": 3}},
        "type": "array", "items": {"$ref": "#/definitions/tag"}, "maxItems": 3})",
    R"({"title": "Weather", "description": "a call", "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10, "description": "where"},
                       "unit": {"enum": ["c", "f"], "default": "c"}},
        "required": ["city", "unit"], "additionalProperties": false})",
};

// Schemas whose keys are open: any string may be a key, and a random model closes a string
// only by chance. Their outputs may run to max_tokens; those that finish must validate.
const std::vector<const char*> kOpenSchemas = {
    R"({"type": "object", "required": ["x"], "additionalProperties": {"type": "boolean"}})",
    R"({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
        "additionalProperties": true})",
    R"({"type": "object", "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9}})",
    R"({"type": "object"})",
};

// One request of a batch: where it goes and what it carries; its reply once run.
struct Job {
  std::string target;
  json::object body;
  Reply reply;
};

// Runs `jobs` from `num_threads` client threads at once (the engine batches them).
void run_all(const Server& s, std::vector<Job>& jobs, int num_threads = 4) {
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < num_threads; ++t) {
    threads.emplace_back([&] {
      for (std::size_t i; (i = next.fetch_add(1)) < jobs.size();) {
        jobs[i].reply = post(s.port(), jobs[i].target, jobs[i].body);
      }
    });
  }
  for (auto& t : threads) t.join();
}

// The (temperature, seed) pairs each constraint is run with; a seed of 0 is no seed.
const std::vector<std::pair<double, std::int64_t>> kSamplings = {
    {0.0, 0}, {0.7, 11}, {0.7, 12}, {1.5, 13}, {1.5, 14}};

// A job per sampling for `constraint` (fields merged into the body), chat and completions
// taking turns from `turn`; `max_tokens` is room for the longest output to finish.
std::vector<Job> jobs_for(const json::object& constraint, std::size_t turn,
                          std::int64_t max_tokens = 600) {
  std::vector<Job> jobs;
  for (const auto& [temperature, seed] : kSamplings) {
    const std::string target =
        (turn + jobs.size()) % 2 == 0 ? "/v1/chat/completions" : "/v1/completions";
    json::object body = request_for(target, "Answer in the asked form.");
    for (const auto& [key, value] : constraint) body[key] = value;
    body["max_tokens"] = max_tokens;
    body["temperature"] = temperature;
    if (seed != 0) body["seed"] = seed;
    jobs.push_back({target, std::move(body), {}});
  }
  return jobs;
}

// OpenAI's response_format for `schema`.
json::object response_format(const json::value& schema, const std::string& name = "answer") {
  return json::object{
      {"response_format",
       json::object{
           {"type", "json_schema"},
           {"json_schema", json::object{{"name", name}, {"schema", schema}, {"strict", true}}}}}};
}

std::string describe(const Job& job) {
  return job.target + " " + json::serialize(job.body);
}

// Runs `jobs` on `plain` and a copy on `speculating` (`num_threads` clients each): every
// output of the speculating server is the plain one's, text and finish reason.
void check_same_outputs(const Server& plain, const Server& speculating, std::vector<Job> jobs,
                        int num_threads = 4) {
  std::vector<Job> again = jobs;
  run_all(plain, jobs, num_threads);
  run_all(speculating, again, num_threads);
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    INFO(describe(jobs[j]));
    const auto want = outputs_of(jobs[j].target, jobs[j].reply);
    const auto got = outputs_of(again[j].target, again[j].reply);
    REQUIRE(want.size() == 1);
    REQUIRE(got.size() == 1);
    CHECK(got[0].text == want[0].text);
    CHECK(got[0].finish_reason == want[0].finish_reason);
  }
}

// Each job's one output, required to have finished on its own (not cut by max_tokens).
std::vector<std::string> finished_outputs(const std::vector<Job>& jobs) {
  std::vector<std::string> texts;
  for (const Job& job : jobs) {
    INFO(describe(job));
    const auto outputs = outputs_of(job.target, job.reply);
    REQUIRE(outputs.size() == 1);
    INFO("output: " << outputs[0].text);
    CHECK(outputs[0].finish_reason == "stop");
    texts.push_back(outputs[0].text);
  }
  return texts;
}

// Runs each case's constraint (a body's fields) on its jobs; every output must finish and
// match the case's regex whole.
void check_outputs_match(Server& s,
                         const std::vector<std::pair<json::object, std::string>>& cases) {
  std::vector<Job> jobs;
  std::vector<std::string> regex_of_job;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto more = jobs_for(cases[i].first, i, 100);
    jobs.insert(jobs.end(), more.begin(), more.end());
    regex_of_job.insert(regex_of_job.end(), more.size(), cases[i].second);
  }
  run_all(s, jobs);
  const auto texts = finished_outputs(jobs);
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    INFO(describe(jobs[j]) << "\noutput: " << texts[j]);
    CHECK(std::regex_match(texts[j], std::regex(regex_of_job[j])));
  }
}

}  // namespace

TEST_CASE("every output under a JSON schema finishes and validates against the schema",
          "[net][integration]") {
  REQUIRE(kSchemas.size() >= 30);
  python_verdicts({});  // skips now, before the runs, where there is no validator
  Server s;
  std::vector<Job> jobs;
  std::vector<const char*> schema_of_job;
  for (const auto* list : {&kSchemas, &kOpenSchemas}) {
    for (const char* schema : *list) {
      const auto more = jobs_for(response_format(json::parse(schema)), schema_of_job.size());
      jobs.insert(jobs.end(), more.begin(), more.end());
      schema_of_job.insert(schema_of_job.end(), more.size(), schema);
    }
  }
  run_all(s, jobs);
  json::array cases;
  int num_open = 0, num_open_finished = 0;
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    INFO(describe(jobs[j]));
    const auto outputs = outputs_of(jobs[j].target, jobs[j].reply);
    REQUIRE(outputs.size() == 1);
    INFO("output: " << outputs[0].text);
    const bool open = j >= kSchemas.size() * kSamplings.size();
    num_open += open ? 1 : 0;
    if (open && outputs[0].finish_reason == "length") continue;
    CHECK(outputs[0].finish_reason == "stop");
    num_open_finished += open ? 1 : 0;
    cases.push_back(
        json::object{{"schema", json::parse(schema_of_job[j])}, {"output", outputs[0].text}});
  }
  check_valid(cases);
  CHECK(num_open_finished * 2 >= num_open);
  CHECK(s.kv_drains());
}

TEST_CASE("an output cut by max_tokens mid-structure finishes with length, not stop",
          "[net][integration]") {
  Server s;
  const json::value schema = json::parse(R"({"type": "object",
      "properties": {"name": {"type": "string", "maxLength": 8}}, "required": ["name"],
      "additionalProperties": false})");
  std::vector<Job> jobs = jobs_for(response_format(schema), 0, 3);
  run_all(s, jobs);
  for (const Job& job : jobs) {
    INFO(describe(job));
    const auto outputs = outputs_of(job.target, job.reply);
    REQUIRE(outputs.size() == 1);
    INFO("output: " << outputs[0].text);
    CHECK(outputs[0].finish_reason == "length");
    // Three tokens cannot hold the required key and its value: the object is still open.
    json::error_code ec;
    json::parse(outputs[0].text, ec);
    CHECK(ec);
  }
}

TEST_CASE("outputs under a regex match it whole", "[net][integration]") {
  Server s;
  // (constraint, the same regex for std::regex, ECMAScript)
  const std::vector<std::pair<json::object, std::string>> cases = {
      {{{"guided_regex", R"([a-z]{3}-\d{2,4})"}}, R"([a-z]{3}-\d{2,4})"},
      {{{"structured_outputs", {{"regex", "(yes|no), [0-9]{1,3} (cats|dogs)"}}}},
       "(yes|no), [0-9]{1,3} (cats|dogs)"},
      {{{"guided_regex", R"(^\(\d{3}\) \d{3}-\d{4}$)"}}, R"(\(\d{3}\) \d{3}-\d{4})"},
      {{{"structured_outputs", {{"regex", R"([A-Z][a-z]{0,6}( [A-Z][a-z]{0,6}){0,2}\.)"}}}},
       R"([A-Z][a-z]{0,6}( [A-Z][a-z]{0,6}){0,2}\.)"},
  };
  check_outputs_match(s, cases);
}

TEST_CASE("outputs under a choice list are exactly one of the choices", "[net][integration]") {
  Server s;
  const json::array colours = {"red", "green", "blue"};
  const json::array phrases = {"alpha beta", "gamma", "\xce\xb4\xce\xad\xce\xbb\xcf\x84\xce\xb1",
                               "gamma ray"};
  std::vector<Job> jobs = jobs_for({{"guided_choice", colours}}, 0, 20);
  const auto more = jobs_for({{"structured_outputs", {{"choice", phrases}}}}, 1, 20);
  jobs.insert(jobs.end(), more.begin(), more.end());
  run_all(s, jobs);
  const auto texts = finished_outputs(jobs);
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    INFO(describe(jobs[j]) << "\noutput: " << texts[j]);
    const json::array& choices = j < kSamplings.size() ? colours : phrases;
    CHECK(std::find(choices.begin(), choices.end(), json::value(texts[j])) != choices.end());
  }
}

TEST_CASE("outputs under a GBNF grammar are sentences of it", "[net][integration]") {
  Server s;
  // Arithmetic with one level of parentheses (llama.cpp's `grammar`), and a list (vLLM's
  // guided_grammar and structured_outputs.grammar); each with the regex it equals.
  const std::string arithmetic = R"gbnf(root ::= term ( ws op ws term ){0,4}
term ::= number | "(" number ( op number ){1,2} ")"
number ::= "-"? [1-9] [0-9]{0,2} | "0"
op ::= [-+*/]
ws ::= " "?
)gbnf";
  const std::string number = "(-?[1-9][0-9]{0,2}|0)";
  const std::string term = "(" + number + R"(|\()" + number + "([-+*/]" + number + R"(){1,2}\)))";
  const std::string list = R"(root ::= "[" item ( ", " item ){0,3} "]"
item ::= [a-z]{1,5} | "'" [A-Z]{2} "'"
)";
  const std::string item = R"(([a-z]{1,5}|'[A-Z]{2}'))";
  const std::vector<std::pair<json::object, std::string>> cases = {
      {{{"grammar", arithmetic}}, term + "( ?[-+*/] ?" + term + "){0,4}"},
      {{{"guided_grammar", list}}, R"(\[)" + item + "(, " + item + R"(){0,3}\])"},
      {{{"structured_outputs", {{"grammar", list}}}},
       R"(\[)" + item + "(, " + item + R"(){0,3}\])"},
  };
  check_outputs_match(s, cases);
}

TEST_CASE("outputs under json_object are JSON objects", "[net][integration]") {
  Server s;
  // Any object: its strings are unbounded, and a random model closes one only by chance. The
  // outputs that finish must be objects; those cut by max_tokens must have begun as one.
  std::vector<Job> jobs = jobs_for({{"response_format", {{"type", "json_object"}}}}, 0, 300);
  const auto more = jobs_for({{"structured_outputs", {{"json_object", true}}}}, 1, 300);
  jobs.insert(jobs.end(), more.begin(), more.end());
  run_all(s, jobs);
  int num_finished = 0;
  for (const Job& job : jobs) {
    INFO(describe(job));
    const auto outputs = outputs_of(job.target, job.reply);
    REQUIRE(outputs.size() == 1);
    INFO("output: " << outputs[0].text);
    CHECK(outputs[0].text.rfind('{', 0) == 0);
    if (outputs[0].finish_reason == "length") continue;
    CHECK(outputs[0].finish_reason == "stop");
    ++num_finished;
    json::error_code ec;
    const json::value parsed = json::parse(outputs[0].text, ec);
    CHECK(!ec);
    CHECK(parsed.is_object());
  }
  CHECK(num_finished >= static_cast<int>(jobs.size()) / 2);
}

TEST_CASE("a constraint that cannot be compiled is a 400 naming its parameter",
          "[net][integration]") {
  Server s;
  struct Refused {
    json::object constraint;
    std::string param;
    std::string message;  // a part of the error's message
  };
  const std::vector<Refused> cases = {
      {response_format(
           json::parse(R"({"type": "object", "properties": {"a": {"not": {"type": "null"}}}})")),
       "response_format.json_schema.schema", "'not'"},
      {{{"guided_json", R"({"type": "array", "uniqueItems": true})"}},
       "guided_json",
       "uniqueItems"},
      {{{"structured_outputs",
         {{"json", json::parse(R"({"anyOf": [{"type": "integer"}], "not": {"const": 1}})")}}}},
       "structured_outputs.json",
       "'not'"},
      {{{"guided_regex", "(?=a)b"}}, "guided_regex", "lookaround"},
      {{{"structured_outputs", {{"regex", "(ab"}}}}, "structured_outputs.regex", ""},
      {{{"grammar", "root ::= item\n"}}, "grammar", "item"},
      {{{"guided_regex", "[a-z]+"}, {"guided_choice", json::array{"a", "b"}}},
       "guided_choice",
       "only one"},
      {{{"response_format", {{"type", "json_object"}}}, {"grammar", "root ::= \"x\"\n"}},
       "grammar",
       "only one"},
      {{{"response_format", {{"type", "xml"}}}}, "response_format.type", "xml"},
      {{{"guided_choice", json::array{}}}, "guided_choice", "non-empty"},
      {{{"structured_outputs", {{"choice", json::array{}}}}},
       "structured_outputs.choice",
       "non-empty"},
      {{{"json_schema", {{"type", "number"}, {"maximum", 4.5}}}}, "json_schema", "maximum"},
      {{{"guided_json", R"({"type": "object", "required": ["x"], "additionalProperties": false})"}},
       "guided_json",
       "'x' is required"},
      // A length bound on a pattern or a format would be dropped: refused instead.
      {{{"guided_json", R"({"type": "string", "pattern": "^[a-z ]+$", "maxLength": 4})"}},
       "guided_json",
       "maxLength"},
      {response_format(json::parse(R"({"type": "string", "format": "email", "maxLength": 8})")),
       "response_format.json_schema.schema", "maxLength"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const std::string target = i % 2 == 0 ? "/v1/chat/completions" : "/v1/completions";
    json::object body = request_for(target, "Hi");
    for (const auto& [key, value] : cases[i].constraint) body[key] = value;
    INFO(target << " " << json::serialize(body));
    const auto error = error_of(post(s.port(), target, body));
    INFO(json::serialize(error));
    CHECK(error.at("type") == "invalid_request_error");
    CHECK(error.at("param") == json::value(cases[i].param));
    CHECK_THAT(std::string(error.at("message").as_string()),
               Catch::Contains(cases[i].message) && Catch::Contains(cases[i].param));
  }
  CHECK(s.kv_drains());
}

TEST_CASE("an unconstrained request batched with a constrained one keeps its greedy output",
          "[net][integration]") {
  // Steps stretched a little, so that the long constrained output is still running when the
  // unconstrained request arrives.
  Server s([] { std::this_thread::sleep_for(2ms); });
  json::object free = request_for("/v1/completions", "Once upon a time");
  free["max_tokens"] = 24;
  free["temperature"] = 0;
  free["ignore_eos"] = true;
  const auto alone = outputs_of("/v1/completions", post(s.port(), "/v1/completions", free));
  REQUIRE(alone.size() == 1);

  // 40 digits in a list: at least 80 tokens, each a step of its own.
  json::object constrained = request_for("/v1/chat/completions", "Count.");
  constrained["guided_json"] = json::parse(R"({"type": "array", "minItems": 40, "maxItems": 40,
      "items": {"type": "integer", "minimum": 0, "maximum": 9}})");
  constrained["max_tokens"] = 400;
  constrained["temperature"] = 0;
  constrained["stream"] = true;
  const auto before = s.engine->stats();
  Reply constrained_reply;
  std::thread constrained_client(
      [&] { constrained_reply = post(s.port(), "/v1/chat/completions", constrained); });
  for (int i = 0; i < 2000 && s.engine->stats().num_running == 0; ++i)
    std::this_thread::sleep_for(1ms);
  const auto together = outputs_of("/v1/completions", post(s.port(), "/v1/completions", free));
  constrained_client.join();
  const auto after = s.engine->stats();
  // Some step carried both sequences: more sequences were stepped than there were steps.
  CHECK(after.num_step_sequences - before.num_step_sequences > after.num_steps - before.num_steps);
  REQUIRE(together.size() == 1);
  CHECK(together[0].text == alone[0].text);
  CHECK(together[0].finish_reason == "length");
  const Output list = streamed_output("/v1/chat/completions", constrained_reply);
  INFO("output: " << list.text);
  CHECK(list.finish_reason == "stop");
  CHECK(std::regex_match(list.text, std::regex(R"(\[\s*[0-9](\s*,\s*[0-9]){39}\s*\]\s*)")));
}

TEST_CASE("outputs under constraints are the same with n-gram speculation, drafts accepted",
          "[net][integration][speculative]") {
  // Proposals are verified under the grammar's mask at every position, so a proposal the
  // grammar refuses is never taken: greedy and seeded outputs are those without a draft.
  SpeculativeConfig ngram;
  ngram.num_speculative_tokens = 4;
  ngram.prompt_lookup_max = 3;
  ngram.prompt_lookup_min = 1;
  ngram.disable_by_batch_size = 8;
  Server plain;
  Server speculating({}, kContextLength, 2048, ngram);
  const std::string list = R"(root ::= "[" item ( ", " item ){0,7} "]"
item ::= [a-z]{1,3} | "'" [A-Z]{2} "'"
)";
  std::vector<Job> jobs;
  for (const json::object& constraint :
       {response_format(json::parse(R"({"type": "array", "minItems": 12, "maxItems": 12,
            "items": {"type": "integer", "minimum": 0, "maximum": 9}})")),
        response_format(json::parse(kNestedSchema)),
        json::object{{"guided_regex", "(ab|cd){2,8}-[0-9]{2}"}},
        json::object{{"guided_grammar", list}}}) {
    const auto more = jobs_for(constraint, jobs.size(), 200);
    jobs.insert(jobs.end(), more.begin(), more.end());
  }
  check_same_outputs(plain, speculating, jobs);
  const EngineStats stats = speculating.engine->stats();
  CHECK(stats.spec_num_drafts > 0);
  CHECK(stats.spec_num_accepted_tokens > 0);
  CHECK(speculating.kv_drains());
}

TEST_CASE(
    "a draft model under constraints proposes what the grammar allows: the model as its own "
    "draft has its greedy proposals accepted",
    "[net][integration][speculative]") {
  // Each proposal is the draft's likeliest token among those the grammar allows next, as
  // the verification's mask will have it: with the model as its own draft a greedy output's
  // proposals are the model's masked tokens, all but where only an end may come (the guide
  // never proposes one). Unguided, the draft's likeliest token is mostly one the grammar
  // refuses.
  const std::string model =
      test::write_small_model("structured-model-" + std::to_string(kContextLength) + "-0",
                              [](model::RandomModelSpec& s) { s.context_length = kContextLength; });
  SpeculativeConfig self;
  self.draft_model = model;
  self.num_speculative_tokens = 3;
  self.disable_by_batch_size = 64;
  Server plain;
  Server drafting({}, kContextLength, 2048, self);
  std::vector<Job> jobs;
  for (const json::object& constraint :
       {response_format(json::parse(kNestedSchema)),
        json::object{{"guided_regex", "(ab|cd){2,8}-[0-9]{2}"}},
        response_format(json::parse(R"({"type": "array", "minItems": 6, "maxItems": 6,
            "items": {"type": "integer", "minimum": 0, "maximum": 9}})"))}) {
    auto one = jobs_for(constraint, jobs.size(), 300);
    jobs.push_back(one.front());  // greedy
  }
  check_same_outputs(plain, drafting, jobs, 1);
  const EngineStats stats = drafting.engine->stats();
  INFO(stats.spec_num_accepted_tokens << " of " << stats.spec_num_draft_tokens << " accepted");
  REQUIRE(stats.spec_num_draft_tokens > 30);
  // At most one refused draft an output (where it must end), with its later tokens.
  CHECK(stats.spec_num_accepted_tokens >=
        stats.spec_num_draft_tokens - 3 * static_cast<std::int64_t>(jobs.size()));
  CHECK(drafting.kv_drains());
}

TEST_CASE("a WebSocket generate message with a constraint streams a valid output",
          "[net][websocket][integration]") {
  Server s;
  asio::io_context io;
  websocket::stream<tcp::socket> ws(io);
  ws.next_layer().connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), s.port()));
  ws.handshake("127.0.0.1", "/v1/ws");
  auto send = [&](const json::object& message) {
    ws.write(asio::buffer(json::serialize(message)));
  };
  const json::array choices = {"north", "south", "east", "west"};
  const json::value schema = json::parse(R"({"type": "object", "properties": {
      "city": {"type": "string", "maxLength": 10}, "when": {"type": "string", "format": "date"}},
      "required": ["city", "when"], "additionalProperties": false})");
  send({{"type", "generate"},
        {"id", "choice"},
        {"prompt", "Which way?"},
        {"guided_choice", choices},
        {"max_tokens", 20},
        {"temperature", 1.0},
        {"seed", 3}});
  send({{"type", "generate"},
        {"id", "json"},
        {"messages", json::array{json::object{{"role", "user"}, {"content", "Where and when?"}}}},
        {"response_format", response_format(schema).at("response_format")},
        {"max_tokens", 300},
        {"temperature", 0.7},
        {"seed", 4}});
  send({{"type", "generate"}, {"id", "bad"}, {"prompt", "x"}, {"guided_regex", "(?<=a)b"}});
  std::map<std::string, std::string> text, finish;
  std::string refused;
  while (finish.size() < 2 || refused.empty()) {
    beast::flat_buffer buffer;
    ws.read(buffer);
    const json::value frame = json::parse(beast::buffers_to_string(buffer.data()));
    const std::string type(frame.at("type").as_string());
    const std::string id(frame.at("id").as_string());
    if (type == "error") {
      refused = json::serialize(frame);
      CHECK(id == "bad");
      continue;
    }
    text[id] += frame.at("text").as_string();
    if (type == "done") finish[id] = frame.at("finish_reason").as_string();
  }
  ws.close(websocket::close_code::normal);
  CHECK_THAT(refused, Catch::Contains("guided_regex"));
  INFO("choice: " << text["choice"] << "\njson: " << text["json"]);
  CHECK(finish["choice"] == "stop");
  CHECK(std::find(choices.begin(), choices.end(), json::value(text["choice"])) != choices.end());
  CHECK(finish["json"] == "stop");
  check_valid({json::object{{"schema", schema}, {"output", text["json"]}}});
}

TEST_CASE("a streamed output under a JSON schema validates once its deltas are joined",
          "[net][integration]") {
  python_verdicts({});
  Server s;
  const json::value schema = json::parse(kNestedSchema);
  std::vector<Job> jobs = jobs_for(response_format(schema), 0);
  const auto more = jobs_for({{"guided_json", json::serialize(schema)}}, 1);
  jobs.insert(jobs.end(), more.begin(), more.end());
  for (Job& job : jobs) job.body["stream"] = true;
  run_all(s, jobs);
  json::array cases;
  for (const Job& job : jobs) {
    INFO(describe(job));
    const Output out = streamed_output(job.target, job.reply);
    INFO("output: " << out.text);
    CHECK(out.finish_reason == "stop");
    cases.push_back(json::object{{"schema", schema}, {"output", out.text}});
  }
  check_valid(cases);
}

TEST_CASE("outputs under a JSON schema stay valid when their sequences are preempted",
          "[net][integration]") {
  python_verdicts({});
  // A context of 256 in 70 blocks of 4 tokens: room for about three of the eight sequences
  // at once, so that the scheduler preempts and recomputes them; each keeps its grammar's
  // place. Steps are stretched a little, so that all eight have arrived while the first run.
  Server s([] { std::this_thread::sleep_for(1ms); }, 256, 70);
  const json::value schema = json::parse(kNestedSchema);
  std::vector<Job> jobs;
  for (std::int64_t seed = 1; seed <= 8; ++seed) {
    json::object body = request_for("/v1/completions", "Fill in the form, please.");
    body["guided_json"] = schema;
    body["max_tokens"] = 150;
    body["temperature"] = 1.0;
    body["seed"] = seed;
    body["n"] = 1;
    jobs.push_back({"/v1/completions", std::move(body), {}});
  }
  run_all(s, jobs, 8);
  CHECK(s.engine->stats().num_preemptions > 0);
  json::array cases;
  for (const Job& job : jobs) {
    INFO(describe(job));
    const auto outputs = outputs_of(job.target, job.reply);
    REQUIRE(outputs.size() == 1);
    INFO("output: " << outputs[0].text);
    CHECK(outputs[0].finish_reason == "stop");
    cases.push_back(json::object{{"schema", schema}, {"output", outputs[0].text}});
  }
  check_valid(cases);
  CHECK(s.kv_drains());
}

TEST_CASE("each of n choices under a constraint keeps to it on its own", "[net][integration]") {
  Server s;
  const json::array colours = {"red", "green", "blue", "cyan", "magenta"};
  json::object body = request_for("/v1/completions", "Colours:");
  body["guided_choice"] = colours;
  body["n"] = 8;
  body["temperature"] = 1.5;
  body["seed"] = 21;
  body["max_tokens"] = 20;
  const auto outputs = outputs_of("/v1/completions", post(s.port(), "/v1/completions", body));
  REQUIRE(outputs.size() == 8);
  std::set<std::string> seen;
  for (const auto& out : outputs) {
    INFO("output: " << out.text);
    CHECK(out.finish_reason == "stop");
    CHECK(std::find(colours.begin(), colours.end(), json::value(out.text)) != colours.end());
    seen.insert(out.text);
  }
  CHECK(seen.size() > 1);  // the choices are sampled apart, not copied
}

// A pattern matches the string's characters, the output is its JSON text: \s (and ., [^...],
// \S, \D, \W) must not put a raw tab or newline, a quote or a backslash inside it. (The
// worker compiles the schema's GBNF text, whose pattern rules are named json-safe-...:
// parse_gbnf keeps them so. Before, at temperature 1.5, seeds 1 to 10 gave "Js<TAB>6",
// "v8<LF>9" and "it<LF>7".)
TEST_CASE("a pattern's free characters stay valid inside the JSON string", "[net][integration]") {
  python_verdicts({});
  Server s;
  const json::value schema = json::parse(R"({"type": "string", "pattern": "^\\w{2}\\s\\d$"})");
  std::vector<Job> jobs;
  for (std::int64_t seed = 1; seed <= 10; ++seed) {
    json::object body = request_for("/v1/completions", "x");
    body["guided_json"] = schema;
    body["max_tokens"] = 50;
    body["temperature"] = 1.5;
    body["seed"] = seed;
    jobs.push_back({"/v1/completions", std::move(body), {}});
  }
  run_all(s, jobs);
  json::array cases;
  for (const std::string& text : finished_outputs(jobs)) {
    cases.push_back(json::object{{"schema", schema}, {"output", text}});
  }
  check_valid(cases);
}
