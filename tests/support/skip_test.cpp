// A test that cannot run skips (CTest's code 77) everywhere but under the GPU machine's
// check script, where TROUPE_TESTS_MUST_RUN makes the same skip a failure.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>

#include "support/test_support.hpp"

namespace {

// The exit code of a child that calls skip_test, with the variable set to `must_run`
// (or unset when null).
int exit_code_of_skip(const char* must_run) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (must_run != nullptr) {
      ::setenv("TROUPE_TESTS_MUST_RUN", must_run, 1);
    } else {
      ::unsetenv("TROUPE_TESTS_MUST_RUN");
    }
    troupe::test::skip_test("a test that cannot run here");
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  return WEXITSTATUS(status);
}

}  // namespace

TEST_CASE("a skip is a skip, except where the tests must run", "[support]") {
  CHECK(exit_code_of_skip(nullptr) == troupe::test::kSkipExitCode);
  CHECK(exit_code_of_skip("0") == troupe::test::kSkipExitCode);
  CHECK(exit_code_of_skip("") == troupe::test::kSkipExitCode);
  CHECK(exit_code_of_skip("1") == 1);
}
