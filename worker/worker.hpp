// A worker: one model on one device with its KV cache, running the engine's steps.
// It speaks only the worker protocol (engine/worker_protocol.hpp): a spec in, a load
// report out; a step's work in, its output out. The worker actor is a thin shell
// around it; the tests' BatchGenerator and the GPU benchmark drive one directly.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "engine/worker_protocol.hpp"
#include "model/draft_proposer.hpp"
#include "model/loaded_model.hpp"
#include "model/model_runner.hpp"
#include "worker/backend_factory.hpp"

namespace troupe::worker {

// One step on a runner: samplers for new sequences, the draft model's proposals (with
// `draft`), the forward pass, sampling. On a rank of a tensor-parallel `group`, rank 0
// alone has the draft model: the others take its proposals over the group. On a stage of
// a `pipe`line, stage 0 alone has it (it embeds the tokens) and sends its proposals to the
// last stage (which verifies them); the stages between need only the hidden states. Errors
// are in the output; an exception is not caught here.
engine::StepOutput run_step(model::ModelRunner& runner, const engine::StepWork& work,
                            model::DraftProposer* draft = nullptr,
                            model::Communicator* group = nullptr,
                            model::Communicator* pipe = nullptr);

class Worker {
 public:
  // Opens the model on the spec's device, checks it is the engine's file, prepares
  // activations for the spec's batch limits and sizes and allocates the KV cache. A rank
  // of a tensor-parallel group (spec.world_size > 1) joins the others through `link`
  // and loads its shard.
  // `progress` hears of each layer's weights as they load.
  static Result<std::unique_ptr<Worker>> load(const engine::WorkerSpec& spec,
                                              const GroupLink* link = nullptr,
                                              const model::LoadProgress& progress = {});

  const engine::LoadReport& report() const { return report_; }
  // Runs one step. A failure is in the output; one that loses the worker's state (an
  // exception, or any failure of a rank of a group, whose ranks may now be out of step)
  // is marked fatal, and the worker must be replaced.
  engine::StepOutput step(const engine::StepWork& work);

  // Puts the LoRA adapter at `path` (read here, checked against the model, this rank's
  // part kept) in slot `slot`, replacing what it held; an empty path empties the slot.
  // On an error the slot is as it was.
  Result<void> set_adapter(std::int32_t slot, const std::string& path);

  // Tests only: called before every step (one that throws fails it as an exception would).
  void set_before_step(std::function<void()> hook) { before_step_ = std::move(hook); }

 private:
  Worker() = default;

  // Loads spec.draft_model_path beside the model: the same vocabulary, device and threads.
  Result<void> load_draft(const engine::WorkerSpec& spec);

  model::LoadedModel model_;
  std::unique_ptr<model::ModelRunner> runner_;
  model::LoadedModel draft_;  // speculative decoding's draft model, when the spec names one
  std::unique_ptr<model::DraftProposer> proposer_;
  engine::LoadReport report_;
  Device device_ = Device::cpu;
  std::function<void()> before_step_;
  // Why a rank of a group (or a pipeline's stage) failed a step: its communicators may be
  // out of step with the others' (a send the peer never receives, a receive of another
  // step's message), so it fails every later step without touching them, until it is
  // replaced.
  std::optional<std::string> out_of_step_;
};

}  // namespace troupe::worker
