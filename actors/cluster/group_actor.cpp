#include "actors/cluster/group_actor.hpp"

#include <algorithm>
#include <memory>

#include "actors/worker_actor.hpp"

namespace troupe::actors::cluster {

namespace {

using Self = group_actor::stateful_pointer<GroupState>;

// Every rank's answer to one request, and who is waiting for all of them.
template <typename Answer>
struct Gathering {
  std::vector<Answer> answers;
  std::size_t pending = 0;
  caf::typed_response_promise<Answer> promise;
};

std::string rank_name(Self self, std::size_t rank) {
  const auto& nodes = self->state.nodes;
  std::string name = "rank " + std::to_string(rank);
  if (rank < nodes.size() && !nodes[rank].empty()) name += " (node " + nodes[rank] + ")";
  return name;
}

// The group's load report: the first failure, or what every rank holds (the fewest KV
// blocks: the block tables are the same on every rank).
engine::LoadReport combine_loads(Self self, const std::vector<engine::LoadReport>& reports) {
  for (std::size_t r = 0; r < reports.size(); ++r) {
    if (!reports[r].failed) continue;
    engine::LoadReport failed = reports[r];
    failed.error.message = rank_name(self, r) + ": " + failed.error.message;
    failed.failed_rank = static_cast<std::int32_t>(r);
    return failed;
  }
  engine::LoadReport report = reports.front();
  report.bytes_per_block = 0;
  for (const auto& r : reports) {
    report.num_kv_blocks = std::min(report.num_kv_blocks, r.num_kv_blocks);
    report.bytes_per_block += r.bytes_per_block;
  }
  report.device_name =
      std::to_string(reports.size()) + " tensor-parallel ranks of " + report.device_name;
  return report;
}

// The group's step output: rank 0's tokens, once every rank is done; any rank's failure
// is fatal (the ranks may now be out of step).
engine::StepOutput combine_steps(Self self, const std::vector<engine::StepOutput>& outputs) {
  double seconds = 0.0;
  for (const auto& o : outputs) seconds = std::max(seconds, o.seconds);
  for (std::size_t r = 0; r < outputs.size(); ++r) {
    if (!outputs[r].failed) continue;
    engine::StepOutput failed = outputs[r];
    failed.error.message = rank_name(self, r) + ": " + failed.error.message;
    failed.error.fatal = true;
    failed.seconds = seconds;
    return failed;
  }
  engine::StepOutput out = outputs.front();
  out.seconds = seconds;
  return out;
}

caf::result<engine::LoadReport> load_ranks(Self self, const engine::WorkerSpec& spec) {
  auto& state = self->state;
  auto gathering = std::make_shared<Gathering<engine::LoadReport>>();
  gathering->answers.resize(state.ranks.size());
  gathering->pending = state.ranks.size();
  gathering->promise = self->make_response_promise<engine::LoadReport>();
  const GroupJoin join{caf::actor_cast<rendezvous_actor>(self), "tp",
                       static_cast<std::int64_t>(state.collective_timeout.count())};
  auto done = [self, gathering](std::size_t r, engine::LoadReport report) {
    gathering->answers[r] = std::move(report);
    if (--gathering->pending == 0) {
      gathering->promise.deliver(combine_loads(self, gathering->answers));
    }
  };
  for (std::size_t r = 0; r < state.ranks.size(); ++r) {
    engine::WorkerSpec rank_spec = spec;
    rank_spec.rank = static_cast<std::int32_t>(r);
    rank_spec.world_size = static_cast<std::int32_t>(state.ranks.size());
    self->request(state.ranks[r], std::chrono::minutes(10), load_atom::value, rank_spec, join)
        .then([done, r](engine::LoadReport& report) { done(r, std::move(report)); },
              [self, done, r](const caf::error& e) {
                engine::LoadReport failed;
                failed.failed = true;
                failed.error = {ErrorCode::unavailable,
                                "it did not load: " + self->system().render(e), true};
                done(r, std::move(failed));
              });
  }
  return gathering->promise;
}

caf::result<engine::StepOutput> step_ranks(Self self, const engine::StepWork& work) {
  auto& state = self->state;
  auto gathering = std::make_shared<Gathering<engine::StepOutput>>();
  gathering->answers.resize(state.ranks.size());
  gathering->pending = state.ranks.size();
  gathering->promise = self->make_response_promise<engine::StepOutput>();
  auto done = [self, gathering](std::size_t r, engine::StepOutput output) {
    gathering->answers[r] = std::move(output);
    if (--gathering->pending == 0) {
      gathering->promise.deliver(combine_steps(self, gathering->answers));
    }
  };
  const std::uint64_t step_id = work.step_id;
  // No timeout here: a rank that hangs fails the others' collectives within theirs, and
  // the scheduler's step timeout bounds the whole.
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
      if (ranks[r].address() != down.source) continue;
      self->quit(caf::make_error(caf::sec::runtime_error,
                                 rank_name(self, r) + " of the tensor-parallel group is gone (" +
                                     self->system().render(down.reason) + ")"));
      return;
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
      [self](store_set_atom, const std::string& key, const std::string& value) {
        auto& state = self->state;
        state.store.insert_or_assign(key, value);
        auto [first, last] = state.waiting.equal_range(key);
        for (auto it = first; it != last; ++it) it->second.deliver(value);
        state.waiting.erase(first, last);
        return true;
      },
      [self](store_get_atom, const std::string& key) -> caf::result<std::string> {
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

}  // namespace troupe::actors::cluster
