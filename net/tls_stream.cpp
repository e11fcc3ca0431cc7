// The server's TLS context from vLLM's --ssl-* flags, checked with errors that name the
// flag and the file; the handshake, the close and the answer to a plain HTTP client.
#include "net/tls_stream.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace troupe::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
using boost::system::error_code;

namespace {

constexpr auto kUseTuple = asio::as_tuple(asio::use_awaitable);

// The most a key, certificate or CA file is read here (a CA bundle is a few hundred KiB).
constexpr std::uintmax_t kMostPemBytes = std::uintmax_t{16} << 20;

// The text of `path`, or why `flag`'s file cannot be read.
Result<std::string> read_pem(const std::string& flag, const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) {
    return make_error(ErrorCode::invalid_argument, flag + " " + path + ": no such file");
  }
  if (!std::filesystem::is_regular_file(status)) {
    return make_error(ErrorCode::invalid_argument, flag + " " + path + ": not a regular file");
  }
  if (std::filesystem::file_size(path, ec) > kMostPemBytes) {
    return make_error(ErrorCode::invalid_argument, flag + " " + path + ": larger than 16 MiB");
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return make_error(ErrorCode::invalid_argument,
                      flag + " " + path + ": cannot be read (" + std::strerror(errno) + ")");
  }
  return std::string(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
}

// OpenSSL's reason for a failed call, and its error queue emptied: nothing of it is left
// for the next TLS call on this thread to misread (actors/cluster/tls_error_queue.cpp).
std::string openssl_reason(const error_code& ec) {
  std::string reason = ec ? ec.message() : std::string();
  if (reason.empty()) {
    const unsigned long code = ERR_peek_error();
    if (code != 0) reason = ERR_reason_error_string(code) ? ERR_reason_error_string(code) : "";
  }
  ERR_clear_error();
  return reason.empty() ? std::string() : " (OpenSSL: " + reason + ")";
}

// An encrypted key would have OpenSSL ask for its passphrase on the terminal: there is
// none to give, so the key is refused instead, with the reason.
int no_passphrase(char*, int, int, void*) {
  return 0;
}

Result<void> load_files(asio::ssl::context& context, const TlsConfig& config) {
  const std::string keyflag = config.keyfile.empty() ? "--ssl-certfile" : "--ssl-keyfile";
  const std::string keyfile = config.keyfile.empty() ? config.certfile : config.keyfile;
  TROUPE_TRY(const std::string cert_text, read_pem("--ssl-certfile", config.certfile));
  TROUPE_TRY(const std::string key_text, read_pem(keyflag, keyfile));
  error_code ec;
  context.use_certificate_chain_file(config.certfile, ec);
  if (ec) {
    return make_error(
        ErrorCode::invalid_argument,
        "--ssl-certfile " + config.certfile + ": not a PEM certificate chain" + openssl_reason(ec));
  }
  if (key_text.find("PRIVATE KEY-----") == std::string::npos) {
    ERR_clear_error();
    return make_error(
        ErrorCode::invalid_argument,
        config.keyfile.empty()
            ? "--ssl-certfile " + keyfile + " holds no private key: give --ssl-keyfile"
            : "--ssl-keyfile " + keyfile + ": not a PEM private key");
  }
  if (key_text.find("ENCRYPTED") != std::string::npos) {
    ERR_clear_error();
    return make_error(ErrorCode::invalid_argument,
                      keyflag + " " + keyfile +
                          " is encrypted, and troupe takes no passphrase: give it decrypted "
                          "(openssl pkey -in " +
                          keyfile + " -out key.pem), readable by this user alone");
  }
  context.use_private_key_file(keyfile, asio::ssl::context::pem, ec);
  if (ec && ERR_GET_REASON(static_cast<unsigned long>(ec.value())) == X509_R_KEY_VALUES_MISMATCH) {
    ERR_clear_error();
    return make_error(ErrorCode::invalid_argument, keyflag + " " + keyfile +
                                                       " does not match the certificate in "
                                                       "--ssl-certfile " +
                                                       config.certfile);
  }
  if (ec) {
    return make_error(ErrorCode::invalid_argument,
                      keyflag + " " + keyfile + ": not a usable private key" + openssl_reason(ec));
  }
  if (SSL_CTX_check_private_key(context.native_handle()) != 1) {
    ERR_clear_error();
    return make_error(ErrorCode::invalid_argument, keyflag + " " + keyfile +
                                                       " does not match the certificate in "
                                                       "--ssl-certfile " +
                                                       config.certfile);
  }
  if (!config.ca_certs.empty()) {
    TROUPE_TRY_VOID(read_pem("--ssl-ca-certs", config.ca_certs));
    context.load_verify_file(config.ca_certs, ec);
    if (ec) {
      return make_error(ErrorCode::invalid_argument, "--ssl-ca-certs " + config.ca_certs +
                                                         ": no PEM CA certificate read" +
                                                         openssl_reason(ec));
    }
    // The CAs named to a client asked for its certificate, so that it can pick one.
    if (STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(config.ca_certs.c_str())) {
      SSL_CTX_set_client_CA_list(context.native_handle(), names);
    }
  }
  ERR_clear_error();
  return {};
}

}  // namespace

Result<std::shared_ptr<asio::ssl::context>> make_tls_context(const TlsConfig& config) {
  if (config.certfile.empty()) {
    return make_error(ErrorCode::invalid_argument,
                      "--ssl-keyfile needs --ssl-certfile, the server's certificate chain");
  }
  if (config.cert_reqs < 0 || config.cert_reqs > 2) {
    return make_error(ErrorCode::invalid_argument,
                      "--ssl-cert-reqs must be 0 (no client certificate), 1 (optional) or 2 "
                      "(required), as Python's ssl.CERT_NONE, CERT_OPTIONAL, CERT_REQUIRED");
  }
  if (config.cert_reqs > 0 && config.ca_certs.empty()) {
    return make_error(ErrorCode::invalid_argument,
                      "--ssl-cert-reqs " + std::to_string(config.cert_reqs) +
                          " asks clients for certificates: give --ssl-ca-certs, the CAs they are "
                          "checked against");
  }
  auto context = std::make_shared<asio::ssl::context>(asio::ssl::context::tls_server);
  SSL_CTX* native = context->native_handle();
  SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION);
  SSL_CTX_set_options(native, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
  SSL_CTX_set_default_passwd_cb(native, no_passphrase);
  // Resumed sessions need it once client certificates are checked.
  static constexpr unsigned char kSessionContext[] = "troupe";
  SSL_CTX_set_session_id_context(native, kSessionContext, sizeof kSessionContext - 1);
  TROUPE_TRY_VOID(load_files(*context, config));
  asio::ssl::verify_mode mode = asio::ssl::verify_none;
  if (config.cert_reqs == 1) mode = asio::ssl::verify_peer;
  if (config.cert_reqs == 2) mode = asio::ssl::verify_peer | asio::ssl::verify_fail_if_no_peer_cert;
  error_code ec;
  context->set_verify_mode(mode, ec);
  if (ec) return make_error(ErrorCode::internal, "TLS verify mode" + openssl_reason(ec));
  return context;
}

Result<void> check_tls_config(const TlsConfig& config) {
  TROUPE_TRY_VOID(make_tls_context(config));
  return {};
}

asio::awaitable<error_code> ServerStream::handshake(std::chrono::steady_clock::duration timeout) {
  auto* tls = std::get_if<Tls>(&stream_);
  if (tls == nullptr) co_return error_code{};
  next_layer().expires_after(timeout);
  auto [ec] = co_await tls->async_handshake(asio::ssl::stream_base::server, kUseTuple);
  if (ec) ERR_clear_error();
  co_return ec;
}

asio::awaitable<void> ServerStream::shutdown(std::chrono::steady_clock::duration timeout) {
  if (auto* tls = std::get_if<Tls>(&stream_); tls != nullptr && socket().is_open()) {
    next_layer().expires_after(timeout);
    auto [ec] = co_await tls->async_shutdown(kUseTuple);
    if (ec) ERR_clear_error();
  }
  error_code ignored;
  socket().shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
}

bool is_plain_http(const error_code& ec) {
  return ec.category() == asio::error::get_ssl_category() &&
         ERR_GET_REASON(static_cast<unsigned long>(ec.value())) == SSL_R_HTTP_REQUEST;
}

std::string tls_failure(const error_code& ec) {
  if (ec == beast::error::timeout) return "timed out";
  if (is_plain_http(ec)) return "the client spoke plain HTTP";
  if (ec == asio::error::eof || ec == asio::ssl::error::stream_truncated ||
      ec == asio::error::connection_reset) {
    return "the client closed the connection";
  }
  return ec.message();
}

asio::awaitable<void> answer_plain_http(ServerStream& stream) {
  using namespace std::chrono_literals;
  static const std::string kBody =
      "This port speaks HTTPS: send the request to https:// instead of http://\n";
  static const std::string kAnswer =
      "HTTP/1.1 400 Bad Request\r\nServer: troupe\r\nContent-Type: text/plain\r\n"
      "Connection: close\r\nContent-Length: " +
      std::to_string(kBody.size()) + "\r\n\r\n" + kBody;
  auto& tcp = stream.next_layer();
  tcp.expires_after(5s);
  auto [ec, n] = co_await asio::async_write(tcp, asio::buffer(kAnswer), kUseTuple);
  if (ec) co_return;
  // What the client still sends is read and dropped for a moment: closing with its bytes
  // unread would reset the connection before it reads the answer.
  error_code ignored;
  stream.socket().shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
  std::array<char, 4096> sink{};
  for (std::size_t dropped = 0; dropped < (std::size_t{64} << 10);) {
    tcp.expires_after(1s);
    auto [rec, rn] = co_await tcp.async_read_some(asio::buffer(sink), kUseTuple);
    if (rec) break;
    dropped += rn;
  }
}

}  // namespace troupe::net
