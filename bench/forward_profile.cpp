#include "bench/forward_profile.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <thread>

#include "cpu/cpu_backend.hpp"
#include "cpu/int8_repack.hpp"

namespace troupe::bench {

namespace {

constexpr std::int32_t kDecodeSteps = 16;

std::vector<std::int32_t> blocks_from(std::int32_t first, std::int32_t count) {
  std::vector<std::int32_t> table(count);
  std::iota(table.begin(), table.end(), first);
  return table;
}

bool is_int8_matmul(const std::string& op) {
  return op.rfind("matmul ", 0) == 0 && op.find("F32") == std::string::npos &&
         op.find("F16") == std::string::npos && op.find("BF16") == std::string::npos;
}

// The int8 instruction's peak over `threads` threads at once, multiply-adds per second.
double int8_peak(int threads) {
  std::vector<double> each(static_cast<std::size_t>(threads));
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back(
        [&, t] { each[static_cast<std::size_t>(t)] = cpu::int8_peak_macs_per_second(0.3); });
  }
  for (auto& w : workers) w.join();
  return std::accumulate(each.begin(), each.end(), 0.0);
}

// One op a line, the largest share first; per step where `steps` > 1.
void print_ops(const cpu::OpProfile& profile, int steps, bool decode) {
  std::vector<std::pair<std::string, cpu::OpProfile::Op>> ops(profile.ops.begin(),
                                                              profile.ops.end());
  std::sort(ops.begin(), ops.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  const double total = profile.total_seconds();
  std::printf("  %-28s %7s %10s %7s %12s %10s\n", "op", "share", decode ? "ms/step" : "ms", "calls",
              "G MAC/s", "weights GB/s");
  for (const auto& [name, op] : ops) {
    std::printf("  %-28s %6.1f%% %10.3f %7lld", name.c_str(), 100.0 * op.seconds / total,
                1000.0 * op.seconds / steps, static_cast<long long>(op.calls / steps));
    if (op.macs > 0.0) {
      std::printf(" %12.1f %10.1f", op.macs / op.seconds / 1e9, op.weight_bytes / op.seconds / 1e9);
    }
    std::printf("\n");
  }
}

}  // namespace

bool print_profile(model::LoadedModel& loaded, std::int32_t prompt_len,
                   const std::vector<std::int32_t>& batches, std::int32_t block_size, int threads,
                   double bandwidth_gb_s, std::int32_t num_adapters) {
  auto* cpu = dynamic_cast<cpu::CpuBackend*>(loaded.backend.get());
  if (cpu == nullptr) {
    std::printf("--profile: op timings come from the CPU backend only\n");
    return false;
  }
  const std::int32_t max_batch = *std::max_element(batches.begin(), batches.end());
  const std::int32_t per_seq =
      (std::max(prompt_len, kDecodeSteps + 4) + block_size - 1) / block_size;
  if (auto kv = loaded.allocate_kv_cache(max_batch * per_seq, block_size); !kv) {
    std::printf("--profile: %s\n", kv.error().message.c_str());
    return false;
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<TokenId> any_token(0, loaded.model->config().vocab_size - 1);
  std::vector<float> logits;
  const double peak = int8_peak(threads);
  const auto int8_share = [&](const cpu::OpProfile& p) {
    double macs = 0.0, seconds = 0.0, bytes = 0.0;
    for (const auto& [name, op] : p.ops) {
      if (op.macs > 0.0) bytes += op.weight_bytes;
      if (!is_int8_matmul(name)) continue;
      macs += op.macs;
      seconds += op.seconds;
    }
    return std::array<double, 3>{macs, seconds, bytes};
  };

  cpu::OpProfile profile;
  {
    std::vector<TokenId> prompt(static_cast<std::size_t>(prompt_len));
    for (auto& t : prompt) t = any_token(rng);
    model::StepInput step;
    model::append_sequence(step, prompt, 0, blocks_from(0, per_seq), true);
    cpu->set_profile(&profile);
    const auto r = loaded.model->forward(step, logits);
    cpu->set_profile(nullptr);
    if (!r) {
      std::printf("--profile: %s\n", r.error().message.c_str());
      return false;
    }
  }
  std::printf("profile: one prefill of %d tokens, %.1f ms of ops\n", prompt_len,
              1000.0 * profile.total_seconds());
  print_ops(profile, 1, false);
  const auto [macs, seconds, bytes] = int8_share(profile);
  (void)bytes;
  if (peak > 0.0 && seconds > 0.0) {
    std::printf(
        "  int8 matmuls: %.1f G MAC/s, %.0f%% of the processor's int8 peak (vpdpbusd, "
        "%d threads: %.1f G MAC/s)\n",
        macs / seconds / 1e9, 100.0 * macs / seconds / peak, threads, peak / 1e9);
  }
  for (const std::int32_t batch : batches) {
    cpu::OpProfile decode;
    for (std::int32_t i = 0; i < kDecodeSteps + 2; ++i) {
      model::StepInput step;
      for (std::int32_t s = 0; s < batch; ++s) {
        const TokenId token = any_token(rng);
        model::append_sequence(step, std::span(&token, 1), i, blocks_from(s * per_seq, per_seq),
                               true, num_adapters > 0 ? 1 + s % num_adapters : 0);
      }
      if (i == 2) cpu->set_profile(&decode);  // after two warm-up steps
      const auto r = loaded.model->forward(step, logits);
      if (!r) {
        cpu->set_profile(nullptr);
        std::printf("--profile: %s\n", r.error().message.c_str());
        return false;
      }
    }
    cpu->set_profile(nullptr);
    std::printf("profile: a decode step at batch %d (%d steps), %.3f ms of ops a step\n", batch,
                kDecodeSteps, 1000.0 * decode.total_seconds() / kDecodeSteps);
    print_ops(decode, kDecodeSteps, true);
    const auto [dmacs, dseconds, dbytes] = int8_share(decode);
    if (peak > 0.0 && dseconds > 0.0) {
      std::printf("  int8 matmuls: %.1f G MAC/s, %.0f%% of the int8 peak", dmacs / dseconds / 1e9,
                  100.0 * dmacs / dseconds / peak);
    }
    double matmul_seconds = 0.0;
    for (const auto& [name, op] : decode.ops) {
      if (op.macs > 0.0) matmul_seconds += op.seconds;
    }
    if (matmul_seconds > 0.0) {
      const double gb_s = dbytes / matmul_seconds / 1e9;
      std::printf("%s all matmuls read weights at %.1f GB/s", peak > 0.0 ? ";" : " ", gb_s);
      if (bandwidth_gb_s > 0.0) {
        std::printf(", %.0f%% of the measured read bandwidth", 100.0 * gb_s / bandwidth_gb_s);
      }
    }
    std::printf("\n");
  }
  std::fflush(stdout);
  return true;
}

}  // namespace troupe::bench
