#include "bench/cluster_sim.hpp"

#include "bench/latency.hpp"
#include "model/splitmix64.hpp"

#include <algorithm>
#include <boost/json/parse.hpp>
#include <cmath>
#include <functional>
#include <queue>
#include <random>
#include <sstream>

namespace troupe::bench {

Result<StepTimeModel> parse_step_time_model(std::string_view text) {
  StepTimeModel model;
  model.name = "from a file";
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && text[first] == '{') {
    boost::system::error_code ec;
    const boost::json::value json = boost::json::parse(text, ec);
    if (ec || !json.is_object()) {
      return make_error(ErrorCode::invalid_argument, "the step model is not a JSON object");
    }
    const auto& object = json.as_object();
    const std::pair<const char*, double*> fields[] = {
        {"a", &model.a}, {"b", &model.b}, {"c", &model.c}};
    for (auto [key, field] : fields) {
      const auto* value = object.if_contains(key);
      if (value == nullptr || !value->is_number()) {
        return make_error(ErrorCode::invalid_argument,
                          std::string("the step model has no number \"") + key + "\"");
      }
      *field = value->to_number<double>();
    }
    if (const auto* name = object.if_contains("name"); name && name->is_string()) {
      model.name = std::string(name->as_string());
    }
  } else {
    std::istringstream in{std::string(text)};
    if (!(in >> model.a >> model.b >> model.c)) {
      return make_error(ErrorCode::invalid_argument,
                        "the step model is neither \"a b c\" nor a JSON object");
    }
    std::string name;
    if (std::getline(in >> std::ws, name) && !name.empty()) model.name = name;
  }
  if (model.a < 0 || model.b < 0 || model.c < 0 || model.a + model.b + model.c <= 0) {
    return make_error(ErrorCode::invalid_argument,
                      "the step model's a, b and c must be non-negative, and not all zero");
  }
  return model;
}

std::optional<SimWorkload> parse_sim_workload(std::string_view name) {
  if (name == "multi-turn") return SimWorkload::multi_turn;
  if (name == "shared-prefix") return SimWorkload::shared_prefix;
  return std::nullopt;
}

std::string_view to_string(SimWorkload workload) {
  return workload == SimWorkload::multi_turn ? "multi-turn" : "shared-prefix";
}

namespace {

// ---- The workload: sessions of turns, drawn once from the seed ----

// Past the special and byte tokens of a Llama-2-sized vocabulary, as bench/workload draws.
constexpr TokenId kFirstToken = 259, kLastToken = 31999;

struct Turn {
  std::vector<TokenId> user;  // the new message: the prompt is the history, then this
  std::int32_t answer_len = 0;
  double think_s = 0.0;  // after the answer, until the next turn arrives
};

struct Session {
  double start_s = 0.0;
  std::int32_t prefix = -1;  // index of its shared prefix; -1: none
  std::uint64_t first_request = 0;
  std::vector<Turn> turns = {};  // request first_request + k is turn k
};

struct Workload {
  std::vector<std::vector<TokenId>> prefixes;
  std::vector<Session> sessions;
};

class Draw {
 public:
  explicit Draw(std::uint64_t seed) : rng_(seed) {}
  std::int32_t between(std::int32_t lo, std::int32_t hi) {
    return std::uniform_int_distribution<std::int32_t>(lo, hi)(rng_);
  }
  double exponential(double mean) {
    return mean > 0 ? std::exponential_distribution<double>(1.0 / mean)(rng_) : 0.0;
  }
  std::vector<TokenId> tokens(std::int32_t n) {
    std::vector<TokenId> out(static_cast<std::size_t>(n));
    for (TokenId& t : out) t = between(kFirstToken, kLastToken);
    return out;
  }

 private:
  std::mt19937_64 rng_;
};

Result<void> check_options(const ClusterSimOptions& o) {
  auto bad = [](const char* what) { return make_error(ErrorCode::invalid_argument, what); };
  const auto& m = o.multi_turn;
  const auto& s = o.shared_prefix;
  if (o.num_replicas < 1) return bad("the cluster needs at least one replica");
  if (o.num_requests < 1) return bad("the workload needs at least one request");
  if (!(o.rate > 0)) return bad("the arrival rate must be positive");
  if (o.replica.num_blocks < 1 || o.replica.block_size < 1 || o.replica.max_num_seqs < 1 ||
      o.replica.max_num_batched_tokens < 1 || o.replica.max_model_len < 2) {
    return bad(
        "a replica's blocks, block size, sequences, token budget and context must be positive");
  }
  if (m.system_prompt_len < 0 || m.min_turns < 1 || m.min_turns > m.max_turns ||
      m.min_user_len < 1 || m.min_user_len > m.max_user_len || m.min_answer_len < 1 ||
      m.min_answer_len > m.max_answer_len || !(m.mean_think_s >= 0)) {
    return bad("the multi-turn shape needs 1 <= min <= max for turns and lengths");
  }
  if (s.num_prefixes < 1 || s.prefix_len < 0 || s.min_suffix_len < 1 ||
      s.min_suffix_len > s.max_suffix_len || s.min_output_len < 1 ||
      s.min_output_len > s.max_output_len) {
    return bad("the shared-prefix shape needs prefixes and 1 <= min <= max for lengths");
  }
  return {};
}

// The most tokens one request may reach (prompt + answer): the context, and what one
// replica's blocks hold, so that every request ends on its max_tokens.
std::int32_t max_request_len(const ClusterSimOptions& o) {
  return std::min(o.replica.max_model_len, o.replica.num_blocks * o.replica.block_size);
}

Result<Workload> make_multi_turn(const ClusterSimOptions& o, Draw& draw) {
  const MultiTurnShape& m = o.multi_turn;
  Workload w;
  if (m.system_prompt_len > 0) w.prefixes.push_back(draw.tokens(m.system_prompt_len));
  const double mean_turns = (m.min_turns + m.max_turns) / 2.0;
  const std::int32_t cap = max_request_len(o);
  double t = 0.0;
  std::uint64_t num_requests = 0;
  while (num_requests < static_cast<std::uint64_t>(o.num_requests)) {
    t += draw.exponential(mean_turns / o.rate);
    Session s{.start_s = t, .prefix = m.system_prompt_len > 0 ? 0 : -1};
    s.first_request = num_requests;
    const std::int32_t num_turns = draw.between(m.min_turns, m.max_turns);
    std::int32_t history = m.system_prompt_len;
    for (std::int32_t k = 0; k < num_turns && num_requests < std::uint64_t(o.num_requests); ++k) {
      Turn turn{.user = draw.tokens(draw.between(m.min_user_len, m.max_user_len)),
                .answer_len = draw.between(m.min_answer_len, m.max_answer_len),
                .think_s = draw.exponential(m.mean_think_s)};
      // The chat has outgrown the context: the session ends here.
      const auto len = history + static_cast<std::int32_t>(turn.user.size()) + turn.answer_len;
      if (len > cap) break;
      history = len;
      s.turns.push_back(std::move(turn));
      ++num_requests;
    }
    if (s.turns.empty()) {
      return make_error(ErrorCode::out_of_range,
                        "a session's first turn does not fit a replica's context or blocks");
    }
    w.sessions.push_back(std::move(s));
  }
  return w;
}

Result<Workload> make_shared_prefix(const ClusterSimOptions& o, Draw& draw) {
  const SharedPrefixShape& s = o.shared_prefix;
  if (s.prefix_len + s.max_suffix_len + s.max_output_len > max_request_len(o)) {
    return make_error(ErrorCode::out_of_range,
                      "a shared-prefix request does not fit a replica's context or blocks");
  }
  Workload w;
  for (std::int32_t i = 0; i < s.num_prefixes; ++i) w.prefixes.push_back(draw.tokens(s.prefix_len));
  double t = 0.0;
  for (std::int32_t i = 0; i < o.num_requests; ++i) {
    t += draw.exponential(1.0 / o.rate);
    Session one{.start_s = t, .prefix = draw.between(0, s.num_prefixes - 1)};
    one.first_request = static_cast<std::uint64_t>(i);
    one.turns.push_back({.user = draw.tokens(draw.between(s.min_suffix_len, s.max_suffix_len)),
                         .answer_len = draw.between(s.min_output_len, s.max_output_len)});
    w.sessions.push_back(std::move(one));
  }
  return w;
}

Result<Workload> make_workload(const ClusterSimOptions& o) {
  TROUPE_TRY_VOID(check_options(o));
  Draw draw(o.seed);
  return o.workload == SimWorkload::multi_turn ? make_multi_turn(o, draw)
                                               : make_shared_prefix(o, draw);
}

// The token the fake model samples at `position` of a request's answer: a function of the
// request alone, so the next turn can repeat the answer and every policy sees the same text.
TokenId fake_token(std::uint64_t request, std::int32_t position) {
  const std::uint64_t z = model::splitmix64_mix(request * model::kSplitMix64Step +
                                                static_cast<std::uint64_t>(position) + 1);
  return kFirstToken + static_cast<TokenId>(z % std::uint64_t(kLastToken - kFirstToken + 1));
}

LatencyQuantiles quantiles(std::vector<double> v) {
  LatencyQuantiles q;
  if (v.empty()) return q;
  std::sort(v.begin(), v.end());
  return {nearest_rank(v, 0.50), nearest_rank(v, 0.90), nearest_rank(v, 0.99)};
}

// ---- The simulation: events on simulated time ----

struct Event {
  double t = 0.0;
  std::uint64_t order = 0;  // ties in time keep the order they were made in
  bool step_end = false;    // else an arrival
  std::uint32_t index = 0;  // the replica, or the session
  std::int32_t turn = 0;

  bool operator>(const Event& e) const { return t != e.t ? t > e.t : order > e.order; }
};

struct Replica {
  engine::Scheduler scheduler;
  engine::BatchPlan plan = {};  // of the step in flight
  bool busy = false;
  double busy_s = 0.0;
};

struct RequestState {
  std::uint32_t session = 0;
  double arrival_s = 0.0;
  double first_token_s = -1.0;
};

class Simulation {
 public:
  Simulation(const ClusterSimOptions& o, const Workload& w, const engine::SchedulerConfig& replica,
             std::int32_t num_replicas, RoutingPolicy policy, const StepTimeModel& model)
      : workload_(w), model_(model), router_([&] {
          engine::RouterConfig c = o.router;
          c.policy = policy;
          return c;
        }()) {
    replicas_.reserve(static_cast<std::size_t>(num_replicas));
    for (std::int32_t r = 0; r < num_replicas; ++r)
      replicas_.push_back({engine::Scheduler(replica)});
    views_.resize(replicas_.size());
    running_.assign(replicas_.size(), 0);
    result_.num_replicas = num_replicas;
    result_.requests_per_replica.assign(replicas_.size(), 0);
    history_.resize(w.sessions.size());
    std::size_t num_requests = 0;
    for (std::uint32_t s = 0; s < w.sessions.size(); ++s) {
      num_requests += w.sessions[s].turns.size();
      push({.t = w.sessions[s].start_s, .index = s});
    }
    times_.resize(num_requests);
  }

  Result<SimRunResult> run() {
    while (!events_.empty()) {
      const Event e = events_.top();
      events_.pop();
      advance_to(e.t);
      TROUPE_TRY_VOID(e.step_end ? end_step(e.index) : arrive(e.index, e.turn));
    }
    return finish();
  }

 private:
  void push(Event e) {
    e.order = next_order_++;
    events_.push(e);
  }

  // Accumulates the load imbalance of the interval that ends now.
  void advance_to(double t) {
    if (imbalance_stale_) {
      const std::int32_t max = *std::max_element(running_.begin(), running_.end());
      std::int64_t sum = 0;
      for (std::int32_t n : running_) sum += n;
      imbalance_ = sum == 0 ? 0.0 : max * static_cast<double>(running_.size()) / sum;
      imbalance_stale_ = false;
    }
    if (imbalance_ > 0) {
      imbalance_time_ += (t - now_) * imbalance_;
      running_time_ += t - now_;
    }
    now_ = t;
  }

  std::uint64_t request_id(std::uint32_t session, std::int32_t turn) const {
    return workload_.sessions[session].first_request + static_cast<std::uint64_t>(turn);
  }

  Result<void> arrive(std::uint32_t session, std::int32_t turn) {
    const Session& s = workload_.sessions[session];
    std::vector<TokenId>& history = history_[session];
    if (turn == 0 && s.prefix >= 0)
      history = workload_.prefixes[static_cast<std::size_t>(s.prefix)];
    const Turn& t = s.turns[static_cast<std::size_t>(turn)];
    history.insert(history.end(), t.user.begin(), t.user.end());

    // What the head knows of each replica for this prompt.
    for (std::size_t r = 0; r < replicas_.size(); ++r) {
      const engine::Scheduler& sched = replicas_[r].scheduler;
      views_[r] = {.up = true,
                   .num_waiting = static_cast<std::int32_t>(sched.num_waiting()),
                   .num_running = static_cast<std::int32_t>(sched.num_running()),
                   .kv_usage = sched.kv_cache().usage(),
                   .cached_prefix_tokens = sched.kv_cache().cached_prefix_tokens(history)};
    }
    const auto route = router_.pick(views_);
    if (!route) return make_error(ErrorCode::internal, "the router found no replica up");
    if (route->reason == engine::RouteReason::prefix_hit) ++result_.num_prefix_routes;
    ++result_.requests_per_replica[route->replica];

    const std::uint64_t id = request_id(session, turn);
    times_[id] = {.session = session, .arrival_s = now_};
    TROUPE_TRY_VOID(replicas_[route->replica].scheduler.add(
        {.id = id, .prompt = history, .max_tokens = t.answer_len}));
    start_step(route->replica);
    return {};
  }

  void start_step(std::size_t r) {
    Replica& replica = replicas_[r];
    if (replica.busy || !replica.scheduler.has_unfinished()) return;
    replica.plan = replica.scheduler.schedule();
    note_running(r);
    // A replica with work always plans some: with nothing running, every block is free
    // and any request fits (the workload is cut to fit one replica).
    TROUPE_ASSERT(!replica.plan.chunks.empty(), "a replica with work planned an empty step");
    const double d = model_.seconds(replica.plan.num_tokens,
                                    static_cast<std::int32_t>(replica.plan.chunks.size()));
    replica.busy = true;
    replica.busy_s += d;
    ++result_.num_steps;
    push({.t = now_ + d, .step_end = true, .index = static_cast<std::uint32_t>(r)});
  }

  Result<void> end_step(std::size_t r) {
    Replica& replica = replicas_[r];
    sampled_.clear();
    for (const engine::ScheduledChunk& chunk : replica.plan.chunks) {
      if (!chunk.samples) continue;
      const engine::Sequence* seq = replica.scheduler.find(chunk.id);
      TROUPE_ASSERT(seq != nullptr, "a planned sequence vanished during its step");
      RequestState& times = times_[chunk.id];
      if (times.first_token_s < 0) {
        times.first_token_s = now_;
        ttft_.push_back(now_ - times.arrival_s);
      }
      sampled_.push_back({fake_token(chunk.id, seq->num_generated())});
    }
    const auto finished = replica.scheduler.update(replica.plan, sampled_);
    replica.busy = false;
    note_running(r);
    for (const engine::FinishedSequence& f : finished) TROUPE_TRY_VOID(end_turn(f));
    start_step(r);
    return {};
  }

  // The answer is out: the session's history takes it, and its next turn is due.
  Result<void> end_turn(const engine::FinishedSequence& f) {
    if (f.reason != FinishReason::length) {
      return make_error(ErrorCode::internal, "a request ended on something but its length");
    }
    e2e_.push_back(now_ - times_[f.id].arrival_s);
    ++result_.num_finished;
    const std::uint32_t session = times_[f.id].session;
    const Session& s = workload_.sessions[session];
    const auto turn = static_cast<std::int32_t>(f.id - s.first_request);
    const Turn& t = s.turns[static_cast<std::size_t>(turn)];
    if (static_cast<std::size_t>(turn) + 1 == s.turns.size()) {
      history_[session] = {};  // the session is over
      return {};
    }
    std::vector<TokenId>& history = history_[session];
    for (std::int32_t i = 0; i < t.answer_len; ++i) history.push_back(fake_token(f.id, i));
    push({.t = now_ + t.think_s, .index = session, .turn = turn + 1});
    return {};
  }

  void note_running(std::size_t r) {
    running_[r] = static_cast<std::int32_t>(replicas_[r].scheduler.num_running());
    imbalance_stale_ = true;
  }

  Result<SimRunResult> finish() {
    for (std::size_t r = 0; r < replicas_.size(); ++r) {
      const engine::Scheduler& sched = replicas_[r].scheduler;
      if (auto ok = sched.check_invariants(); !ok) {
        return make_error(ErrorCode::internal,
                          "replica " + std::to_string(r) + ": " + ok.error().message);
      }
      const engine::PrefixCacheStats& stats = sched.kv_cache().prefix_stats();
      result_.num_queried_tokens += stats.num_queried_tokens;
      result_.num_hit_tokens += stats.num_hit_tokens;
      result_.num_preemptions += sched.num_preemptions();
      result_.final_kv_usage = std::max(result_.final_kv_usage, sched.kv_cache().usage());
    }
    if (result_.num_finished != static_cast<std::int32_t>(times_.size())) {
      return make_error(ErrorCode::internal, "the simulation ended with requests unfinished");
    }
    result_.ttft_s = quantiles(std::move(ttft_));
    result_.e2e_s = quantiles(std::move(e2e_));
    result_.duration_s = now_ - workload_.sessions.front().start_s;
    result_.load_imbalance = running_time_ > 0 ? imbalance_time_ / running_time_ : 0.0;
    double busy = 0.0;
    for (const Replica& replica : replicas_) busy += replica.busy_s;
    result_.mean_busy = result_.duration_s > 0
                            ? busy / (result_.duration_s * static_cast<double>(replicas_.size()))
                            : 0.0;
    return std::move(result_);
  }

  const Workload& workload_;
  StepTimeModel model_;
  engine::Router router_;
  std::vector<Replica> replicas_;
  std::vector<engine::ReplicaView> views_;      // scratch, one per replica
  std::vector<engine::SampledResult> sampled_;  // scratch, one per sampling chunk
  std::vector<std::vector<TokenId>> history_;   // per session: its conversation so far
  std::vector<RequestState> times_;             // per request id
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  std::uint64_t next_order_ = 0;
  double now_ = 0.0;
  std::vector<std::int32_t> running_;  // per replica, as of its last schedule or update
  bool imbalance_stale_ = false;
  double imbalance_ = 0.0;  // max / mean of running_ now; 0 while none runs
  double imbalance_time_ = 0.0, running_time_ = 0.0;
  std::vector<double> ttft_, e2e_;
  SimRunResult result_;
};

}  // namespace

Result<SimRunResult> simulate_cluster(const ClusterSimOptions& options, RoutingPolicy policy) {
  TROUPE_TRY(const Workload workload, make_workload(options));
  Simulation sim(options, workload, options.replica, options.num_replicas, policy,
                 options.step_model);
  TROUPE_TRY(SimRunResult result, sim.run());
  result.name = std::string(engine::to_string(policy));
  return result;
}

Result<SimRunResult> simulate_single_replica(const ClusterSimOptions& options) {
  TROUPE_TRY(const Workload workload, make_workload(options));
  const std::int32_t n = options.num_replicas;
  engine::SchedulerConfig whole = options.replica;
  whole.num_blocks *= n;
  whole.max_num_seqs *= n;
  whole.max_num_batched_tokens *= n;
  StepTimeModel model = options.step_model;
  model.b /= n;
  model.c /= n;
  Simulation sim(options, workload, whole, 1, RoutingPolicy::least_loaded, model);
  TROUPE_TRY(SimRunResult result, sim.run());
  result.name = "single replica";
  return result;
}

}  // namespace troupe::bench
