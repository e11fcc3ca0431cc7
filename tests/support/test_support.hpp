// Helpers shared by the tests: where ../shared is, and a clean skip when it is not.
#pragma once

#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace troupe::test {

// The exit code CTest reads as "skipped" (SKIP_RETURN_CODE).
inline constexpr int kSkipExitCode = 77;

// Debian's python3, with the python3-* packages scripts/setup.sh installs (jinja2,
// jsonschema, websockets): PATH's may be another (pyenv's, without them), and a test that
// asked it would skip where it should run.
inline constexpr const char* kPython = "/usr/bin/python3";

// Whether Debian's python3 can import `module`.
inline bool python_has(const std::string& module) {
  const std::string command = std::string(kPython) + " -c 'import " + module + "' >/dev/null 2>&1";
  return std::system(command.c_str()) == 0;
}

// Ends the running test as skipped, saying why. Where TROUPE_TESTS_MUST_RUN is set (the
// GPU machine's scripts/gpu-check.sh), a skip is a failure instead: there, a test that
// did not run must not read as one that passed.
[[noreturn]] inline void skip_test(const std::string& why) {
  const char* must_run = std::getenv("TROUPE_TESTS_MUST_RUN");
  if (must_run != nullptr && *must_run != '\0' && std::string(must_run) != "0") {
    std::printf("FAILED, not skipped (TROUPE_TESTS_MUST_RUN is set): %s\n", why.c_str());
    std::fflush(stdout);
    std::exit(1);
  }
  std::printf("skipped: %s\n", why.c_str());
  std::fflush(stdout);
  std::exit(kSkipExitCode);
}

inline std::filesystem::path shared_dir() {
  if (const char* env = std::getenv("TROUPE_SHARED_DIR")) return env;
  return std::filesystem::path(TROUPE_SOURCE_DIR) / ".." / "shared";
}

// The path of a file under ../shared; skips the running test when it is absent.
inline std::string shared_file(const std::string& relative) {
  const auto path = shared_dir() / relative;
  if (!std::filesystem::exists(path)) {
    skip_test(path.string() + " is absent (tests that need ../shared skip without it)");
  }
  return path.string();
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::vector<std::byte> read_bytes(const std::string& path) {
  const std::string text = read_text(path);
  std::vector<std::byte> bytes(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) bytes[i] = static_cast<std::byte>(text[i]);
  return bytes;
}

// A fresh path in the test's temporary directory.
inline std::string temp_path(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / "troupe-tests";
  std::filesystem::create_directories(dir);
  return (dir / (std::to_string(::getpid()) + "-" + name)).string();
}

}  // namespace troupe::test
