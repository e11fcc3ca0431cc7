#include "actors/worker_actor.hpp"

#include <chrono>
#include <cmath>
#include <future>
#include <memory>

#include "monitoring/log.hpp"

namespace troupe::actors {

namespace {

using Self = worker_actor::stateful_pointer<WorkerState>;

// The group's store, from a rank's thread: each call waits for the group actor's answer
// (the worker is detached, so this blocks no one else).
class ActorStore final : public model::RendezvousStore {
 public:
  ActorStore(caf::actor_system& system, rendezvous_actor store, std::chrono::milliseconds timeout)
      : system_(system), store_(std::move(store)), timeout_(timeout) {}

  Result<void> set(const std::string& key, const std::vector<char>& value) override {
    Result<void> result = make_error(ErrorCode::unavailable, "the group did not answer");
    caf::scoped_actor self{system_};
    self->request(store_, caf::duration{timeout_}, store_set_atom::value, key,
                  std::string(value.begin(), value.end()))
        .receive([&](bool) { result = {}; }, [&](const caf::error& e) { result = failure(e); });
    return result;
  }

  Result<std::vector<char>> get(const std::string& key,
                                std::chrono::milliseconds timeout) override {
    Result<std::vector<char>> result = make_error(ErrorCode::unavailable, "no answer");
    caf::scoped_actor self{system_};
    self->request(store_, caf::duration{timeout}, store_get_atom::value, key)
        .receive([&](const std::string& value) { result.emplace(value.begin(), value.end()); },
                 [&](const caf::error& e) { result = failure(e); });
    return result;
  }

 private:
  // A wait that ran out is for a rank that did not come (ErrorCode::timed_out: its group
  // blames that rank, not this one).
  tl::unexpected<Error> failure(const caf::error& e) const {
    return make_error(
        e == caf::sec::request_timeout ? ErrorCode::timed_out : ErrorCode::unavailable,
        "the group's rendezvous failed: " + system_.render(e));
  }

  caf::actor_system& system_;
  rendezvous_actor store_;
  std::chrono::milliseconds timeout_;
};

// Says how far a load is, once it has taken more than a moment: a line at each tenth
// after the first second, and how long it took.
model::LoadProgress load_progress(const engine::WorkerSpec& spec) {
  struct Said {
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    std::int32_t tenths = 0;
  };
  auto said = std::make_shared<Said>();
  return [said, path = spec.model_path, rank = spec.rank, ranks = spec.world_size](
             std::int32_t done, std::int32_t all) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - said->start).count();
    const std::int32_t tenths = all > 0 ? done * 10 / all : 10;
    if (seconds < 1.0 || tenths <= said->tenths) return;
    said->tenths = tenths;
    monitoring::log_info(done == all ? "weights loaded" : "loading weights",
                         {{"model", path},
                          {"percent", tenths * 10},
                          {"layers", done},
                          {"of", all},
                          {"rank", rank},
                          {"ranks", ranks},
                          {"seconds", std::round(seconds * 10.0) / 10.0}});
  };
}

engine::LoadReport load(Self self, const engine::WorkerSpec& spec, const worker::GroupLink* link) {
  auto& state = self->state;
  state.worker.reset();  // a second load replaces the first
  auto loaded = worker::Worker::load(spec, link, load_progress(spec));
  if (!loaded) {
    engine::LoadReport failed;
    failed.failed = true;
    failed.error = {loaded.error().code, loaded.error().message, true};
    return failed;
  }
  state.worker = std::move(*loaded);
  state.worker->set_before_step(state.before_step);
  return state.worker->report();
}

}  // namespace

worker_actor::behavior_type worker(Self self, std::function<void()> before_step,
                                   std::string collective_host) {
  self->state.before_step = std::move(before_step);
  self->state.collective_host = std::move(collective_host);
  return {
      [self](load_atom, const engine::WorkerSpec& spec) -> engine::LoadReport {
        return load(self, spec, nullptr);
      },
      [self](load_atom, const engine::WorkerSpec& spec,
             const GroupJoin& join) -> engine::LoadReport {
        ActorStore store(self->system(), join.store, std::chrono::milliseconds(join.timeout_ms));
        worker::GroupLink link;
        link.store = &store;
        link.prefix = join.prefix;
        link.host = self->state.collective_host;
        link.timeout = std::chrono::milliseconds(join.timeout_ms);
        return load(self, spec, &link);
      },
      [self](step_atom, const engine::StepWork& work) -> engine::StepOutput {
        if (!self->state.worker) {
          return engine::failed_step(work.step_id,
                                     {ErrorCode::internal, "the worker has no model loaded", true});
        }
        return self->state.worker->step(work);
      },
      [self](lora_atom, std::int32_t slot, const std::string& path) -> std::string {
        if (!self->state.worker) return "the worker has no model loaded";
        auto set = self->state.worker->set_adapter(slot, path);
        return set ? std::string() : set.error().message;
      },
  };
}

}  // namespace troupe::actors
