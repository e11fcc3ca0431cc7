#include "actors/worker_actor.hpp"

namespace troupe::actors {

worker_actor::behavior_type worker(worker_actor::stateful_pointer<WorkerState> self,
                                   std::function<void()> before_step) {
  self->state.before_step = std::move(before_step);
  return {
      [self](load_atom, const engine::WorkerSpec& spec) -> engine::LoadReport {
        auto& state = self->state;
        auto loaded = worker::Worker::load(spec);
        if (!loaded) {
          engine::LoadReport failed;
          failed.failed = true;
          failed.error = {loaded.error().code, loaded.error().message, true};
          return failed;
        }
        state.worker = std::move(*loaded);
        state.worker->set_before_step(state.before_step);
        return state.worker->report();
      },
      [self](step_atom, const engine::StepWork& work) -> engine::StepOutput {
        if (!self->state.worker) {
          return engine::failed_step(work.step_id,
                                     {ErrorCode::internal, "the worker has no model loaded", true});
        }
        return self->state.worker->step(work);
      },
  };
}

}  // namespace troupe::actors
