// Shell commands from tests: what a command prints and how it exits, and curl against a
// server on loopback, its JSON body passed through a file (no shell quoting trouble).
#pragma once

#include <sys/wait.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "support/test_support.hpp"

namespace troupe::test {

struct ShellRun {
  int exit_code = -1;  // -1: it did not exit by itself, or could not start
  std::string output;  // its standard output (append 2>&1 to the command for the errors)
};

inline ShellRun run_shell(const std::string& command) {
  ShellRun run;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  while (std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) run.output.append(buffer, n);
  const int status = ::pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

struct CurlReply {
  int status = 0;  // 0: no answer
  std::string body;
};

// curl with `args` (-s -N, ...) to http://127.0.0.1:port`path`; `body`, when given, is POSTed
// as JSON from a file of its own (calls may run at once).
inline CurlReply curl(std::uint16_t port, const std::string& path, const std::string& body = {},
                      const std::string& args = "-s") {
  std::string command = "curl " + args + " -o - -w '\\n%{http_code}'";
  if (!body.empty()) {
    static std::atomic<int> next{0};
    const std::string file = temp_path("curl-body-" + std::to_string(next++) + ".json");
    std::FILE* f = std::fopen(file.c_str(), "wb");
    if (f != nullptr) {
      std::fwrite(body.data(), 1, body.size(), f);
      std::fclose(f);
    }
    command += " -H 'Content-Type: application/json' --data-binary @" + file;
  }
  command += " http://127.0.0.1:" + std::to_string(port) + path + " 2>/dev/null";
  const std::string out = run_shell(command).output;
  CurlReply reply;
  const auto nl = out.rfind('\n');
  if (nl == std::string::npos) return reply;
  reply.status = std::atoi(out.c_str() + nl + 1);
  reply.body = out.substr(0, nl);
  return reply;
}

}  // namespace troupe::test
