// A process a test starts (a head or a node of a cluster): its output (stdout and stderr
// together) is collected as it comes, and it is killed and reaped when the test ends.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <regex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace troupe::test {

class ChildProcess {
 public:
  explicit ChildProcess(const std::vector<std::string>& argv) {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::dup2(fds[1], STDOUT_FILENO);
      ::dup2(fds[1], STDERR_FILENO);
      ::close(fds[0]);
      ::close(fds[1]);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    reader_ = std::thread([this, fd = fds[0]] {
      char buffer[4096];
      ssize_t n;
      while ((n = ::read(fd, buffer, sizeof buffer)) > 0) {
        std::lock_guard lock(mutex_);
        output_.append(buffer, static_cast<std::size_t>(n));
        arrived_.notify_all();
      }
      ::close(fd);
    });
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() {
    kill(SIGKILL);
    wait_exit(std::chrono::seconds(10));
    if (reader_.joinable()) reader_.join();
  }

  pid_t pid() const { return pid_; }

  std::string output() const {
    std::lock_guard lock(mutex_);
    return output_;
  }

  // The first match of `pattern` in the output, waiting up to `timeout` for it; the
  // first group when the pattern has one.
  std::optional<std::string> wait_for(const std::string& pattern,
                                      std::chrono::milliseconds timeout) {
    const std::regex re(pattern);
    std::unique_lock lock(mutex_);
    std::smatch m;
    const bool found =
        arrived_.wait_for(lock, timeout, [&] { return std::regex_search(output_, m, re); });
    if (!found) return std::nullopt;
    return m.size() > 1 ? m[1].str() : m[0].str();
  }

  void kill(int sig) {
    if (!exit_code_) ::kill(pid_, sig);
  }

  // The exit code (128 + signal when killed), once it has ended within `timeout`.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!exit_code_) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      } else if (std::chrono::steady_clock::now() >= deadline) {
        break;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    return exit_code_;
  }

 private:
  pid_t pid_ = -1;
  std::thread reader_;
  mutable std::mutex mutex_;
  std::condition_variable arrived_;
  std::string output_;
  std::optional<int> exit_code_;
};

}  // namespace troupe::test
