#include "actors/cluster/cluster_gate.hpp"
#include "monitoring/log.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>

namespace troupe::actors::cluster {

namespace {

constexpr int kLogBurst = 10;
constexpr auto kLogWindow = std::chrono::seconds(10);

}  // namespace

int free_descriptors() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return -1;
  const auto most = static_cast<long long>(std::min<rlim_t>(limit.rlim_cur, INT_MAX));
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return errno == EMFILE || errno == ENFILE ? 0 : -1;
  long long open = -1;  // the directory's own descriptor is listed too
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] != '.') ++open;
  }
  ::closedir(dir);
  return static_cast<int>(std::max(0LL, most - open));
}

ClusterGate::ClusterGate(GateLimits limits) : limits_(limits) {
  spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  expirer_ = std::thread([this] { expire_loop(); });
}

ClusterGate::~ClusterGate() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  expirer_.join();
  if (spare_fd_ >= 0) ::close(spare_fd_);
}

int ClusterGate::num_pending_locked() const {
  int n = 0;
  for (const auto& [id, c] : connections_) n += c.joined ? 0 : 1;
  return n;
}

int ClusterGate::num_pending() const {
  std::lock_guard lock(mutex_);
  return num_pending_locked();
}

int ClusterGate::room() const {
  const int free = free_descriptors();
  if (free < 0) return -1;
  return free - std::max(limits_.reserved_descriptors, 0);
}

std::optional<std::string> ClusterGate::refusal(const std::string& peer) {
  std::optional<std::string> why;
  if (num_pending() >= limits_.max_pending) {
    why = std::to_string(limits_.max_pending) + " connections are in their handshake already";
  } else if (limits_.reserved_descriptors > 0) {
    // The accepted connection holds one already: what is left must still cover the reserve.
    if (const int free = free_descriptors(); free >= 0 && free < limits_.reserved_descriptors) {
      why = "only " + std::to_string(free) + " descriptors are free, and " +
            std::to_string(limits_.reserved_descriptors) + " are kept for HTTP";
    }
  }
  if (why) {
    std::lock_guard lock(mutex_);
    log("refused a cluster connection from " + peer + ": " + *why);
  }
  return why;
}

std::uint64_t ClusterGate::opened(int fd, const std::string& peer) {
  std::uint64_t id = 0;
  {
    std::lock_guard lock(mutex_);
    id = next_++;
    Connection& c = connections_[id];
    c.fd = fd;
    c.peer = peer;
    c.deadline = std::chrono::steady_clock::now() + limits_.handshake_timeout;
  }
  changed_.notify_all();
  return id;
}

void ClusterGate::tls_failed(std::uint64_t connection, const std::string& why) {
  std::lock_guard lock(mutex_);
  if (auto it = connections_.find(connection); it != connections_.end()) {
    if (it->second.tls_failure.empty()) it->second.tls_failure = why;
  }
}

void ClusterGate::closed(std::uint64_t connection) {
  std::lock_guard lock(mutex_);
  const auto it = connections_.find(connection);
  if (it == connections_.end()) return;
  const Connection c = std::move(it->second);
  connections_.erase(it);
  if (c.joined) return;  // a node's: the registry tells of its loss
  if (c.timed_out) {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.3g", limits_.handshake_timeout.count() / 1000.0);
    log("closed a cluster connection from " + c.peer + ": no node joined over it within " +
        seconds + " s");
  } else if (!c.tls_failure.empty()) {
    log("a cluster connection from " + c.peer + " failed its TLS handshake (" + c.tls_failure +
        ")");
  } else {
    log("a cluster connection from " + c.peer + " closed before a node joined over it");
  }
}

void ClusterGate::joined(const std::string& address, std::uint16_t port) {
  const std::string peer = address + ":" + std::to_string(port);
  std::lock_guard lock(mutex_);
  for (auto& [id, c] : connections_) {
    if (c.peer == peer && !c.joined && !c.timed_out) {
      c.joined = true;
      return;
    }
  }
}

void ClusterGate::shed(int listener) {
  std::lock_guard lock(mutex_);
  if (spare_fd_ >= 0) ::close(spare_fd_);
  const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd >= 0) ::close(fd);
  spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) log("refused a cluster connection: the process is out of descriptors");
}

void ClusterGate::log(const std::string& line) {
  const auto now = std::chrono::steady_clock::now();
  if (now >= log_window_ + kLogWindow) {
    if (num_unlogged_ > 0) {
      monitoring::logf(monitoring::LogLevel::warning,
                       "%d more cluster connections were refused or closed (not logged one by "
                       "one)",
                       num_unlogged_);
    }
    log_window_ = now;
    num_logged_ = 0;
    num_unlogged_ = 0;
  }
  if (num_logged_ < kLogBurst) {
    ++num_logged_;
    monitoring::logf(monitoring::LogLevel::warning, "%s", line.c_str());
  } else {
    ++num_unlogged_;
  }
}

void ClusterGate::expire_loop() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    const auto now = std::chrono::steady_clock::now();
    auto next = std::chrono::steady_clock::time_point::max();
    for (auto& [id, c] : connections_) {
      if (c.joined || c.timed_out) continue;
      if (c.deadline <= now) {
        // Its descriptor is open (closed() comes first): the multiplexer sees the end, and
        // the BASP broker cleans up as after any close.
        ::shutdown(c.fd, SHUT_RDWR);
        c.timed_out = true;
      } else {
        next = std::min(next, c.deadline);
      }
    }
    if (num_unlogged_ > 0) {
      // What the rate left unsaid is said when its window ends, even if all is quiet then.
      if (now >= log_window_ + kLogWindow) {
        monitoring::logf(monitoring::LogLevel::warning,
                         "%d more cluster connections were refused or closed (not logged one "
                         "by one)",
                         num_unlogged_);
        num_unlogged_ = 0;
      } else {
        next = std::min(next, log_window_ + kLogWindow);
      }
    }
    if (next == std::chrono::steady_clock::time_point::max()) {
      changed_.wait(lock);
    } else {
      changed_.wait_until(lock, next);
    }
  }
}

}  // namespace troupe::actors::cluster
