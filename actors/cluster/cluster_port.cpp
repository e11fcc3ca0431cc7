#include "actors/cluster/cluster_port.hpp"
#include "monitoring/log.hpp"

#include <openssl/err.h>
#include <sys/socket.h>
#include <unistd.h>

#include <caf/io/all.hpp>
#include <caf/io/basp_broker.hpp>
#include <caf/io/network/acceptor_impl.hpp>
#include <caf/io/network/default_multiplexer.hpp>
#include <caf/io/network/scribe_impl.hpp>
#include <caf/io/network/stream_impl.hpp>
#include <caf/openssl/session.hpp>
#include <cerrno>
#include <exception>
#include <utility>

namespace troupe::actors::cluster {

namespace {

namespace network = caf::io::network;
using network::default_multiplexer;
using network::native_socket;
using network::rw_state;

// "address:port" as CAF's broker names the peer (the registry looks nodes up by it).
std::string peer_of(native_socket fd) {
  auto address = network::remote_addr_of_fd(fd);
  auto port = network::remote_port_of_fd(fd);
  return (address ? *address : std::string("?")) + ":" + (port ? std::to_string(*port) : "?");
}

// What OpenSSL said of the last failure on this thread (the multiplexer's).
std::string tls_error() {
  const unsigned long code = ERR_peek_last_error();
  if (code == 0) return "the peer ended it";
  if (const char* reason = ERR_reason_error_string(code)) return reason;
  char text[256];
  ERR_error_string_n(code, text, sizeof text);
  return text;
}

// Accepting through the gate: what it refuses is closed before CAF sees it.
struct GatedAccept {
  std::shared_ptr<ClusterGate> gate;

  explicit GatedAccept(std::shared_ptr<ClusterGate> g) : gate(std::move(g)) {}

  bool try_accept(native_socket& result, native_socket listener) {
    result = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (result < 0) {
      if (errno == EMFILE || errno == ENFILE) gate->shed(listener);
      result = network::invalid_native_socket;
      return false;
    }
    if (gate->refusal(peer_of(result))) {
      ::close(result);
      result = network::invalid_native_socket;
      return false;
    }
    return true;
  }
};

// A plain connection: CAF's own scribe, which tells the gate of its end. (Its descriptor
// is closed by the base's destructor, after this one's: the gate may shut it down until
// then.)
class GatedScribe : public network::scribe_impl {
 public:
  GatedScribe(default_multiplexer& mpx, native_socket fd, std::shared_ptr<ClusterGate> gate,
              std::uint64_t connection)
      : scribe_impl(mpx, fd), gate_(std::move(gate)), connection_(connection) {}
  ~GatedScribe() override { gate_->closed(connection_); }

 private:
  std::shared_ptr<ClusterGate> gate_;
  std::uint64_t connection_;
};

// CAF's OpenSSL session as the scribe's I/O, noting a handshake that fails (nothing read
// through it yet) for the gate's log.
struct GatedTls {
  caf::openssl::session_ptr session;
  std::shared_ptr<ClusterGate> gate;
  std::uint64_t connection = 0;
  bool through = false;  // data came through: the handshake is done

  GatedTls(caf::openssl::session_ptr s, std::shared_ptr<ClusterGate> g, std::uint64_t c)
      : session(std::move(s)), gate(std::move(g)), connection(c) {}

  rw_state read_some(std::size_t& result, native_socket fd, void* buf, std::size_t len) {
    return noted(session->read_some(result, fd, buf, len), result);
  }
  rw_state write_some(std::size_t& result, native_socket fd, const void* buf, std::size_t len) {
    return noted(session->write_some(result, fd, buf, len), 0);
  }
  bool must_read_more(native_socket fd, std::size_t threshold) {
    return session->must_read_more(fd, threshold);
  }
  rw_state noted(rw_state state, std::size_t num_read) {
    through = through || num_read > 0;
    if (state == rw_state::failure && !through) gate->tls_failed(connection, tls_error());
    return state;
  }
};

// A TLS connection: CAF's OpenSSL scribe (caf/openssl's middleman_actor.cpp keeps it in an
// unnamed namespace), with GatedTls for its I/O and the gate told of its end.
class GatedTlsScribe : public caf::io::scribe {
 public:
  GatedTlsScribe(default_multiplexer& mpx, native_socket fd, caf::openssl::session_ptr session,
                 std::shared_ptr<ClusterGate> gate, std::uint64_t connection)
      : scribe(network::conn_hdl_from_socket(fd)),
        stream_(mpx, fd, std::move(session), gate, connection),
        gate_(std::move(gate)),
        connection_(connection) {}
  ~GatedTlsScribe() override { gate_->closed(connection_); }

  void configure_read(caf::io::receive_policy::config config) override {
    stream_.configure_read(config);
    if (!launched_) launch();
  }
  void ack_writes(bool enable) override { stream_.ack_writes(enable); }
  std::vector<char>& wr_buf() override { return stream_.wr_buf(); }
  std::vector<char>& rd_buf() override { return stream_.rd_buf(); }
  void graceful_shutdown() override {
    stream_.graceful_shutdown();
    detach(&stream_.backend(), false);
  }
  void flush() override { stream_.flush(this); }
  std::string addr() const override {
    auto x = network::remote_addr_of_fd(stream_.fd());
    return x ? *x : std::string();
  }
  std::uint16_t port() const override {
    auto x = network::remote_port_of_fd(stream_.fd());
    return x ? *x : 0;
  }
  void add_to_loop() override { stream_.activate(this); }
  void remove_from_loop() override { stream_.passivate(); }

 private:
  void launch() {
    launched_ = true;
    stream_.start(this);
    // Schedules the scribe while SSL_accept still has to run (as CAF's does).
    stream_.force_empty_write(this);
  }

  bool launched_ = false;
  network::stream_impl<GatedTls> stream_;
  std::shared_ptr<ClusterGate> gate_;
  std::uint64_t connection_;
};

// The port's doorman: CAF's doorman_impl, accepting through the gate and handing each
// connection it lets in to the broker in a gated scribe.
class GatedDoorman : public caf::io::doorman {
 public:
  GatedDoorman(default_multiplexer& mpx, native_socket fd, std::shared_ptr<ClusterGate> gate,
               bool tls)
      : doorman(network::accept_hdl_from_socket(fd)),
        acceptor_(mpx, fd, gate),
        gate_(std::move(gate)),
        tls_(tls) {}

  bool new_connection() override {
    if (detached()) return false;  // (as CAF's: the broker let go of it meanwhile)
    auto& mpx = acceptor_.backend();
    const native_socket fd = acceptor_.accepted_socket();
    const std::uint64_t connection = gate_->opened(fd, peer_of(fd));
    caf::io::scribe_ptr scribe;
    if (tls_) {
      caf::openssl::session_ptr session;
      try {
        session = caf::openssl::make_session(parent()->system(), fd, true);
      } catch (const std::exception& e) {
        monitoring::logf(monitoring::LogLevel::error, "cannot start TLS on the cluster port: %s",
                         e.what());
      }
      if (!session) {
        gate_->tls_failed(connection, tls_error());
        gate_->closed(connection);
        ::close(fd);
        return false;
      }
      scribe = caf::make_counted<GatedTlsScribe>(mpx, fd, std::move(session), gate_, connection);
    } else {
      network::keepalive(fd, true);  // (as CAF's own plain scribes)
      scribe = caf::make_counted<GatedScribe>(mpx, fd, gate_, connection);
    }
    const auto handle = scribe->hdl();
    parent()->add_scribe(std::move(scribe));
    return doorman::new_connection(&mpx, handle);
  }

  void graceful_shutdown() override {
    acceptor_.graceful_shutdown();
    detach(&acceptor_.backend(), false);
  }
  void launch() override { acceptor_.start(this); }
  std::string addr() const override {
    auto x = network::local_addr_of_fd(acceptor_.fd());
    return x ? *x : std::string();
  }
  std::uint16_t port() const override {
    auto x = network::local_port_of_fd(acceptor_.fd());
    return x ? *x : 0;
  }
  void add_to_loop() override { acceptor_.activate(this); }
  void remove_from_loop() override { acceptor_.passivate(); }

 private:
  network::acceptor_impl<GatedAccept> acceptor_;
  std::shared_ptr<ClusterGate> gate_;
  bool tls_;
};

}  // namespace

caf::expected<std::uint16_t> publish_registry(const registry_actor& registry, std::uint16_t port,
                                              const std::string& host, const TlsFiles& tls,
                                              std::shared_ptr<ClusterGate> gate) {
  auto& system = registry.home_system();
  auto& mpx = static_cast<default_multiplexer&>(system.middleman().backend());
  // reuse_addr: a head restarted on its port must bind it again (STACK.md).
  auto listener = network::new_tcp_acceptor_impl(port, host.empty() ? nullptr : host.c_str(), true);
  if (!listener) return std::move(listener.error());
  caf::intrusive_ptr<GatedDoorman> doorman =
      caf::make_counted<GatedDoorman>(mpx, *listener, std::move(gate), tls.enabled());
  const std::uint16_t bound = doorman->port();
  // What CAF's middleman actor does for publish(): the broker takes the doorman and
  // serves the registry on its port (the BASP broker's publish_atom handler).
  auto broker = system.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  caf::anon_send(broker, caf::publish_atom::value, caf::io::doorman_ptr{std::move(doorman)}, bound,
                 caf::actor_cast<caf::strong_actor_ptr>(registry), system.message_types(registry));
  return bound;
}

}  // namespace troupe::actors::cluster
