// Every string the server writes is UTF-8 (JSON text, SSE and WebSocket text frames must
// be), whatever bytes the model's tokens stand for: a byte token such as <0xB2> is no
// character alone. Chat logprobs carry such a token's exact bytes in "bytes", as OpenAI's.
// The small random model has 256 byte tokens and samples them often.
#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <catch2/catch.hpp>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "net_test_support.hpp"
#include "support/mini_json.hpp"
#include "support/raw_client.hpp"
#include "text/unicode.hpp"

using namespace troupe;
using namespace std::chrono_literals;
namespace asio = boost::asio;
namespace websocket = boost::beast::websocket;
using tcp = asio::ip::tcp;

namespace {

// UTF-8 as RFC 3629 has it, written out here rather than taken from the code under test:
// no stray continuation bytes, no truncated or overlong sequences, no surrogates, nothing
// past U+10FFFF.
bool is_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = 0;
    char32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if ((c & 0xE0) == 0xC0) {
      n = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 4, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n > s.size()) return false;
    for (std::size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    constexpr char32_t kShortest[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kShortest[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

// Every string and key of a parsed document (its \u escapes decoded) is UTF-8.
void check_strings(const test::Json& v, const std::string& where) {
  if (v.kind == test::Json::Kind::string) {
    INFO(where);
    CHECK(is_utf8(v.string));
  }
  for (std::size_t i = 0; i < v.array.size(); ++i) {
    check_strings(v.array[i], where + "[" + std::to_string(i) + "]");
  }
  for (const auto& [key, value] : v.object) {
    INFO(where);
    CHECK(is_utf8(key));
    check_strings(value, where + "." + key);
  }
}

struct Served : test::ServedEngine {
  Served() : ServedEngine("utf8", {}, 256, 256) {}

  // An HTTP/1.0 exchange: a stream comes back close-delimited, not chunked. The body.
  std::string request(const std::string& method, const std::string& path,
                      const std::string& body = "") {
    test::RawClient c(server->port());
    REQUIRE(c.connected());
    REQUIRE(c.send(method + " " + path +
                   " HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\n"
                   "Content-Length: " +
                   std::to_string(body.size()) + "\r\n\r\n" + body));
    const std::string reply = c.read_all(60s);
    INFO(reply.substr(0, 2000));
    REQUIRE(c.closed_by_peer());
    // The whole answer, head and body, is UTF-8 as sent.
    CHECK(is_utf8(reply));
    const auto head_end = reply.find("\r\n\r\n");
    REQUIRE(head_end != std::string::npos);
    status = test::http_status(reply);
    return reply.substr(head_end + 4);
  }
  std::string post(const std::string& path, const std::string& body) {
    return request("POST", path, body);
  }

  int status = 0;
};

// The JSON documents of an SSE body, [DONE] left out.
std::vector<test::Json> events_of(const std::string& body) {
  std::vector<test::Json> events;
  for (std::size_t at = 0; (at = body.find("data: ", at)) != std::string::npos;) {
    const auto end = body.find("\n\n", at);
    const std::string data = body.substr(at + 6, end - at - 6);
    at = end;
    if (data != "[DONE]") events.push_back(test::JsonParser(data).parse());
  }
  return events;
}

// A chat logprobs entry's bytes, as a string.
std::string bytes_of(const test::Json& entry) {
  std::string bytes;
  for (const auto& b : entry["bytes"].array) {
    REQUIRE(b.number >= 0);
    REQUIRE(b.number <= 255);
    bytes += static_cast<char>(static_cast<int>(b.number));
  }
  return bytes;
}

// What every chat logprobs entry (a token or one of its top alternatives) must be: its
// text UTF-8, and where its bytes are whole characters, exactly those characters.
// Counts the entries whose bytes are no character alone (a byte token, half a character).
int check_chat_entry(const test::Json& entry) {
  const std::string bytes = bytes_of(entry);
  const std::string& token = entry["token"].string;
  INFO("token '" << token << "', " << bytes.size() << " bytes");
  CHECK(is_utf8(token));
  if (is_utf8(bytes)) {
    CHECK(token == bytes);
    return 0;
  }
  return 1;
}

const std::string kChat =
    R"({"messages":[{"role":"user","content":"Once upon a time, é ü 日本"}],"max_tokens":48,)"
    R"("ignore_eos":true,"temperature":1.0,"seed":11,"logprobs":true,"top_logprobs":20)";

}  // namespace

TEST_CASE("chat logprobs over byte tokens are UTF-8, and bytes hold each token's own bytes",
          "[net][utf8]") {
  Served s;
  SECTION("not streamed") {
    const auto body = s.post("/v1/chat/completions", kChat + "}");
    REQUIRE(s.status == 200);
    const auto reply = test::JsonParser(body).parse();
    check_strings(reply, "reply");
    const auto& choice = reply["choices"].array.at(0);
    const auto& content = choice["logprobs"]["content"].array;
    REQUIRE(content.size() == 48);
    int partial = 0;
    std::string output;  // the tokens' bytes, one after the other
    for (const auto& entry : content) {
      partial += check_chat_entry(entry);
      output += bytes_of(entry);
      for (const auto& top : entry["top_logprobs"].array) partial += check_chat_entry(top);
    }
    // The case at hand came up: tokens that are no character alone.
    CHECK(partial > 0);
    CHECK(!is_utf8(output));
    // The bytes are the output's own: the message is their text.
    CHECK(choice["message"]["content"].string == text::to_valid_utf8(output));
  }
  SECTION("streamed") {
    const auto body = s.post("/v1/chat/completions", kChat + R"(,"stream":true})");
    REQUIRE(s.status == 200);
    int partial = 0;
    int num_tokens = 0;
    std::string output;
    for (const auto& event : events_of(body)) {
      check_strings(event, "event");
      for (const auto& choice : event["choices"].array) {
        const auto& logprobs = choice["logprobs"];
        if (logprobs.kind == test::Json::Kind::null) continue;
        for (const auto& entry : logprobs["content"].array) {
          ++num_tokens;
          partial += check_chat_entry(entry);
          output += bytes_of(entry);
          for (const auto& top : entry["top_logprobs"].array) partial += check_chat_entry(top);
        }
      }
    }
    CHECK(num_tokens == 48);
    CHECK(partial > 0);
    CHECK(!is_utf8(output));
  }
}

TEST_CASE("every other answer over byte tokens is UTF-8 too", "[net][utf8]") {
  Served s;
  // Characters the small vocabulary spells in byte tokens.
  const std::string prompt = R"("Once upon a time, é ü 日本")";
  auto check_json = [&](const std::string& what, const std::string& body, int status = 200) {
    INFO(what);
    CHECK(s.status == status);
    check_strings(test::JsonParser(body).parse(), what);
  };
  auto check_stream = [&](const std::string& what, const std::string& body) {
    INFO(what);
    CHECK(s.status == 200);
    const auto events = events_of(body);
    CHECK(events.size() > 1);
    for (const auto& event : events) check_strings(event, what);
  };
  const std::string completion = R"({"prompt":)" + prompt +
                                 R"(,"max_tokens":24,"ignore_eos":true,"temperature":1.0,)"
                                 R"("seed":5,"logprobs":5)";
  check_json("completion", s.post("/v1/completions", completion + "}"));
  check_json("echo", s.post("/v1/completions", completion + R"(,"echo":true})"));
  check_stream("completion stream", s.post("/v1/completions", completion + R"(,"stream":true})"));
  check_stream("echo stream",
               s.post("/v1/completions", completion + R"(,"stream":true,"echo":true})"));
  check_json("prompt_logprobs", s.post("/v1/completions", completion + R"(,"prompt_logprobs":5})"));
  const std::string chat = R"({"messages":[{"role":"user","content":)" + prompt +
                           R"(}],"max_tokens":24,"ignore_eos":true,"temperature":1.0,"seed":5)";
  check_json("chat prompt_logprobs",
             s.post("/v1/chat/completions", chat + R"(,"prompt_logprobs":5})"));
  // A chat that may call tools: its output is read for calls, and is content otherwise.
  const std::string tools =
      R"(,"tools":[{"type":"function","function":{"name":"f","parameters":{}}}])";
  check_json("chat with tools", s.post("/v1/chat/completions", chat + tools + "}"));
  check_stream("chat stream with tools",
               s.post("/v1/chat/completions", chat + tools + R"(,"stream":true})"));
  // Half of a character, and a byte token alone (ids: <unk> <s> </s>, then the bytes).
  check_json("detokenize", s.post("/detokenize", R"({"tokens":[233,154,3,181]})"));
  check_json("tokenize", s.post("/tokenize", R"({"prompt":)" + prompt + "}"));
  // An error quoting raw bytes the client sent in the path.
  check_json("an error quoting the path", s.request("GET", "/v1/\xff\xfe\xb2"), 404);

  // The socket: token frames with logprobs.
  asio::io_context io;
  websocket::stream<tcp::socket> ws(io);
  ws.next_layer().connect({asio::ip::make_address("127.0.0.1"), s.server->port()});
  ws.handshake("127.0.0.1", "/v1/ws");
  ws.write(asio::buffer(R"({"type":"generate","id":"a","prompt":)" + prompt +
                        R"(,"max_tokens":24,"ignore_eos":true,"temperature":1.0,"seed":5,)"
                        R"("logprobs":5})"));
  for (bool done = false; !done;) {
    boost::beast::flat_buffer buffer;
    ws.read(buffer);
    const std::string frame = boost::beast::buffers_to_string(buffer.data());
    INFO(frame);
    CHECK(is_utf8(frame));
    const auto parsed = test::JsonParser(frame).parse();
    check_strings(parsed, "frame");
    done = parsed["type"].string != "token";
  }
  ws.close(websocket::close_code::normal);
}
