// HTTPS for the server (vLLM's --ssl-* flags): the TLS context made once from the key,
// certificate and CA files, and ServerStream, the one stream type every connection is
// served over, plain TCP or TLS over it. The HTTP, SSE and WebSocket code is written once
// against ServerStream; which of the two it is is decided per connection, at accept.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket/teardown.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <variant>

#include "net/http_server.hpp"

namespace troupe::net {

// The server's TLS context from its configuration: the certificate chain and its key (an
// error naming the flag and the file when one is missing, unreadable, encrypted, not PEM,
// or when the two do not match), and the CAs client certificates are checked against.
Result<std::shared_ptr<boost::asio::ssl::context>> make_tls_context(const TlsConfig& config);

// A connection's byte stream: plain TCP, or TLS over it. An AsyncStream for Beast (HTTP,
// SSE, websocket::stream<ServerStream>); what happens on the wire under it (timeouts, the
// socket, closing) is the TCP stream's, next_layer().
class ServerStream {
 public:
  using Tcp = boost::beast::tcp_stream;
  using Tls = boost::beast::ssl_stream<Tcp>;
  using executor_type = Tcp::executor_type;
  using error_code = boost::system::error_code;

  explicit ServerStream(Tcp tcp) : stream_(std::in_place_type<Tcp>, std::move(tcp)) {}
  // TLS over `tcp`; handshake() must succeed before anything else is read or written.
  ServerStream(Tcp tcp, boost::asio::ssl::context& context)
      : stream_(std::in_place_type<Tls>, std::move(tcp), context) {}

  bool is_tls() const { return std::holds_alternative<Tls>(stream_); }
  executor_type get_executor() { return next_layer().get_executor(); }
  // The TCP stream, under the TLS when there is one (Beast's get_lowest_layer finds it).
  Tcp& next_layer() {
    if (auto* tls = std::get_if<Tls>(&stream_)) return tls->next_layer();
    return std::get<Tcp>(stream_);
  }
  boost::asio::ip::tcp::socket& socket() { return next_layer().socket(); }
  void expires_after(std::chrono::steady_clock::duration timeout) {
    next_layer().expires_after(timeout);
  }
  void expires_never() { next_layer().expires_never(); }
  void cancel() { next_layer().cancel(); }

  template <class MutableBuffers, class Token>
  auto async_read_some(const MutableBuffers& buffers, Token&& token) {
    auto initiate = [this](auto handler, const MutableBuffers& b) {
      if (auto* tls = std::get_if<Tls>(&stream_)) {
        tls->async_read_some(b, std::move(handler));
      } else {
        std::get<Tcp>(stream_).async_read_some(b, std::move(handler));
      }
    };
    return boost::asio::async_initiate<Token, void(error_code, std::size_t)>(initiate, token,
                                                                             buffers);
  }

  template <class ConstBuffers, class Token>
  auto async_write_some(const ConstBuffers& buffers, Token&& token) {
    auto initiate = [this](auto handler, const ConstBuffers& b) {
      if (auto* tls = std::get_if<Tls>(&stream_)) {
        tls->async_write_some(b, std::move(handler));
      } else {
        std::get<Tcp>(stream_).async_write_some(b, std::move(handler));
      }
    };
    return boost::asio::async_initiate<Token, void(error_code, std::size_t)>(initiate, token,
                                                                             buffers);
  }

  // The server's side of the TLS handshake, within `timeout` (a client that says nothing
  // is not waited for). No error for a plain stream.
  boost::asio::awaitable<error_code> handshake(std::chrono::steady_clock::duration timeout);
  // The end of the connection from this side: TLS's close_notify (waiting at most
  // `timeout` for the client's), then no more sending on the socket.
  boost::asio::awaitable<void> shutdown(std::chrono::steady_clock::duration timeout);

  // How a WebSocket over this stream is torn down (found by Beast through ADL).
  friend void teardown(boost::beast::role_type role, ServerStream& stream, error_code& ec) {
    using boost::beast::websocket::teardown;
    if (auto* tls = std::get_if<Tls>(&stream.stream_)) {
      teardown(role, *tls, ec);
    } else {
      teardown(role, std::get<Tcp>(stream.stream_).socket(), ec);
    }
  }
  template <class Handler>
  friend void async_teardown(boost::beast::role_type role, ServerStream& stream,
                             Handler&& handler) {
    using boost::beast::websocket::async_teardown;
    if (auto* tls = std::get_if<Tls>(&stream.stream_)) {
      async_teardown(role, *tls, std::forward<Handler>(handler));
    } else {
      async_teardown(role, std::get<Tcp>(stream.stream_), std::forward<Handler>(handler));
    }
  }

 private:
  std::variant<Tcp, Tls> stream_;
};

// Why a TLS handshake failed, for the log: "timed out", "the client spoke plain HTTP", or
// OpenSSL's reason.
std::string tls_failure(const boost::system::error_code& ec);
// Whether the handshake failed on a plain HTTP request (a client that should have said
// https://): it is answered with a plain 400 saying so before the connection closes.
bool is_plain_http(const boost::system::error_code& ec);
// That answer, on the raw socket under the failed TLS, then the connection's end.
boost::asio::awaitable<void> answer_plain_http(ServerStream& stream);

}  // namespace troupe::net
