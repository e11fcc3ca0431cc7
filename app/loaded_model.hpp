// A model file opened for a command that runs it without an engine (bench forward):
// the one loader (model::LoadedModel) on a backend for the engine settings' device.
#pragma once

#include <string>

#include "model/loaded_model.hpp"
#include "troupe/engine.hpp"

namespace troupe::app {

// path empty: the built-in model. `device`: the engine's device settings (device,
// threads, graphs); `max_model_len`: the longest sequence a recorded step serves.
Result<model::LoadedModel> open_model(std::string path, const EngineConfig& device,
                                      std::int32_t max_model_len);

}  // namespace troupe::app
