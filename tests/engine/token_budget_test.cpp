// The token budget's decisions, fed steps timed by a fake cost model.
#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "engine/token_budget.hpp"

using namespace troupe::engine;

namespace {

// A machine whose step costs fixed + per_token * tokens, in milliseconds.
struct FakeMachine {
  double fixed_ms = 10.0;
  double per_token_ms = 2.0;

  StepCost step(std::int32_t num_tokens, std::int32_t num_decodes, double noise = 1.0) const {
    return {num_tokens, num_decodes, (fixed_ms + per_token_ms * num_tokens) * noise / 1000.0};
  }
  // What a worker measures at load: a prefill of 256 tokens and one decode.
  std::vector<StepCost> calibration() const { return {step(256, 0), step(1, 1)}; }
};

TokenBudgetConfig config_150ms() {
  TokenBudgetConfig c;
  c.target_step_seconds = 0.150;
  c.max_tokens = 2048;
  c.granularity = 16;
  c.initial_tokens = 256;
  return c;
}

// A steady stream: `num_decodes` sequences decode, a long prompt fills the rest.
void run_steps(TokenBudget& budget, const FakeMachine& machine, std::int32_t num_decodes,
               int num_steps) {
  for (int i = 0; i < num_steps; ++i) {
    budget.observe(machine.step(budget.budget(num_decodes), num_decodes));
  }
}

// A deterministic noise factor in [1 - amplitude, 1 + amplitude].
struct Noise {
  std::uint64_t state = 12345;
  double next(double amplitude) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    const double unit = static_cast<double>(state >> 11) / static_cast<double>(1ULL << 53);
    return 1.0 + amplitude * (2.0 * unit - 1.0);
  }
};

}  // namespace

TEST_CASE("a calibrated budget is the most tokens whose step stays within the target",
          "[engine][token_budget]") {
  TokenBudget budget(config_150ms());
  budget.calibrate(FakeMachine{}.calibration());
  CHECK(budget.model().fixed_seconds == Approx(0.010));
  CHECK(budget.model().seconds_per_token == Approx(0.002));
  // (150 - 10) / 2 = 70 tokens a step: the decodes and the prefill share, whole granules.
  CHECK(budget.budget(4) == 4 + 64);
  CHECK(budget.budget(1) == 1 + 64);
  CHECK(budget.budget(5) == 5 + 64);
  CHECK(budget.budget(7) == 7 + 48);
  SECTION("with no decode running, nothing waits on the step: the whole maximum") {
    CHECK(budget.budget(0) == 2048);
  }
}

TEST_CASE("an uncalibrated budget starts from its initial tokens and converges",
          "[engine][token_budget]") {
  TokenBudget budget(config_150ms());
  CHECK(budget.num_observed() == 0);
  CHECK(budget.budget(4) == 4 + 240);  // 256 tokens in all, rounded down to a granule
  // Two steps of different sizes show the slope; from then on it holds.
  run_steps(budget, FakeMachine{}, 4, 2);
  CHECK(budget.model().seconds_per_token == Approx(0.002).epsilon(0.01));
  CHECK(budget.budget(4) == 68);
  run_steps(budget, FakeMachine{}, 4, 50);
  CHECK(budget.budget(4) == 68);
  CHECK(budget.model().fixed_seconds == Approx(0.010).epsilon(0.01));
}

TEST_CASE("a machine that gets slower lowers the budget, and a faster one raises it",
          "[engine][token_budget]") {
  TokenBudget budget(config_150ms());
  budget.calibrate(FakeMachine{}.calibration());
  REQUIRE(budget.budget(4) == 68);
  // Twice the cost per token: (150 - 10) / 4 = 35 tokens, so 4 decodes and 16 more.
  run_steps(budget, FakeMachine{10.0, 4.0}, 4, 60);
  CHECK(budget.budget(4) == 20);
  CHECK(budget.model().seconds_per_token > 0.003);  // fitted near the sizes run
  // Half the cost: (150 - 10) / 1 = 140 tokens.
  run_steps(budget, FakeMachine{10.0, 1.0}, 4, 60);
  CHECK(budget.budget(4) == 4 + 128);
}

TEST_CASE("noise in the step times does not make the budget jump", "[engine][token_budget]") {
  TokenBudget budget(config_150ms());
  budget.calibrate(FakeMachine{}.calibration());
  Noise noise;
  std::int32_t lowest = budget.budget(4), highest = lowest;
  for (int i = 0; i < 400; ++i) {
    const std::int32_t b = budget.budget(4);
    lowest = std::min(lowest, b);
    highest = std::max(highest, b);
    // Steps alternate with decode-only ones, each 10% off either way.
    budget.observe(FakeMachine{}.step(b, 4, noise.next(0.10)));
    budget.observe(FakeMachine{}.step(4, 4, noise.next(0.10)));
  }
  INFO("budget between " << lowest << " and " << highest);
  CHECK(lowest >= 68 - 16);
  CHECK(highest <= 68 + 16);
  SECTION("one step ten times too slow (the machine was busy) costs a granule or two") {
    budget.observe(FakeMachine{}.step(budget.budget(4), 4, 10.0));
    CHECK(budget.budget(4) >= 68 - 32);
  }
}

TEST_CASE("the budget stays within a granule of prefill and the maximum",
          "[engine][token_budget]") {
  SECTION("decodes alone overrun the target: prompts still move, a granule a step") {
    TokenBudget budget(config_150ms());
    budget.calibrate(FakeMachine{200.0, 2.0}.calibration());
    CHECK(budget.budget(4) == 4 + 16);
    CHECK(budget.budget(100) == 100 + 16);
  }
  SECTION("a fast machine gets the maximum") {
    TokenBudget budget(config_150ms());
    budget.calibrate(FakeMachine{1.0, 0.01}.calibration());
    CHECK(budget.budget(4) == 2048);
  }
  SECTION("more decodes than the maximum: the maximum") {
    TokenBudget budget(config_150ms());
    budget.calibrate(FakeMachine{}.calibration());
    CHECK(budget.budget(3000) == 2048);
  }
  SECTION("a small maximum") {
    auto config = config_150ms();
    config.max_tokens = 40;
    TokenBudget budget(config);
    budget.calibrate(FakeMachine{}.calibration());
    CHECK(budget.budget(4) == 40);
    CHECK(budget.budget(0) == 40);
  }
}

TEST_CASE("steps all of one size keep the slope and move only the fixed part",
          "[engine][token_budget]") {
  TokenBudget budget(config_150ms());
  budget.calibrate(FakeMachine{}.calibration());
  SECTION("decodes of the same machine change nothing") {
    for (int i = 0; i < 200; ++i) budget.observe(FakeMachine{}.step(8, 8));
    CHECK(budget.model().seconds_per_token == Approx(0.002));
    CHECK(budget.model().fixed_seconds == Approx(0.010));
    CHECK(budget.budget(4) == 68);
  }
  SECTION("decodes that grow dearer (longer contexts) lower the budget, within reason") {
    // 30 ms more per decode step than the calibration said.
    for (int i = 0; i < 200; ++i) budget.observe(FakeMachine{40.0, 2.0}.step(8, 8));
    CHECK(budget.model().seconds_per_token == Approx(0.002).epsilon(0.1));
    CHECK(budget.model().fixed_seconds * 1000 + budget.model().seconds_per_token * 8000 ==
          Approx(56.0).epsilon(0.01));
    // (150 - 40) / 2 = 55 tokens in all at the true cost: 4 decodes and 48 more.
    CHECK(budget.budget(4) >= 4 + 32);
    CHECK(budget.budget(4) <= 4 + 48);
  }
  SECTION("measurements that make no sense are ignored") {
    budget.observe({0, 0, 0.5});
    budget.observe({8, 8, -1.0});
    CHECK(budget.num_observed() == 2);  // the calibration's two
    CHECK(budget.budget(4) == 68);
  }
}

TEST_CASE("the budget is a function of its inputs", "[engine][token_budget]") {
  auto run = [] {
    TokenBudget budget(config_150ms());
    budget.calibrate(FakeMachine{}.calibration());
    Noise noise;
    std::vector<std::int32_t> budgets;
    for (int i = 0; i < 100; ++i) {
      budgets.push_back(budget.budget(1 + i % 8));
      budget.observe(FakeMachine{}.step(budgets.back(), 1 + i % 8, noise.next(0.2)));
    }
    return budgets;
  };
  CHECK(run() == run());
}

TEST_CASE("calibrating again forgets the last worker's machine", "[engine][token_budget]") {
  TokenBudget budget(config_150ms());
  budget.calibrate(FakeMachine{}.calibration());
  run_steps(budget, FakeMachine{}, 4, 20);
  budget.calibrate(FakeMachine{10.0, 4.0}.calibration());
  CHECK(budget.num_observed() == 2);
  CHECK(budget.budget(4) == 20);
  budget.calibrate({});
  CHECK(budget.budget(4) == 4 + 240);
}

TEST_CASE("with a decode-step multiple, a chunk at most doubles the decodes' own step",
          "[engine][token_budget]") {
  // Reading the weights dominates a decode (20 ms), a token adds 0.1 ms.
  const FakeMachine machine{20.0, 0.1};
  TokenBudgetConfig c = config_150ms();
  c.decode_step_multiple = 2.0;
  TokenBudget budget(c);
  budget.calibrate(machine.calibration());
  for (const std::int32_t decodes : {1, 4, 16, 64}) {
    INFO(decodes << " decodes");
    const double alone = machine.step(decodes, decodes).seconds;
    CHECK(budget.target_seconds(decodes) == Approx(2.0 * alone));
    const std::int32_t tokens = budget.budget(decodes);
    // Whole granules of prefill, as many as fit within twice the decodes' step.
    CHECK((tokens - decodes) % 16 == 0);
    CHECK(machine.step(tokens, decodes).seconds <= 2.0 * alone + 1e-9);
    CHECK(machine.step(tokens + 16, decodes).seconds > 2.0 * alone);
  }
  SECTION("the target still caps it where twice the decodes' step is longer") {
    const FakeMachine slow{100.0, 0.1};
    budget.calibrate(slow.calibration());
    CHECK(budget.target_seconds(4) == Approx(0.150));
    CHECK(slow.step(budget.budget(4), 4).seconds <= 0.150 + 1e-9);
  }
  SECTION("without it, the target alone") {
    TokenBudget plain(config_150ms());
    plain.calibrate(machine.calibration());
    CHECK(plain.target_seconds(4) == Approx(0.150));
  }
}

TEST_CASE("the decode-step bound waits for a measured model with a fixed part",
          "[engine][token_budget]") {
  TokenBudgetConfig c = config_150ms();
  c.decode_step_multiple = 2.0;
  // Uncalibrated (a split model's ranks): the guess has no fixed part, so the target
  // alone holds, and the first chunks are the initial tokens, not one granule.
  TokenBudget guess(c);
  CHECK(guess.target_seconds(1) == Approx(0.150));
  CHECK(guess.budget(1) >= 1 + 240);
  // Measured steps that fit a negative fixed part: the target alone too.
  TokenBudget odd(c);
  odd.calibrate(std::vector<StepCost>{{256, 0, 0.100}, {1, 1, 0.0001}});
  REQUIRE(odd.model().fixed_seconds < 0);
  CHECK(odd.target_seconds(4) == Approx(0.150));
}

namespace {

// A server under a steady load: `num_decodes` streams decode and prompts always wait, so
// every step carries what the budget gives (the closed burst of issue 35, where a wrong
// calibration once stuck at one granule of prefill for a server's whole life).
struct SteadyLoad {
  SteadyLoad(FakeMachine m, std::int32_t decodes, double amplitude = 0.0)
      : machine(m), num_decodes(decodes), noise_amplitude(amplitude) {}

  FakeMachine machine;
  std::int32_t num_decodes;
  double noise_amplitude;
  Noise noise;

  // Runs one step as EngineCore does (the budget it offers, then its measured cost);
  // returns the step's seconds.
  double step(TokenBudget& budget) {
    const std::int32_t tokens = budget.step_budget(num_decodes);
    const StepCost cost =
        machine.step(tokens, num_decodes, noise_amplitude > 0 ? noise.next(noise_amplitude) : 1.0);
    budget.observe(cost);
    return cost.seconds;
  }
};

// The budget a model of the true machine gives (what a perfect calibration would say).
std::int32_t true_budget(const TokenBudgetConfig& config, const FakeMachine& machine,
                         std::int32_t num_decodes) {
  TokenBudget truth(config);
  truth.calibrate(machine.calibration());
  return truth.budget(num_decodes);
}

// Steps until the steady budget is within a granule of `want` and stays there for the
// `hold` steps after (-1 when it never does within `most` steps).
int steps_to_converge(TokenBudget& budget, SteadyLoad& load, std::int32_t want, int most,
                      int hold = 100) {
  const std::int32_t granule = budget.config().granularity;
  int settled_at = -1;
  for (int i = 0; i < most + hold; ++i) {
    const std::int32_t b = budget.budget(load.num_decodes);
    const bool near = b >= want - granule && b <= want + granule;
    if (near && settled_at < 0) settled_at = i;
    if (!near) settled_at = -1;
    if (settled_at >= 0 && i - settled_at >= hold) return settled_at;
    if (settled_at < 0 && i >= most) return -1;
    load.step(budget);
  }
  return settled_at;
}

TokenBudgetConfig config_sarathi() {
  TokenBudgetConfig c = config_150ms();
  c.decode_step_multiple = 2.0;
  return c;
}

// The machine of issue 35's good servers (13 ms + 1.2 ms a token) and its bad calibration.
const FakeMachine kIssueMachine{13.0, 1.2};

}  // namespace

TEST_CASE("a calibration three times too slow converges to the true budget within 20 steps",
          "[engine][token_budget]") {
  for (const std::int32_t decodes : {4, 16, 64}) {
    for (const double multiple : {0.0, 2.0}) {
      INFO(decodes << " decodes, decode-step multiple " << multiple);
      TokenBudgetConfig c = config_150ms();
      c.decode_step_multiple = multiple;
      TokenBudget budget(c);
      budget.calibrate(FakeMachine{39.0, 3.6}.calibration());
      SteadyLoad load{kIssueMachine, decodes};
      const std::int32_t want = true_budget(c, kIssueMachine, decodes);
      INFO("the true budget " << want << ", the calibrated one " << budget.budget(decodes));
      const int steps = steps_to_converge(budget, load, want, 20);
      INFO("converged after " << steps << " steps, at " << budget.budget(decodes));
      CHECK(steps >= 0);
    }
  }
}

TEST_CASE("a calibration three times too fast converges to the true budget within 20 steps",
          "[engine][token_budget]") {
  for (const std::int32_t decodes : {4, 16, 64}) {
    for (const double multiple : {0.0, 2.0}) {
      INFO(decodes << " decodes, decode-step multiple " << multiple);
      TokenBudgetConfig c = config_150ms();
      c.decode_step_multiple = multiple;
      TokenBudget budget(c);
      budget.calibrate(FakeMachine{13.0 / 3, 0.4}.calibration());
      SteadyLoad load{kIssueMachine, decodes};
      const std::int32_t want = true_budget(c, kIssueMachine, decodes);
      INFO("the true budget " << want << ", the calibrated one " << budget.budget(decodes));
      const int steps = steps_to_converge(budget, load, want, 20);
      INFO("converged after " << steps << " steps, at " << budget.budget(decodes));
      CHECK(steps >= 0);
    }
  }
}

TEST_CASE("issue 35's bad calibration (31 ms + 3.2 ms a token) converges within 40 noisy steps",
          "[engine][token_budget]") {
  TokenBudget budget(config_sarathi());
  budget.calibrate(FakeMachine{31.0, 3.2}.calibration());
  SteadyLoad load{kIssueMachine, 64, 0.10};
  const std::int32_t want = true_budget(config_sarathi(), kIssueMachine, 64);
  INFO("the true budget " << want << ", the calibrated one " << budget.budget(64));
  const int steps = steps_to_converge(budget, load, want, 40);
  INFO("converged after " << steps << " steps, at " << budget.budget(64));
  CHECK(steps >= 0);
}

TEST_CASE("a start on a busy machine converges within 40 steps once the machine is free",
          "[engine][token_budget]") {
  // Both cores busy at load and for the first 80 steps: everything three times dearer;
  // then the machine is the server's alone.
  TokenBudget budget(config_sarathi());
  budget.calibrate(FakeMachine{39.0, 3.6}.calibration());
  SteadyLoad load{FakeMachine{39.0, 3.6}, 64, 0.05};
  for (int i = 0; i < 80; ++i) load.step(budget);
  load.machine = kIssueMachine;
  const std::int32_t want = true_budget(config_sarathi(), kIssueMachine, 64);
  const int steps = steps_to_converge(budget, load, want, 40);
  INFO("converged after " << steps << " steps, at " << budget.budget(64) << " (true " << want
                          << ")");
  CHECK(steps >= 0);
}

TEST_CASE("a well calibrated budget explores little and its probes cost little",
          "[engine][token_budget]") {
  for (const std::int32_t decodes : {4, 16, 64}) {
    INFO(decodes << " decodes");
    TokenBudget budget(config_sarathi());
    budget.calibrate(kIssueMachine.calibration());
    SteadyLoad load{kIssueMachine, decodes};
    const std::int32_t want = budget.budget(decodes);
    // The step the budget means (at least a granule of prefill, even past the target).
    const double steady = kIssueMachine.step(want, decodes).seconds;
    double total = 0.0;
    for (int i = 0; i < 400; ++i) {
      total += load.step(budget);
      CHECK(budget.budget(decodes) >= want - 16);
      CHECK(budget.budget(decodes) <= want + 16);
    }
    INFO(budget.num_probes() << " probes in 400 steps, the period now " << budget.probe_period());
    CHECK(budget.num_probes() <= 400 / 32);
    CHECK(budget.probe_period() == budget.config().max_probe_period);
    // The probes' extra prefill, spread over every step: within 5% of the steady step.
    CHECK(total / 400 <= steady * 1.05);
  }
}

TEST_CASE("a TPOT objective leaves each stream's time per token since its first in bounds",
          "[engine][token_budget][slo]") {
  TokenBudgetConfig c = config_150ms();
  c.target_tpot_seconds = 0.250;
  c.tpot_margin = 0.9;
  // 0.225 s a token: after 10 tokens in 1.0 s a stream may wait 0.225 x 11 - 1.0 = 1.475 s
  // for its next; a stream just started, 0.225 - 0.05 = 0.175 s. The least counts.
  const std::vector<StreamProgress> streams{{10, 1.0}, {0, 0.05}};
  CHECK(*tpot_step_seconds(c, streams) == Approx(0.175));
  CHECK(*tpot_step_seconds(c, std::vector<StreamProgress>{{10, 1.0}}) == Approx(1.475));
  // One already behind: no time at all (the budget then gives a granule of prefill).
  CHECK(*tpot_step_seconds(c, std::vector<StreamProgress>{{4, 2.0}}) < 0);
  CHECK_FALSE(tpot_step_seconds(c, {}));
  c.target_tpot_seconds = 0.0;
  CHECK_FALSE(tpot_step_seconds(c, streams));

  TokenBudget budget(config_150ms());
  budget.calibrate(FakeMachine{}.calibration());  // 10 ms + 2 ms a token
  // 1.475 s: (1475 - 10) / 2 = 732 tokens in all, 4 decodes and 720 of prefill.
  CHECK(budget.budget_within(4, 1.475) == 4 + 720);
  CHECK(budget.budget_within(4, -1.0) == 4 + 16);
  CHECK(budget.budget_within(4, 100.0) == 2048);
  CHECK(budget.step_budget(4, 1.475) == 4 + 720);
}

namespace {

// A small engine under a TPOT objective or without: requests of `prompt` tokens and
// `output` tokens arrive every `gap` seconds; each step carries every decode and as much of
// the queue's prompts as the budget allows, and takes what the machine says.
struct Served {
  double worst_tpot = 0.0, mean_ttft = 0.0;
};

Served serve_queue(TokenBudgetConfig config, const FakeMachine& machine, int num_requests,
                   double gap, std::int32_t prompt, std::int32_t output) {
  TokenBudget budget(config);
  budget.calibrate(machine.calibration());
  struct Request {
    double arrival = 0.0, first = -1.0, last = 0.0;
    std::int32_t prefilled = 0, generated = 0;
  };
  std::vector<Request> requests(static_cast<std::size_t>(num_requests));
  for (int i = 0; i < num_requests; ++i) requests[static_cast<std::size_t>(i)].arrival = i * gap;
  double now = 0.0;
  for (int step = 0; step < 100000; ++step) {
    std::vector<StreamProgress> streams;
    std::vector<Request*> decoding, queued;
    for (Request& r : requests) {
      if (r.arrival > now || r.generated >= output) continue;
      if (r.first >= 0) {
        decoding.push_back(&r);
        streams.push_back({r.generated - 1, now - r.first});
      } else {
        queued.push_back(&r);
      }
    }
    if (decoding.empty() && queued.empty()) {
      const auto next = std::find_if(requests.begin(), requests.end(),
                                     [&](const Request& r) { return r.arrival > now; });
      if (next == requests.end()) break;
      now = next->arrival;
      continue;
    }
    const auto d = static_cast<std::int32_t>(decoding.size());
    std::int32_t room = budget.step_budget(d, tpot_step_seconds(config, streams)) - d;
    std::vector<Request*> finishing;
    std::int32_t tokens = d;
    for (Request* r : queued) {
      const std::int32_t take = std::min(room, prompt - r->prefilled);
      if (take <= 0) break;
      r->prefilled += take;
      room -= take;
      tokens += take;
      if (r->prefilled == prompt) finishing.push_back(r);
    }
    const StepCost cost = machine.step(tokens, d);
    budget.observe(cost);
    now += cost.seconds;
    for (Request* r : decoding) {
      ++r->generated;
      r->last = now;
    }
    for (Request* r : finishing) {
      r->first = r->last = now;
      r->generated = 1;
    }
  }
  Served served;
  for (const Request& r : requests) {
    REQUIRE(r.generated == output);
    served.worst_tpot = std::max(served.worst_tpot, (r.last - r.first) / (output - 1));
    served.mean_ttft += (r.first - r.arrival) / num_requests;
  }
  return served;
}

}  // namespace

TEST_CASE("under a TPOT objective the streams keep it and the queue gets their slack",
          "[engine][token_budget][slo]") {
  // Issue 35's machine near saturation (100-token prompts every 0.15 s, 64 tokens each:
  // about 1100 tokens/s for a machine that runs 830 a second in long steps): twice the
  // decode step keeps steps short and lets the queue grow; the TPOT slack spends what the
  // streams can spare on prefill, and binds (TPOT near 0.9 x 0.25 s).
  TokenBudgetConfig sarathi = config_sarathi();
  TokenBudgetConfig slo = config_sarathi();
  slo.target_tpot_seconds = 0.250;
  const Served by_decode_step = serve_queue(sarathi, kIssueMachine, 80, 0.15, 100, 64);
  const Served by_slack = serve_queue(slo, kIssueMachine, 80, 0.15, 100, 64);
  INFO("twice the decode step: worst TPOT " << by_decode_step.worst_tpot << " s, mean TTFT "
                                            << by_decode_step.mean_ttft << " s");
  INFO("TPOT slack: worst TPOT " << by_slack.worst_tpot << " s, mean TTFT " << by_slack.mean_ttft
                                 << " s");
  // Every stream within the objective (probes included), and the queue served sooner.
  CHECK(by_slack.worst_tpot <= 0.250);
  CHECK(by_slack.mean_ttft < 0.5 * by_decode_step.mean_ttft);
}
