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

inline std::filesystem::path shared_dir() {
  if (const char* env = std::getenv("TROUPE_SHARED_DIR")) return env;
  return std::filesystem::path(TROUPE_SOURCE_DIR) / ".." / "shared";
}

// The path of a file under ../shared; skips the running test when it is absent.
inline std::string shared_file(const std::string& relative) {
  const auto path = shared_dir() / relative;
  if (!std::filesystem::exists(path)) {
    std::printf("skipped: %s is absent (tests that need ../shared skip without it)\n",
                path.c_str());
    std::fflush(stdout);
    std::exit(kSkipExitCode);
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
