// HTTPS (troupe serve --ssl-*): a request, server-sent events and the WebSocket over TLS;
// a plain HTTP client, a silent one and a garbled one on the TLS port are dropped while
// serving goes on; bad key and certificate files are clear errors; client certificates.
#include <openssl/ssl.h>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast.hpp>
#include <boost/beast/ssl.hpp>
#include <catch2/catch.hpp>
#include <fstream>
#include <optional>

#include "net/http_server.hpp"
#include "net_test_support.hpp"
#include "support/mini_json.hpp"
#include "support/raw_client.hpp"
#include "support/tls_certificates.hpp"

using namespace troupe;
using namespace std::chrono_literals;
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;

namespace {

using TlsStream = beast::ssl_stream<beast::tcp_stream>;
using HttpResponse = http::response<http::string_body>;

net::ServerConfig https(const test::TlsCertificates& certs, const std::string& who = "self") {
  net::ServerConfig config;
  config.tls.keyfile = certs.key(who);
  config.tls.certfile = certs.cert(who);
  return config;
}

struct Served : test::ServedEngine {
  explicit Served(net::ServerConfig config)
      : ServedEngine("tls-model", std::move(config), 256, 512) {}

  // Whether every connection has ended (its coroutine done, its socket closed), waiting up
  // to ten seconds: a dropped client leaves nothing behind.
  bool connections_end() const {
    for (int i = 0; i < 1000; ++i) {
      if (server->num_connections() == 0) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
};

// Runs one asynchronous operation to its end; each is bounded by its stream's deadline,
// so that a test never hangs on a server that does.
template <class Start>
beast::error_code run_op(asio::io_context& io, Start start) {
  beast::error_code result = asio::error::operation_aborted;
  start([&result](beast::error_code ec, auto&&...) { result = ec; });
  io.restart();
  io.run();
  return result;
}

// What a client trusts (`ca`'s certificate) and presents (`who`'s, when named).
std::unique_ptr<ssl::context> client_context(const test::TlsCertificates& certs,
                                             const std::string& ca, const std::string& who = "") {
  auto context = std::make_unique<ssl::context>(ssl::context::tls_client);
  context->load_verify_file(certs.cert(ca));
  context->set_verify_mode(ssl::verify_peer);
  if (!who.empty()) {
    context->use_certificate_chain_file(certs.cert(who));
    context->use_private_key_file(certs.key(who), ssl::context::pem);
  }
  return context;
}

// Connects and makes the TLS handshake, checking the server's name.
beast::error_code connect(asio::io_context& io, TlsStream& stream, std::uint16_t port) {
  auto& tcp_stream = beast::get_lowest_layer(stream);
  tcp_stream.expires_after(30s);
  const tcp::endpoint server(asio::ip::address_v4::loopback(), port);
  if (auto ec = run_op(io, [&](auto h) { tcp_stream.async_connect(server, h); })) return ec;
  SSL_set_tlsext_host_name(stream.native_handle(), "localhost");
  stream.set_verify_callback(ssl::host_name_verification("localhost"));
  tcp_stream.expires_after(30s);
  return run_op(io, [&](auto h) { stream.async_handshake(ssl::stream_base::client, h); });
}

// An HTTPS client on one connection.
class HttpsClient {
 public:
  HttpsClient(std::uint16_t port, ssl::context& context) : stream_(io_, context) {
    handshake_error = connect(io_, stream_, port);
  }

  // The answer to a request on this connection; none when the server refused or dropped it.
  std::optional<HttpResponse> request(http::verb method, const std::string& target,
                                      const std::string& body = "") {
    http::request<http::string_body> req{method, target, 11};
    req.set(http::field::host, "localhost");
    if (!body.empty()) req.set(http::field::content_type, "application/json");
    req.body() = body;
    req.prepare_payload();
    auto& tcp_stream = beast::get_lowest_layer(stream_);
    tcp_stream.expires_after(30s);
    if (run_op(io_, [&](auto h) { http::async_write(stream_, req, h); })) return std::nullopt;
    HttpResponse response;
    tcp_stream.expires_after(60s);
    if (run_op(io_, [&](auto h) { http::async_read(stream_, buffer_, response, h); })) {
      return std::nullopt;
    }
    return response;
  }

  beast::error_code handshake_error;

 private:
  asio::io_context io_;
  TlsStream stream_;
  beast::flat_buffer buffer_;
};

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("a POST, a stream of server-sent events and a WebSocket are served over HTTPS",
          "[net][tls][integration]") {
  test::TlsCertificates certs("tls-serve");
  REQUIRE(certs.made);
  Served f(https(certs));
  auto trust = client_context(certs, "self");

  SECTION("a POST and a stream of events on one kept-alive connection") {
    HttpsClient client(f.server->port(), *trust);
    INFO(client.handshake_error.message());
    REQUIRE(!client.handshake_error);
    auto answer = client.request(http::verb::post, "/v1/completions",
                                 R"({"prompt":"Once","max_tokens":4,"temperature":0})");
    REQUIRE(answer.has_value());
    CHECK(answer->result_int() == 200);
    const auto json = test::JsonParser(answer->body()).parse();
    CHECK(json["object"].string == "text_completion");
    CHECK(json["usage"]["completion_tokens"].number == 4);

    auto events = client.request(http::verb::post, "/v1/chat/completions",
                                 R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":4,)"
                                 R"("temperature":0,"stream":true})");
    REQUIRE(events.has_value());
    CHECK(events->result_int() == 200);
    CHECK((*events)[http::field::content_type] == "text/event-stream");
    // The role's chunk, a chunk per token, then [DONE].
    CHECK(count_of(events->body(), "data: {") >= 3);
    CHECK(events->body().find("data: [DONE]\n\n") != std::string::npos);
  }

  SECTION("a wss:// socket streams a request to its done frame") {
    asio::io_context io;
    websocket::stream<TlsStream> ws(io, *trust);
    REQUIRE(!connect(io, ws.next_layer(), f.server->port()));
    auto& tcp_stream = beast::get_lowest_layer(ws);
    tcp_stream.expires_after(30s);
    REQUIRE(!run_op(io, [&](auto h) { ws.async_handshake("localhost", "/v1/ws", h); }));
    const std::string message =
        R"({"type":"generate","id":"q","prompt":"Once","max_tokens":5,"temperature":0})";
    REQUIRE(!run_op(io, [&](auto h) { ws.async_write(asio::buffer(message), h); }));
    int tokens = 0;
    std::string last;
    for (int i = 0; i < 50 && last != "done"; ++i) {
      beast::flat_buffer buffer;
      tcp_stream.expires_after(30s);
      REQUIRE(!run_op(io, [&](auto h) { ws.async_read(buffer, h); }));
      const auto frame = test::JsonParser(beast::buffers_to_string(buffer.data())).parse();
      CHECK(frame["id"].string == "q");
      last = frame["type"].string;
      if (last == "token") ++tokens;
    }
    CHECK(last == "done");
    CHECK(tokens >= 1);
    tcp_stream.expires_after(30s);
    CHECK(!run_op(io, [&](auto h) { ws.async_close(websocket::close_code::normal, h); }));
  }
  CHECK(f.connections_end());
  CHECK(f.kv_drains());
}

TEST_CASE("a client that speaks plain HTTP to the HTTPS port is told so and dropped",
          "[net][tls][integration]") {
  test::TlsCertificates certs("tls-plain");
  REQUIRE(certs.made);
  Served f(https(certs));
  {
    test::RawClient plain(f.server->port());
    REQUIRE(plain.connected());
    REQUIRE(plain.send("GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"));
    const std::string answer = plain.read_all(10s);
    CHECK(test::http_status(answer) == 400);
    CHECK(answer.find("https://") != std::string::npos);
    CHECK(plain.closed_by_peer());
  }
  CHECK(f.connections_end());
  // The server goes on serving HTTPS.
  auto trust = client_context(certs, "self");
  HttpsClient client(f.server->port(), *trust);
  REQUIRE(!client.handshake_error);
  const auto health = client.request(http::verb::get, "/health");
  REQUIRE(health.has_value());
  CHECK(health->result_int() == 200);
  const std::string metrics = f.metrics->serialize();
  CHECK_THAT(metrics, Catch::Contains("troupe_http_connection_errors_total{") &&
                          Catch::Contains(R"(reason="tls_handshake"} 1)"));
}

TEST_CASE("a client that never finishes its TLS handshake is dropped when its time is up",
          "[net][tls][integration]") {
  test::TlsCertificates certs("tls-silent");
  REQUIRE(certs.made);
  auto config = https(certs);
  config.tls.handshake_timeout = 1s;
  Served f(config);
  SECTION("one that says nothing") {
    test::RawClient silent(f.server->port());
    REQUIRE(silent.connected());
    silent.read_all(20s);
    CHECK(silent.closed_by_peer());  // by the server, long before the 20 s
  }
  SECTION("one that sends the start of a TLS record and stops") {
    test::RawClient stalled(f.server->port());
    REQUIRE(stalled.connected());
    REQUIRE(stalled.send(std::string("\x16\x03\x01\x02\x00\x01", 6)));
    stalled.read_all(20s);
    CHECK(stalled.closed_by_peer());
  }
  SECTION("one that sends bytes that are no TLS at all") {
    test::RawClient garbled(f.server->port());
    REQUIRE(garbled.connected());
    REQUIRE(garbled.send(std::string(64, '\x07')));
    garbled.read_all(20s);
    CHECK(garbled.closed_by_peer());
  }
  CHECK(f.connections_end());
  auto trust = client_context(certs, "self");
  HttpsClient client(f.server->port(), *trust);
  REQUIRE(!client.handshake_error);
  const auto health = client.request(http::verb::get, "/health");
  REQUIRE(health.has_value());
  CHECK(health->result_int() == 200);
}

TEST_CASE("a missing, corrupt, encrypted or mismatched key or certificate is a clear error",
          "[net][tls]") {
  test::TlsCertificates certs("tls-bad-files");
  REQUIRE(certs.made);
  const auto write = [&](const std::string& name, const std::string& text) {
    const std::string path = certs.dir + "/" + name;
    std::ofstream(path) << text;
    return path;
  };
  const auto error_of = [](const net::TlsConfig& config) {
    auto checked = net::check_tls_config(config);
    return checked ? std::string() : checked.error().message;
  };
  net::TlsConfig good;
  good.keyfile = certs.key("self");
  good.certfile = certs.cert("self");
  REQUIRE(error_of(good).empty());

  net::TlsConfig config = good;
  config.keyfile = certs.dir + "/missing.key";
  CHECK(error_of(config) == "--ssl-keyfile " + config.keyfile + ": no such file");
  config.keyfile = write("garbage.key", "this is no key\n");
  CHECK(error_of(config) == "--ssl-keyfile " + config.keyfile + ": not a PEM private key");
  config.keyfile =
      write("broken.key", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n");
  CHECK_THAT(error_of(config), Catch::StartsWith("--ssl-keyfile " + config.keyfile +
                                                 ": not a usable private key (OpenSSL: "));
  config.keyfile = certs.key("stranger");
  CHECK(error_of(config) == "--ssl-keyfile " + config.keyfile +
                                " does not match the certificate in --ssl-certfile " +
                                config.certfile);
  config.keyfile = certs.dir + "/encrypted.key";
  REQUIRE(std::system(("openssl pkey -in " + certs.key("self") +
                       " -aes256 -passout pass:secret -out " + config.keyfile + " 2>/dev/null")
                          .c_str()) == 0);
  CHECK_THAT(error_of(config), Catch::StartsWith("--ssl-keyfile " + config.keyfile +
                                                 " is encrypted, and troupe takes no passphrase"));
  config.keyfile = certs.dir;
  CHECK(error_of(config) == "--ssl-keyfile " + certs.dir + ": not a regular file");

  config = good;
  config.certfile = write("garbage.pem", "this is no certificate\n");
  CHECK_THAT(error_of(config), Catch::StartsWith("--ssl-certfile " + config.certfile +
                                                 ": not a PEM certificate chain (OpenSSL: "));
  // Without --ssl-keyfile the key is read from the certificate file, as Python reads it.
  config = good;
  config.keyfile.clear();
  CHECK(error_of(config) ==
        "--ssl-certfile " + config.certfile + " holds no private key: give --ssl-keyfile");
  config.certfile =
      write("both.pem", test::read_text(certs.cert("self")) + test::read_text(certs.key("self")));
  CHECK(error_of(config).empty());
  config = good;
  config.certfile.clear();
  CHECK_THAT(error_of(config), Catch::StartsWith("--ssl-keyfile needs --ssl-certfile"));

  config = good;
  config.cert_reqs = 2;
  CHECK_THAT(error_of(config), Catch::StartsWith("--ssl-cert-reqs 2 asks clients for "
                                                 "certificates: give --ssl-ca-certs"));
  config.ca_certs = certs.dir + "/missing-ca.pem";
  CHECK(error_of(config) == "--ssl-ca-certs " + config.ca_certs + ": no such file");
  config.ca_certs = write("garbage-ca.pem", "no CA here\n");
  CHECK_THAT(error_of(config), Catch::StartsWith("--ssl-ca-certs " + config.ca_certs +
                                                 ": no PEM CA certificate read"));
  config.ca_certs = certs.cert("ca");
  CHECK(error_of(config).empty());

  // The server refuses to start on a bad file with the same error, and nothing is left.
  Served f(net::ServerConfig{});
  net::ServerConfig bad = https(certs);
  bad.tls.keyfile = certs.dir + "/missing.key";
  bad.port = 0;
  net::HttpServer server(*f.engine, bad);
  const auto started = server.start();
  REQUIRE(!started.has_value());
  CHECK(started.error().message == "--ssl-keyfile " + bad.tls.keyfile + ": no such file");
}

TEST_CASE("with client certificates required, only a client with one from the CA is served",
          "[net][tls][integration]") {
  test::TlsCertificates certs("tls-clients");
  REQUIRE(certs.made);
  auto config = https(certs, "server");
  config.tls.ca_certs = certs.cert("ca");
  const auto answers = [](Served& f, ssl::context& context) {
    HttpsClient client(f.server->port(), context);
    // With TLS 1.3 the client's side of the handshake may end before the server has
    // judged its certificate: a refusal shows as no answer.
    if (client.handshake_error) return 0;
    const auto models = client.request(http::verb::get, "/v1/models");
    return models ? static_cast<int>(models->result_int()) : 0;
  };
  auto anonymous = client_context(certs, "ca");
  auto stranger = client_context(certs, "ca", "stranger");
  auto member = client_context(certs, "ca", "client");

  SECTION("--ssl-cert-reqs 2: a certificate from the CA is required") {
    config.tls.cert_reqs = 2;
    Served f(config);
    CHECK(answers(f, *anonymous) == 0);
    CHECK(answers(f, *stranger) == 0);
    CHECK(answers(f, *member) == 200);
    CHECK(f.connections_end());
  }
  SECTION("--ssl-cert-reqs 1: a certificate is checked when given") {
    config.tls.cert_reqs = 1;
    Served f(config);
    CHECK(answers(f, *anonymous) == 200);
    CHECK(answers(f, *stranger) == 0);
    CHECK(answers(f, *member) == 200);
    CHECK(f.connections_end());
  }
  SECTION("--ssl-cert-reqs 0 (the default): none is asked for") {
    Served f(config);
    CHECK(answers(f, *anonymous) == 200);
    CHECK(answers(f, *member) == 200);
  }
}
