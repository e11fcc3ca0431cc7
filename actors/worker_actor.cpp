#include "actors/worker_actor.hpp"

#include <chrono>
#include <exception>

namespace troupe::actors {

namespace {

// One step: samplers for new sequences, the forward pass, sampling.
void run_step(WorkerState& state, const StepWork& work, StepOutput& out) {
  model::ModelRunner& runner = *state.resources->runner;
  for (std::uint64_t id : work.removed) runner.remove_sequence(id);
  for (const auto& s : work.new_sequences) {
    if (auto added = runner.add_sequence(s.id, s.params, s.prompt); !added) {
      out.error = added.error().message;
      return;
    }
  }
  if (state.before_step) state.before_step();
  auto results = runner.execute(work.step, work.sampled_ids);
  if (!results) {
    out.error = results.error().message;
    return;
  }
  out.results = std::move(*results);
}

}  // namespace

worker_actor::behavior_type worker(worker_actor::stateful_pointer<WorkerState> self,
                                   std::shared_ptr<std::unique_ptr<WorkerResources>> resources,
                                   std::function<void()> before_step) {
  self->state.resources = std::move(*resources);
  self->state.before_step = std::move(before_step);
  return {
      [self](step_atom, const StepWorkPtr& work) -> StepOutputPtr {
        auto out = std::make_shared<StepOutput>();
        const auto start = std::chrono::steady_clock::now();
        // No exception may escape a handler: a throwing step becomes an error reply,
        // and the scheduler replaces this worker.
        try {
          run_step(self->state, *work, *out);
        } catch (const std::exception& e) {
          out->error = std::string("the step failed: ") + e.what();
          out->worker_broken = true;
        } catch (...) {
          out->error = "the step failed with an unknown exception";
          out->worker_broken = true;
        }
        out->seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        return out;
      },
  };
}

}  // namespace troupe::actors
