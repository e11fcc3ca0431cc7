// `troupe bench forward --profile`: each op of a prefill and of a decode step, their shares
// adding up to the step, and the int8 matmuls measured against the processor's peak.
#include <sys/wait.h>

#include <array>
#include <catch2/catch.hpp>
#include <cstdio>
#include <sstream>
#include <string>

#include "cpu/int8_repack.hpp"
#include "support/test_support.hpp"

namespace {

struct Run {
  int exit_code = -1;
  std::string out;
};

Run run_troupe(const std::string& args) {
  const std::string command = std::string(TROUPE_BINARY) + " " + args + " 2>&1";
  Run run;
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::array<char, 4096> buffer{};
  while (std::size_t n = std::fread(buffer.data(), 1, buffer.size(), pipe))
    run.out.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

// The shares of the table that follows the line starting with `title`.
double shares_after(const std::string& out, const std::string& title) {
  std::istringstream lines(out.substr(out.find(title)));
  std::string line;
  std::getline(lines, line);  // the title
  std::getline(lines, line);  // the header
  double total = 0.0;
  while (std::getline(lines, line) && line.rfind("  ", 0) == 0 &&
         line.find('%') != std::string::npos && line.find("int8 matmuls") == std::string::npos) {
    std::istringstream fields(line);
    std::string word;
    // The op's name may have spaces; the share is the first field ending in '%'.
    while (fields >> word) {
      if (word.back() == '%') {
        total += std::stod(word.substr(0, word.size() - 1));
        break;
      }
    }
  }
  return total;
}

}  // namespace

TEST_CASE("bench forward --profile shows each op's share of a prefill and a decode step", "[cli]") {
  const std::string model = troupe::test::temp_path("profile-q8_0.gguf");
  const Run made = run_troupe("make-model --out " + model + " --type q8_0 --layers 2");
  INFO(made.out);
  REQUIRE(made.exit_code == 0);
  const Run run = run_troupe("bench forward -m " + model +
                             " --threads 1 --prompt-len 32 --gen-len 2 --batch 1,3 "
                             "--repetitions 1 --profile");
  INFO(run.out);
  REQUIRE(run.exit_code == 0);
  CHECK(run.out.find("profile: one prefill of 32 tokens") != std::string::npos);
  CHECK(run.out.find("profile: a decode step at batch 1") != std::string::npos);
  CHECK(run.out.find("profile: a decode step at batch 3") != std::string::npos);
  CHECK(run.out.find("attention") != std::string::npos);
  CHECK(run.out.find("rms_norm") != std::string::npos);
  // Q8_0 matrices go through the repacked kernel where this processor runs it.
  CHECK(run.out.find(troupe::cpu::repacked_kernel_available(troupe::gguf::TensorType::q8_0)
                         ? "matmul Q8_0 (repacked)"
                         : "matmul Q8_0") != std::string::npos);
  if (troupe::cpu::int8_peak_macs_per_second(0.01) > 0.0) {
    CHECK(run.out.find("of the processor's int8 peak") != std::string::npos);
  }
  // Each table's shares add up to its step (rounding: 0.1% a line).
  CHECK(shares_after(run.out, "profile: one prefill") == Approx(100.0).margin(1.0));
  CHECK(shares_after(run.out, "profile: a decode step at batch 3") == Approx(100.0).margin(1.0));
}
