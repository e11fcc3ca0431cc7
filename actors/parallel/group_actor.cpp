#include "actors/parallel/group_actor.hpp"

#include <algorithm>
#include <memory>

#include "actors/worker_actor.hpp"

namespace troupe::actors::parallel {

namespace {

using Self = group_actor::stateful_pointer<GroupState>;

std::string rank_name(Self self, std::size_t rank) {
  const auto& state = self->state;
  const auto& nodes = state.nodes;
  const auto per_stage = static_cast<std::size_t>(state.stage_ranks);
  std::string name = "rank " + std::to_string(rank);
  if (state.pipeline) {
    name = "stage " + std::to_string(rank / per_stage);
    if (per_stage > 1) name += " rank " + std::to_string(rank % per_stage);
  }
  if (rank < nodes.size() && !nodes[rank].empty()) name += " (node " + nodes[rank] + ")";
  return name;
}

// A rank's failed load, as the group reports it.
engine::LoadReport failed_load(Self self, std::size_t rank, engine::LoadReport report) {
  report.failed = true;
  report.error.message = rank_name(self, rank) + ": " + report.error.message;
  report.error.fatal = true;
  report.failed_rank = static_cast<std::int32_t>(rank);
  return report;
}

// A rank's failed step, as the group reports it: fatal (the ranks may be out of step).
engine::StepOutput failed_step_of(Self self, std::size_t rank, engine::StepOutput output) {
  output.failed = true;
  output.error.message = rank_name(self, rank) + ": " + output.error.message;
  output.error.fatal = true;
  return output;
}

// The group's load report once every rank loaded: the fewest KV blocks any rank holds
// (the block tables are the same on every rank, and every pipeline stage).
engine::LoadReport combine_loads(const std::vector<engine::LoadReport>& reports,
                                 std::int32_t stage_ranks) {
  engine::LoadReport report = reports.front();
  report.bytes_per_block = 0;
  report.weight_bytes = 0;
  report.parts.clear();
  for (const auto& r : reports) {
    report.parts.insert(report.parts.end(), r.parts.begin(), r.parts.end());
    report.num_kv_blocks = std::min(report.num_kv_blocks, r.num_kv_blocks);
    report.bytes_per_block += r.bytes_per_block;
    report.weight_bytes += r.weight_bytes;
  }
  const std::size_t stages = reports.size() / static_cast<std::size_t>(stage_ranks);
  if (stage_ranks > 1) {
    report.device_name =
        std::to_string(stage_ranks) + " tensor-parallel ranks of " + report.device_name;
  }
  if (stages > 1) {
    report.device_name = std::to_string(stages) + " pipeline stages of " + report.device_name;
  }
  return report;
}

// The group's step output once every rank is done: the tokens of the last stage's rank 0
// (the one that samples; rank 0 of a group that is no pipeline).
engine::StepOutput combine_steps(const std::vector<engine::StepOutput>& outputs,
                                 std::int32_t stage_ranks) {
  const auto per_stage = static_cast<std::size_t>(stage_ranks);
  double seconds = 0.0;
  std::vector<double> hops;  // each later stage's hop (its rank 0's), in stage order
  for (std::size_t w = 0; w < outputs.size(); ++w) {
    const auto& o = outputs[w];
    seconds = std::max(seconds, o.seconds);
    if (w % per_stage == 0) hops.insert(hops.end(), o.hop_seconds.begin(), o.hop_seconds.end());
  }
  engine::StepOutput out = outputs[outputs.size() - per_stage];
  out.seconds = seconds;
  out.hop_seconds = std::move(hops);
  return out;
}

// Every rank has answered: the group's report, or the failure a rank waited on.
void settle_load(Self self, Loading& loading) {
  loading.answered = true;
  if (loading.waited) {
    auto& [rank, report] = *loading.waited;
    loading.promise.deliver(failed_load(self, rank, std::move(report)));
    return;
  }
  loading.promise.deliver(combine_loads(loading.answers, self->state.stage_ranks));
}

// A load's rank answered (or failed to).
void rank_loaded(Self self, Loading& loading, std::size_t r, engine::LoadReport report) {
  if (loading.answered || loading.answered_ranks[r]) return;
  loading.answered_ranks[r] = true;
  --loading.pending;
  if (report.failed && report.error.code != ErrorCode::timed_out) {
    loading.answered = true;
    loading.promise.deliver(failed_load(self, r, std::move(report)));
    return;
  }
  if (report.failed && !loading.waited) {
    loading.waited.emplace(r, std::move(report));
    if (loading.pending > 0) {
      self->delayed_send(self, self->state.collective_timeout, blame_atom::value, loading.number);
    }
  } else if (!report.failed) {
    loading.answers[r] = std::move(report);
  }
  if (loading.pending == 0) settle_load(self, loading);
}

// A collective timeout after a rank failed waiting for the others: the first rank still
// silent is the one it waited for.
void blame_silent_rank(Self self, std::uint64_t number) {
  auto& loading = self->state.loading;
  if (!loading || loading->number != number || loading->answered || !loading->waited) return;
  for (std::size_t r = 0; r < loading->answered_ranks.size(); ++r) {
    if (loading->answered_ranks[r]) continue;
    const auto& [waiting_rank, waited] = *loading->waited;
    engine::LoadReport failed;
    failed.error = {ErrorCode::unavailable,
                    "it did not join its group within " +
                        std::to_string(self->state.collective_timeout.count()) + " ms (" +
                        rank_name(self, waiting_rank) + " gave up on it: " + waited.error.message +
                        ")",
                    true};
    loading->answered = true;
    loading->promise.deliver(failed_load(self, r, std::move(failed)));
    return;
  }
}

caf::result<engine::LoadReport> load_ranks(Self self, engine::WorkerSpec spec) {
  auto& state = self->state;
  const auto size = static_cast<std::int32_t>(state.ranks.size());
  auto gathering = std::make_shared<Loading>();
  gathering->number = ++state.num_loads;
  gathering->answers.resize(state.ranks.size());
  gathering->answered_ranks.assign(state.ranks.size(), false);
  gathering->pending = state.ranks.size();
  gathering->promise = self->make_response_promise<engine::LoadReport>();
  state.loading = gathering;
  // The replica's KV budget is shared: each rank holds its heads' part of every block (a
  // pipeline stage its layers').
  if (spec.num_kv_blocks <= 0)
    spec.kv_cache_bytes = std::max<std::int64_t>(1, spec.kv_cache_bytes / size);
  // A pipeline's stages are the group's ranks, stage by stage: worker w is rank w % T of
  // stage w / T, where each stage is a tensor-parallel group of T = size / stages ranks
  // (T = 1: each stage a whole, unsplit worker of its layers).
  state.pipeline = spec.pipeline_size > 1;
  state.stage_ranks = state.pipeline ? size / spec.pipeline_size : size;
  if (state.pipeline && (size % spec.pipeline_size != 0 || state.stage_ranks < 1)) {
    engine::LoadReport failed;
    failed.failed = true;
    failed.error = {ErrorCode::invalid_argument,
                    "a pipeline of " + std::to_string(spec.pipeline_size) +
                        " stages cannot run on a group of " + std::to_string(size) + " workers",
                    true};
    gathering->answered = true;
    gathering->promise.deliver(failed);
    return gathering->promise;
  }
  const GroupJoin join{caf::actor_cast<rendezvous_actor>(self), "tp",
                       static_cast<std::int64_t>(state.collective_timeout.count())};
  auto done = [self, gathering](std::size_t r, engine::LoadReport report) {
    rank_loaded(self, *gathering, r, std::move(report));
  };
  for (std::size_t r = 0; r < state.ranks.size(); ++r) {
    engine::WorkerSpec rank_spec = spec;
    const auto w = static_cast<std::int32_t>(r);
    if (state.pipeline) rank_spec.pipeline_stage = w / state.stage_ranks;
    if (state.stage_ranks > 1) {
      rank_spec.rank = w % state.stage_ranks;
      rank_spec.world_size = state.stage_ranks;
    }
    // A GPU each: NCCL refuses two ranks of a group on one device. (A node sets its own
    // ranks' GPUs again from what it has.)
    if (spec.device == Device::cuda) rank_spec.device_index = static_cast<std::int32_t>(r);
    self->request(state.ranks[r], kLoadTimeout, load_atom::value, rank_spec, join)
        .then([done, r](engine::LoadReport& report) { done(r, std::move(report)); },
              [self, done, r](const caf::error& e) {
                // Silent past the load timeout: this rank is the cause, whatever others say.
                engine::LoadReport failed;
                failed.failed = true;
                failed.error = {ErrorCode::internal, "it did not load: " + self->system().render(e),
                                true};
                done(r, std::move(failed));
              });
  }
  return gathering->promise;
}

caf::result<engine::StepOutput> step_ranks(Self self, const engine::StepWork& work) {
  auto& state = self->state;
  const std::uint64_t step_id = work.step_id;
  auto gathering = std::make_shared<Gathering<engine::StepOutput>>();
  gathering->answers.resize(state.ranks.size());
  gathering->pending = state.ranks.size();
  gathering->promise = self->make_response_promise<engine::StepOutput>();
  state.stepping[step_id] = gathering;
  auto done = [self, gathering, step_id](std::size_t r, engine::StepOutput output) {
    if (gathering->answered) return;
    if (output.failed) {
      gathering->answered = true;
      self->state.stepping.erase(step_id);
      gathering->promise.deliver(failed_step_of(self, r, std::move(output)));
      return;
    }
    gathering->answers[r] = std::move(output);
    if (--gathering->pending == 0) {
      gathering->answered = true;
      self->state.stepping.erase(step_id);
      gathering->promise.deliver(combine_steps(gathering->answers, self->state.stage_ranks));
    }
  };
  // No timeout here: a rank that hangs fails the others' collectives within theirs (the
  // first failure is answered at once), and the scheduler's step timeout bounds the whole.
  for (std::size_t r = 0; r < state.ranks.size(); ++r) {
    self->request(state.ranks[r], caf::infinite, step_atom::value, work)
        .then([done, r](engine::StepOutput& output) { done(r, std::move(output)); },
              [self, done, r, step_id](const caf::error& e) {
                done(r, engine::failed_step(step_id,
                                            {ErrorCode::unavailable,
                                             "it stopped: " + self->system().render(e), true}));
              });
  }
  return gathering->promise;
}

// A LoRA adapter on every rank, each cutting its part (LlamaModel::set_adapter): the
// first rank's failure, by its name, or "" once all hold it. A failure may leave the
// others holding it; whoever asked empties the slot again.
caf::result<std::string> lora_ranks(Self self, std::int32_t slot, const std::string& path) {
  struct Gathered {
    caf::typed_response_promise<std::string> promise;
    std::size_t pending = 0;
    std::string error;
  };
  auto g = std::make_shared<Gathered>();
  g->promise = self->make_response_promise<std::string>();
  g->pending = self->state.ranks.size();
  auto done = [self, g](std::size_t r, const std::string& error) {
    if (!error.empty() && g->error.empty()) g->error = rank_name(self, r) + ": " + error;
    if (--g->pending == 0) g->promise.deliver(g->error);
  };
  for (std::size_t r = 0; r < self->state.ranks.size(); ++r) {
    self->request(self->state.ranks[r], kLoadTimeout, lora_atom::value, slot, path)
        .then([done, r](const std::string& error) { done(r, error); },
              [self, done, r](const caf::error& e) {
                done(r, "it did not answer: " + self->system().render(e));
              });
  }
  return g->promise;
}

// Rank `r` is gone: what waits on the group hears it (CAF 0.17 would leave a promise of
// an actor that quits unanswered), and the group ends.
void lose_rank(Self self, std::size_t r, const std::string& why) {
  auto& state = self->state;
  const std::string message = "it is gone (" + why + ")";
  if (state.loading && !state.loading->answered) {
    state.loading->answered = true;
    engine::LoadReport failed;
    failed.error = {ErrorCode::unavailable, message, true};
    state.loading->promise.deliver(failed_load(self, r, std::move(failed)));
  }
  for (auto& [step_id, gathering] : state.stepping) {
    if (gathering->answered) continue;
    gathering->answered = true;
    gathering->promise.deliver(failed_step_of(
        self, r, engine::failed_step(step_id, {ErrorCode::unavailable, message, true})));
  }
  state.stepping.clear();
  self->quit(caf::make_error(
      caf::sec::runtime_error,
      rank_name(self, r) +
          (self->state.pipeline ? " of the pipeline " : " of the tensor-parallel group ") +
          message));
}

// Only the group's own ranks (their processes) use its store.
bool from_a_rank(Self self) {
  const auto& sender = self->current_sender();
  if (sender == nullptr) return false;
  for (const auto& rank : self->state.ranks) {
    if (rank.node() == sender->node()) return true;
  }
  return false;
}

}  // namespace

group_actor::behavior_type group(Self self, std::vector<worker_actor> ranks,
                                 std::vector<std::string> nodes,
                                 std::chrono::milliseconds collective_timeout) {
  auto& state = self->state;
  state.ranks = std::move(ranks);
  state.nodes = std::move(nodes);
  state.collective_timeout = collective_timeout;
  for (const auto& rank : state.ranks) self->monitor(rank);
  // However the group ends, its ranks end with it.
  self->attach_functor([ranks = state.ranks] {
    for (const auto& rank : ranks) caf::anon_send_exit(rank, caf::exit_reason::kill);
  });
  self->set_down_handler([self](const caf::down_msg& down) {
    const auto& ranks = self->state.ranks;
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      if (ranks[r].address() == down.source) {
        return lose_rank(self, r, self->system().render(down.reason));
      }
    }
  });
  return {
      [self](load_atom, const engine::WorkerSpec& spec) { return load_ranks(self, spec); },
      [](load_atom, const engine::WorkerSpec&, const GroupJoin&) {
        engine::LoadReport failed;
        failed.failed = true;
        failed.error = {ErrorCode::unsupported, "a group is not a rank of another group", true};
        return failed;
      },
      [self](step_atom, const engine::StepWork& work) { return step_ranks(self, work); },
      [self](lora_atom, std::int32_t slot, const std::string& path) {
        return lora_ranks(self, slot, path);
      },
      [self](blame_atom, std::uint64_t number) {
        if (self->current_sender() != self->ctrl()) return;  // its own timer only
        blame_silent_rank(self, number);
      },
      [self](store_set_atom, const std::string& key, const std::string& value) {
        if (!from_a_rank(self)) return false;
        auto& state = self->state;
        state.store.insert_or_assign(key, value);
        auto [first, last] = state.waiting.equal_range(key);
        for (auto it = first; it != last; ++it) it->second.deliver(value);
        state.waiting.erase(first, last);
        return true;
      },
      [self](store_get_atom, const std::string& key) -> caf::result<std::string> {
        if (!from_a_rank(self)) return caf::sec::request_receiver_down;
        auto& state = self->state;
        if (auto it = state.store.find(key); it != state.store.end()) return it->second;
        auto promise = self->make_response_promise<std::string>();
        state.waiting.emplace(key, promise);
        return promise;
      },
  };
}

worker_actor spawn_local_worker(caf::actor_system& system, std::int32_t world_size,
                                const std::function<void()>& before_step,
                                std::chrono::milliseconds collective_timeout) {
  if (world_size <= 1) {
    return system.spawn<caf::detached>(worker, before_step, std::string("127.0.0.1"));
  }
  std::vector<worker_actor> ranks;
  for (std::int32_t r = 0; r < world_size; ++r) {
    ranks.push_back(system.spawn<caf::detached>(worker, before_step, std::string("127.0.0.1")));
  }
  return system.spawn(group, std::move(ranks),
                      std::vector<std::string>(static_cast<std::size_t>(world_size)),
                      collective_timeout);
}

worker_actor worker_for(caf::actor_system& system, cluster::Placement placed,
                        std::chrono::milliseconds collective_timeout) {
  if (placed.workers.size() == 1) return std::move(placed.workers.front());
  return system.spawn(group, std::move(placed.workers), std::move(placed.nodes),
                      collective_timeout);
}

}  // namespace troupe::actors::parallel
