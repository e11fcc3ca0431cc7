// CAF 0.17's OpenSSL module calls SSL_read, SSL_write, SSL_accept and SSL_connect without
// emptying the thread's
// OpenSSL error queue first, and it never drains the queue after a handshake fails.
// OpenSSL's SSL_get_error reads that queue before anything else (its manual: "the
// current thread's error queue must be empty before the TLS/SSL I/O operation is
// attempted"). So once one peer failed its handshake on the middleman's thread (a
// connection without a certificate from the cluster's CA), the next read of a healthy
// link that would block was taken for a fatal error, and CAF dropped that link: one
// stranger's connection attempt cut every node off the head.
//
// CAF's library cannot be changed here, so the process defines these four functions
// itself. The dynamic linker binds the library's calls to the executable's definitions
// first; each empties the queue and calls OpenSSL's own through RTLD_NEXT. For any other
// caller in the process this is what OpenSSL asks of it anyway.
#include "actors/cluster/tls_error_queue.hpp"

#include <dlfcn.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <cstdlib>

namespace {

template <class Function>
Function next_definition(const char* name) {
  void* symbol = dlsym(RTLD_NEXT, name);
  if (symbol == nullptr) std::abort();  // libssl is linked in: it cannot be missing
  return reinterpret_cast<Function>(symbol);
}

}  // namespace

extern "C" int SSL_read(SSL* ssl, void* buf, int num) {
  static const auto next = next_definition<int (*)(SSL*, void*, int)>("SSL_read");
  ERR_clear_error();
  return next(ssl, buf, num);
}

extern "C" int SSL_write(SSL* ssl, const void* buf, int num) {
  static const auto next = next_definition<int (*)(SSL*, const void*, int)>("SSL_write");
  ERR_clear_error();
  return next(ssl, buf, num);
}

// The handshakes are judged by SSL_get_error too: a node joining, or one half-way through
// its handshake, after a stranger failed must not be refused for the stranger's error.
extern "C" int SSL_accept(SSL* ssl) {
  static const auto next = next_definition<int (*)(SSL*)>("SSL_accept");
  ERR_clear_error();
  return next(ssl);
}

extern "C" int SSL_connect(SSL* ssl) {
  static const auto next = next_definition<int (*)(SSL*)>("SSL_connect");
  ERR_clear_error();
  return next(ssl);
}

namespace troupe::actors::cluster {

bool tls_error_queue_guarded() {
  // The definitions above are the ones the process uses when they come first.
  return dlsym(RTLD_DEFAULT, "SSL_read") == reinterpret_cast<void*>(&SSL_read);
}

}  // namespace troupe::actors::cluster
