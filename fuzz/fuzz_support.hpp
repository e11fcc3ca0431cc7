// What every fuzz target shares: a check that stops the run on a broken
// invariant (libFuzzer saves the input as a crash), and where ../shared is.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

// A fuzz target checks what must hold for every input, beyond "no crash": when it
// does not, the message says which invariant broke and abort() makes it a crash.
#define TROUPE_FUZZ_CHECK(condition, message)                                                 \
  do {                                                                                        \
    if (!(condition)) {                                                                       \
      std::fprintf(stderr, "%s:%d: invariant broken: %s (%s)\n", __FILE__, __LINE__, message, \
                   #condition);                                                               \
      std::abort();                                                                           \
    }                                                                                         \
  } while (false)

namespace troupe::fuzz {

// ../shared (or $TROUPE_SHARED_DIR): optional inputs that only a full checkout has.
inline std::filesystem::path shared_dir() {
  if (const char* env = std::getenv("TROUPE_SHARED_DIR")) return env;
  return std::filesystem::path(TROUPE_SOURCE_DIR) / ".." / "shared";
}

}  // namespace troupe::fuzz
