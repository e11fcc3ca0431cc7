// The worker actor: owns the backend, the model and the KV cache, and runs
// steps on its own thread (spawned detached: never on the actor system's threads).
#pragma once

#include <functional>
#include <memory>

#include "actors/messages.hpp"
#include "model/gguf_file.hpp"
#include "model/llama_model.hpp"
#include "model/model_runner.hpp"

namespace troupe::actors {

struct WorkerResources {
  std::shared_ptr<const model::GgufFile> file;  // the mapping the weights live in
  std::unique_ptr<model::Backend> backend;      // CPU or CUDA
  std::unique_ptr<model::LlamaModel> model;
  std::unique_ptr<model::ModelRunner> runner;
};

// Makes a fresh worker's resources (model loaded, KV cache allocated).
using WorkerFactory = std::function<Result<std::unique_ptr<WorkerResources>>()>;

struct WorkerState {
  std::unique_ptr<WorkerResources> resources;
  std::function<void()> before_step;
  static inline const char* name = "troupe.worker";
};

worker_actor::behavior_type worker(worker_actor::stateful_pointer<WorkerState> self,
                                   std::shared_ptr<std::unique_ptr<WorkerResources>> resources,
                                   std::function<void()> before_step);

}  // namespace troupe::actors
