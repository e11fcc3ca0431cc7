// A blocking loopback TCP client for what curl will not send: raw bytes out, raw
// bytes back, with deadlines so that a test never hangs on a server that does.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

namespace troupe::test {

class RawClient {
 public:
  // receive_buffer: SO_RCVBUF before connecting (0: the system's), for a client that
  // should fall behind quickly.
  explicit RawClient(std::uint16_t port, int receive_buffer = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ < 0) return;
    if (receive_buffer > 0) {
      ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer);
    }
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) close();
  }
  ~RawClient() { close(); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool connected() const { return fd_ >= 0; }
  int fd() const { return fd_; }

  bool send(const std::string& bytes) {
    std::size_t sent = 0;
    while (fd_ >= 0 && sent < bytes.size()) {
      const auto n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<std::size_t>(n);
    }
    return sent == bytes.size();
  }

  // Reads until `marker` has arrived, the peer closes, or the deadline passes.
  std::string read_until(const std::string& marker, std::chrono::milliseconds timeout) {
    // A zero timeout still takes what has already arrived.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (fd_ >= 0 && (marker.empty() || received_.find(marker) == std::string::npos)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(std::max<long>(left.count(), 0))) <= 0) break;
      char buffer[65536];
      const auto n = ::recv(fd_, buffer, sizeof buffer, 0);
      if (n <= 0) {
        closed_by_peer_ = true;
        break;
      }
      received_.append(buffer, static_cast<std::size_t>(n));
    }
    return received_;
  }
  // Reads until the peer closes (or the deadline passes).
  std::string read_all(std::chrono::milliseconds timeout) { return read_until("", timeout); }
  bool closed_by_peer() const { return closed_by_peer_; }
  const std::string& received() const { return received_; }

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  std::string received_;
  bool closed_by_peer_ = false;
};

// The status code of the first HTTP response in `bytes` (0 when there is none).
inline int http_status(const std::string& bytes) {
  if (bytes.rfind("HTTP/1.", 0) != 0 || bytes.size() < 12) return 0;
  return std::atoi(bytes.c_str() + 9);
}

}  // namespace troupe::test
