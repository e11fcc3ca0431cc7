// The cluster tests' helpers: a head (`troupe serve --cluster-port 0`) and node
// processes (`troupe node --join`) on loopback, each started and ended by its test, and
// the HTTP and stream checks they share.
#pragma once

#include <catch2/catch.hpp>
#include <cstdlib>
#include <map>
#include <memory>
#include <thread>

#include "support/child_process.hpp"
#include "support/mini_json.hpp"
#include "support/raw_client.hpp"
#include "support/small_model.hpp"

namespace troupe::test::cluster {

using namespace std::chrono_literals;
using test::ChildProcess;

inline const std::string kToken = "test-cluster-token";

// Large enough that a step takes a moment (the kill lands mid-generation).
inline std::string cluster_model() {
  static const std::string path =
      test::write_small_model("cluster-model", [](model::RandomModelSpec& s) {
        s.dim = 256;
        s.num_layers = 4;
        s.ffn_dim = 512;
        s.context_length = 2048;
      });
  return path;
}

struct Reply {
  int status = 0;
  std::string body;
};

inline Reply http(std::uint16_t port, const std::string& method, const std::string& path,
                  const std::string& body = "", std::chrono::milliseconds timeout = 60s) {
  test::RawClient c(port);
  REQUIRE(c.connected());
  REQUIRE(c.send(method + " " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" +
                 "Content-Type: application/json\r\nContent-Length: " +
                 std::to_string(body.size()) + "\r\n\r\n" + body));
  const std::string all = c.read_all(timeout);
  Reply r;
  if (all.size() > 12) r.status = std::stoi(all.substr(9, 3));
  const auto at = all.find("\r\n\r\n");
  if (at != std::string::npos) r.body = all.substr(at + 4);
  return r;
}

inline test::Json json_of(const std::string& body) {
  return test::JsonParser(body).parse();
}

inline std::string ids(const std::vector<int>& tokens) {
  std::string out = "[";
  for (std::size_t i = 0; i < tokens.size(); ++i) out += (i ? "," : "") + std::to_string(tokens[i]);
  return out + "]";
}

inline std::vector<int> prompt_for(int i, int length) {
  std::vector<int> p;
  for (int k = 0; k < length; ++k) p.push_back(1 + (i * 37 + k * 11) % 500);
  return p;
}

inline std::string completion(const std::vector<int>& prompt, int max_tokens, bool stream = false) {
  return R"({"prompt":)" + ids(prompt) + R"(,"max_tokens":)" + std::to_string(max_tokens) +
         R"(,"temperature":0,"ignore_eos":true)" + (stream ? R"(,"stream":true)" : "") + "}";
}

// `n` streamed greedy completions of `max_tokens` each, sent and not yet read.
inline std::vector<std::unique_ptr<test::RawClient>> open_streams(std::uint16_t port, int n,
                                                                  int max_tokens) {
  std::vector<std::unique_ptr<test::RawClient>> streams;
  for (int i = 0; i < n; ++i) {
    const std::string body = completion(prompt_for(i, 8), max_tokens, /*stream=*/true);
    auto c = std::make_unique<test::RawClient>(port);
    REQUIRE(
        c->send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                "Content-Type: application/json\r\nContent-Length: " +
                std::to_string(body.size()) + "\r\n\r\n" + body));
    streams.push_back(std::move(c));
  }
  return streams;
}

// How streams cut by a lost node ended, read to their close. Whatever the timing, each
// must be whole: one that completed streamed exactly max_tokens tokens (none twice: a
// request that had streamed was not run again), and one that failed had streamed (one
// that had not was moved, unseen) and says why in an error event.
struct Ends {
  int errors = 0;
  int complete = 0;
};
// With `texts`: each stream's text, its chunks' text joined.
inline Ends read_ends(std::vector<std::unique_ptr<test::RawClient>>& streams, int max_tokens,
                      std::vector<std::string>* texts = nullptr) {
  Ends ends;
  for (auto& c : streams) {
    const std::string all = c->read_all(120s);
    REQUIRE(c->closed_by_peer());
    if (texts != nullptr) {
      std::string text;
      for (auto at = all.find("data: {"); at != std::string::npos; at = all.find("data: {", at)) {
        at += 6;
        const auto end = all.find('\n', at);
        const test::Json chunk = json_of(all.substr(at, end - at));
        if (chunk.object.contains("choices") && !chunk["choices"].array.empty()) {
          text += chunk["choices"].array[0]["text"].string;
        }
      }
      texts->push_back(std::move(text));
    }
    int tokens = 0;  // every token's chunk but the last carries no finish reason
    for (auto at = all.find(R"("finish_reason":null)"); at != std::string::npos;
         at = all.find(R"("finish_reason":null)", at + 1)) {
      ++tokens;
    }
    if (all.find(R"("finish_reason":"error")") != std::string::npos) {
      ++ends.errors;
      CHECK(tokens >= 1);
      CHECK(all.find(R"(data: {"error")") != std::string::npos);
    } else {
      CHECK(all.find(R"("finish_reason":"length")") != std::string::npos);
      CHECK(tokens == max_tokens - 1);
      ++ends.complete;
    }
  }
  return ends;
}

// Each stream's text (from read_ends) is what an undisturbed run gives: the same greedy
// completion of `max_tokens`, asked again now. Stream i's prompt is prompt_for(first + i, 8).
template <class Cluster>
void check_undisturbed(Cluster& cluster, const std::vector<std::string>& texts, int max_tokens,
                       int first = 0) {
  for (std::size_t i = 0; i < texts.size(); ++i) {
    const int prompt = first + static_cast<int>(i);
    INFO("stream " << prompt);
    const Reply alone =
        cluster.post("/v1/completions", completion(prompt_for(prompt, 8), max_tokens));
    REQUIRE(alone.status == 200);
    CHECK(texts[i] == json_of(alone.body)["choices"].array[0]["text"].string);
  }
}

// A head and its nodes. The head waits for its replicas' nodes before it serves:
// `nodes` of them (one per replica unless told), each with `node_threads` threads per
// worker (one: a 2-core node holds two workers, a tensor-parallel group's two ranks).
class Cluster {
 public:
  // `node_extra`: flags every node gets (--shutdown-timeout, say).
  Cluster(int replicas, const std::string& router, std::vector<std::string> extra = {},
          int nodes = -1, std::string node_threads = "1", std::string model = "",
          std::vector<std::string> node_extra = {})
      : node_threads_(std::move(node_threads)), node_extra_(std::move(node_extra)) {
    std::vector<std::string> argv{TROUPE_BINARY,
                                  "serve",
                                  "-m",
                                  model.empty() ? cluster_model() : model,
                                  "--port",
                                  "0",
                                  "--cluster-port",
                                  "0",
                                  "--cluster-token",
                                  kToken,
                                  "--dp",
                                  std::to_string(replicas),
                                  "--router",
                                  router,
                                  "--kv-cache-gb",
                                  "0.02",
                                  "--cluster-wait",
                                  "30"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    head = std::make_unique<ChildProcess>(argv);
    const auto port = head->wait_for(R"(cluster port 127\.0\.0\.1:(\d+))", 30s);
    REQUIRE(port.has_value());
    cluster_port = std::stoi(*port);
    for (int i = 0; i < (nodes < 0 ? replicas : nodes); ++i) add_node("n" + std::to_string(i));
    const auto http_port = head->wait_for(R"(serving '.*' at http://127\.0\.0\.1:(\d+))", 60s);
    INFO(head->output());
    REQUIRE(http_port.has_value());
    port_ = static_cast<std::uint16_t>(std::stoi(*http_port));
  }

  ChildProcess& add_node(const std::string& name, const std::string& token = kToken) {
    std::vector<std::string> argv{
        TROUPE_BINARY,     "node",       "--join", "127.0.0.1:" + std::to_string(cluster_port),
        "--cluster-token", token,        "--name", name,
        "--threads",       node_threads_};
    argv.insert(argv.end(), node_extra_.begin(), node_extra_.end());
    nodes[name] = std::make_unique<ChildProcess>(argv);
    return *nodes[name];
  }

  std::uint16_t port() const { return port_; }
  Reply get(const std::string& path) { return http(port_, "GET", path); }
  Reply post(const std::string& path, const std::string& body) {
    return http(port_, "POST", path, body);
  }
  test::Json cluster() { return json_of(get("/v1/cluster").body); }
  std::string metrics() { return get("/metrics").body; }

  // A metric's value (the first line that starts with `name`), or -1.
  double metric(const std::string& name) {
    const std::string text = metrics();
    // "name value", or "name{model_name=\"...\"} value" (every troupe_ series has it).
    for (auto at = text.find("\n" + name); at != std::string::npos;
         at = text.find("\n" + name, at + 1)) {
      auto end = at + 1 + name.size();
      if (text.compare(end, 12, "{model_name=") == 0) end = text.find("} ", end) + 1;
      if (end < text.size() && text[end] == ' ') return std::stod(text.substr(end + 1));
    }
    return -1;
  }

  // A metric once it holds still (the same value read five times, 100 ms apart; at most
  // 10 s): a baseline taken right after start-up may count an actor that is just ending
  // (placement, a node's join).
  double settled_metric(const std::string& name) {
    double value = metric(name);
    int same = 1;
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (same < 5 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(100ms);
      const double next = metric(name);
      same = next == value ? same + 1 : 1;
      value = next;
    }
    return value;
  }

  template <class Predicate>
  bool eventually(Predicate done, std::chrono::milliseconds timeout = 30s) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (done()) return true;
      std::this_thread::sleep_for(50ms);
    }
    return done();
  }

  std::unique_ptr<ChildProcess> head;
  std::map<std::string, std::unique_ptr<ChildProcess>> nodes;
  int cluster_port = 0;

 private:
  std::string node_threads_;
  std::vector<std::string> node_extra_;
  std::uint16_t port_ = 0;
};

}  // namespace troupe::test::cluster
