// `troupe bench allreduce`: the latency of the CPU ranks' all-reduce (Gloo on loopback,
// one process per rank) at several sizes, with Gloo's SO_SNDBUF calls ignored (troupe's
// fix) and as Gloo ships, in one run.
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "app/commands.hpp"
#include "cpu/gloo_communicator.hpp"
#include "model/rendezvous_stores.hpp"

namespace troupe::app {

namespace {

using Clock = std::chrono::steady_clock;

struct Timing {
  double median_ms = 0.0;
  double p90_ms = 0.0;
};

// Times all-reduces of each size in turn on one group, as a serving group sees them: its
// first all-reduce is tiny (Gloo sizes a pair's send buffer from its first message), then
// `iterations` of each size. Rank `rank` of `ranks`; the timings are its own.
Result<std::vector<Timing>> time_all_reduces(model::RendezvousStore& store, std::int32_t rank,
                                             std::int32_t ranks,
                                             const std::vector<std::size_t>& sizes_kb,
                                             int iterations, const std::string& prefix,
                                             bool gloo_ring) {
  TROUPE_TRY(auto group, cpu::GlooCommunicator::connect(
                             store, rank, ranks, {"127.0.0.1", prefix, std::chrono::seconds(60)}));
  auto reduce = [&](std::vector<float>& data) {
    return gloo_ring ? group->gloo_ring_all_reduce(data) : group->all_reduce_sum(data);
  };
  std::vector<float> first(1, 1.0f);
  TROUPE_TRY_VOID(reduce(first));
  std::vector<Timing> timings;
  for (const std::size_t kb : sizes_kb) {
    std::vector<float> data(kb * 1024 / sizeof(float), 1.0f);
    const int count = kb >= 16384 ? std::max(3, iterations / 4) : iterations;
    std::vector<double> ms;
    for (int i = -2; i < count; ++i) {  // two warm-ups
      const auto start = Clock::now();
      TROUPE_TRY_VOID(reduce(data));
      if (i >= 0) {
        ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
      }
    }
    std::sort(ms.begin(), ms.end());
    timings.push_back({ms[ms.size() / 2], ms[ms.size() * 9 / 10]});
  }
  return timings;
}

std::string size_name(std::size_t bytes) {
  if (bytes >= (1u << 20)) return std::to_string(bytes >> 20) + " MB";
  return std::to_string(bytes >> 10) + " KB";
}

}  // namespace

void add_bench_allreduce_command(CLI::App& bench) {
  struct Options {
    std::int32_t ranks = 2;
    std::vector<std::size_t> sizes_kb = {4, 64, 1024, 16384};
    int iterations = 20;
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = bench.add_subcommand(
      "allreduce",
      "CPU ranks' all-reduce latency (Gloo, loopback), with and without troupe's "
      "send-buffer fix");
  cmd->add_option("--ranks", opts->ranks, "ranks (one process each)")->check(CLI::Range(2, 64));
  cmd->add_option("--sizes-kb", opts->sizes_kb, "buffer sizes in KB")->delimiter(',');
  cmd->add_option("--iterations", opts->iterations,
                  "timed all-reduces per size (16 MB and more: a quarter)")
      ->check(CLI::PositiveNumber);
  cmd->callback([opts] {
    const auto dir =
        std::filesystem::temp_directory_path() / ("troupe-allreduce-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    model::FileStore store(dir);
    // Ranks 1.. are children, forked before this process starts any thread.
    std::int32_t rank = 0;
    std::vector<pid_t> children;
    for (std::int32_t r = 1; r < opts->ranks; ++r) {
      const pid_t pid = ::fork();
      if (pid == 0) {
        rank = r;
        children.clear();
        break;
      }
      children.push_back(pid);
    }
    auto fail = [&](const Error& e) {
      std::fprintf(stderr, "troupe bench allreduce (rank %d): %s\n", rank, e.message.c_str());
      if (rank != 0) std::_Exit(1);
      for (const pid_t child : children) ::kill(child, SIGKILL);
      throw CLI::RuntimeError(1);
    };
    if (rank == 0) {
      std::printf(
          "all-reduce of float32, %d ranks (processes, Gloo TCP on 127.0.0.1), one group "
          "per column, its first all-reduce 1 float; rank 0's median (p90) in ms\n",
          opts->ranks);
      std::printf("%-8s | %-28s | %-28s | %s\n", "", "Gloo's ring all-reduce",
                  "troupe's (rank-ordered)", "shipped / fixed");
      std::printf("%-8s | %13s %14s | %13s %14s | %7s %7s\n", "size", "shipped", "fixed", "shipped",
                  "fixed", "ring", "troupe");
    }
    // [algorithm: Gloo's ring, troupe's][shipped, fixed][size]
    std::vector<Timing> timing[2][2];
    int formation = 0;
    for (int algorithm = 0; algorithm < 2; ++algorithm) {
      for (int fixed = 0; fixed < 2; ++fixed) {
        cpu::set_gloo_send_buffer_fix(fixed == 1);
        auto t = time_all_reduces(store, rank, opts->ranks, opts->sizes_kb, opts->iterations,
                                  "bench-" + std::to_string(++formation), algorithm == 0);
        if (!t) fail(t.error());
        timing[algorithm][fixed] = std::move(*t);
      }
    }
    auto cell = [](const Timing& t) {
      char text[32];
      std::snprintf(text, sizeof(text), "%6.2f (%6.2f)", t.median_ms, t.p90_ms);
      return std::string(text);
    };
    for (std::size_t i = 0; rank == 0 && i < opts->sizes_kb.size(); ++i) {
      std::printf("%-8s | %13s %14s | %13s %14s | %6.1fx %6.1fx\n",
                  size_name(opts->sizes_kb[i] * 1024).c_str(), cell(timing[0][0][i]).c_str(),
                  cell(timing[0][1][i]).c_str(), cell(timing[1][0][i]).c_str(),
                  cell(timing[1][1][i]).c_str(),
                  timing[0][0][i].median_ms / timing[0][1][i].median_ms,
                  timing[1][0][i].median_ms / timing[1][1][i].median_ms);
    }
    cpu::set_gloo_send_buffer_fix(true);
    if (rank != 0) std::_Exit(0);
    for (const pid_t child : children) ::waitpid(child, nullptr, 0);
    std::filesystem::remove_all(dir);
  });
}

}  // namespace troupe::app
