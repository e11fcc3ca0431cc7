#pragma once

namespace troupe::actors::cluster {

// Whether this process clears OpenSSL's error queue before each TLS read and write
// of CAF's OpenSSL module (tls_error_queue.cpp says why). Calling it also keeps that
// file in the link: nothing else names it.
bool tls_error_queue_guarded();

}  // namespace troupe::actors::cluster
