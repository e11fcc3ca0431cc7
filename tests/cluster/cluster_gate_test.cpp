// The cluster port's gate in this process, over socket pairs: its cap, its deadline, and
// its reserve of descriptors.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <thread>

#include "actors/cluster/cluster_gate.hpp"

using namespace troupe::actors::cluster;
using namespace std::chrono_literals;

namespace {

// A connection's two ends: the head's (given to the gate) and the peer's.
struct Pair {
  int head = -1;
  int peer = -1;
  Pair() {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
    head = fds[0];
    peer = fds[1];
  }
  ~Pair() {
    ::close(head);
    ::close(peer);
  }
  // Whether the head's end was shut down: the peer reads the end of the stream.
  bool ended(std::chrono::milliseconds wait) const {
    pollfd p{peer, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(wait.count())) <= 0) return false;
    char byte;
    return ::recv(peer, &byte, 1, MSG_DONTWAIT) == 0;
  }
};

}  // namespace

TEST_CASE("the cluster gate caps handshakes and ends those no node joined over in time",
          "[cluster]") {
  GateLimits limits;
  limits.handshake_timeout = 300ms;
  limits.max_pending = 2;
  ClusterGate gate(limits);
  Pair a, b, c;
  CHECK_FALSE(gate.refusal("10.0.0.1:1000"));
  const auto first = gate.opened(a.head, "10.0.0.1:1000");
  const auto second = gate.opened(b.head, "10.0.0.2:2000");
  CHECK(gate.num_pending() == 2);
  // Full: the third is refused, and says why.
  const auto refused = gate.refusal("10.0.0.3:3000");
  REQUIRE(refused);
  CHECK(*refused == "2 connections are in their handshake already");
  // A node joins over the first: room again, and the first is no longer on the clock.
  gate.joined("10.0.0.1", 1000);
  CHECK(gate.num_pending() == 1);
  CHECK_FALSE(gate.refusal("10.0.0.3:3000"));
  const auto third = gate.opened(c.head, "10.0.0.3:3000");
  // Past the deadline: the two without a node are ended, the joined one is not.
  CHECK(b.ended(5s));
  CHECK(c.ended(5s));
  CHECK_FALSE(a.ended(500ms));
  gate.closed(first);
  gate.closed(second);
  gate.closed(third);
  CHECK(gate.num_pending() == 0);
}

TEST_CASE("the cluster gate takes no connection that would eat the descriptors kept for HTTP",
          "[cluster]") {
  const int free = free_descriptors();
  if (free < 0) {
    SUCCEED("this process has no descriptor limit");
    return;
  }
  GateLimits limits;
  limits.reserved_descriptors = free + 8;  // more than there are
  ClusterGate gate(limits);
  const auto refused = gate.refusal("10.0.0.1:1000");
  REQUIRE(refused);
  CHECK(refused->find("kept for HTTP") != std::string::npos);
  CHECK(gate.room() < 0);

  GateLimits roomy;
  roomy.reserved_descriptors = 8;
  ClusterGate open(roomy);
  CHECK_FALSE(open.refusal("10.0.0.1:1000"));
  CHECK(open.room() > 0);
}

TEST_CASE("the cluster gate sheds a connection it could not accept", "[cluster]") {
  // (Here the process has descriptors to spare: shed() itself is what is shown, not the
  // EMFILE that leads the acceptor to call it.)
  ClusterGate gate(GateLimits{});
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(listener >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  REQUIRE(::listen(listener, 8) == 0);
  socklen_t length = sizeof address;
  REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) == 0);
  const int client = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(::connect(client, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  // What the acceptor does when accept() fails with EMFILE: the gate's spare descriptor
  // makes room for this one accept.
  gate.shed(listener);
  pollfd p{client, POLLIN, 0};
  REQUIRE(::poll(&p, 1, 5000) == 1);
  char byte;
  CHECK(::recv(client, &byte, 1, 0) == 0);  // closed, not left in the backlog
  ::close(client);
  ::close(listener);
}
