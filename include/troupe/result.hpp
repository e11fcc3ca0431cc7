// Errors as values: Result<T> for what can go wrong at run time, TROUPE_ASSERT
// for broken invariants.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include <tl/expected.hpp>

namespace troupe {

enum class ErrorCode {
  invalid_argument,  // bad parameters from a caller or a user
  invalid_file,      // a corrupt, truncated or unsupported model file
  io,                // the operating system refused (open, mmap, write)
  out_of_range,      // a request that does not fit (context, memory)
  unsupported,       // valid but not implemented (a tensor type, an architecture)
  unavailable,       // nothing can serve it now (no replica up); worth retrying later
  timed_out,         // another party (a rank of a group, a peer) did not come in time
  internal,
};

struct Error {
  ErrorCode code = ErrorCode::internal;
  std::string message;
};

template <typename T>
using Result = tl::expected<T, Error>;

inline tl::unexpected<Error> make_error(ErrorCode code, std::string message) {
  return tl::unexpected<Error>(Error{code, std::move(message)});
}

[[noreturn]] inline void assert_fail(const char* file, int line, const char* condition,
                                     const char* message) {
  std::fprintf(stderr, "troupe: invariant broken at %s:%d: %s (%s)\n", file, line, message,
               condition);
  std::abort();
}

}  // namespace troupe

#define TROUPE_ASSERT(condition, message)                                             \
  do {                                                                                \
    if (!(condition)) ::troupe::assert_fail(__FILE__, __LINE__, #condition, message); \
  } while (0)

// Propagates the error of a Result expression, or binds its value.
#define TROUPE_TRY_CAT2(a, b) a##b
#define TROUPE_TRY_CAT(a, b) TROUPE_TRY_CAT2(a, b)
#define TROUPE_TRY(lhs, expr) TROUPE_TRY_IMPL(TROUPE_TRY_CAT(troupe_try_, __LINE__), lhs, expr)
#define TROUPE_TRY_IMPL(tmp, lhs, expr)                                     \
  auto tmp = (expr);                                                        \
  if (!tmp) return tl::unexpected<::troupe::Error>(std::move(tmp).error()); \
  lhs = std::move(*tmp)

// Propagates the error of a Result<void> expression.
#define TROUPE_TRY_VOID(expr)                                                     \
  do {                                                                            \
    auto troupe_try_void = (expr);                                                \
    if (!troupe_try_void)                                                         \
      return tl::unexpected<::troupe::Error>(std::move(troupe_try_void).error()); \
  } while (0)
