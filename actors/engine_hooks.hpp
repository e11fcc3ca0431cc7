// Tests only: hooks into an engine's worker, kept out of the public EngineConfig.
// A test makes a step slow or makes it throw, to check cancellation, deadlines and
// that a failing step ends its requests with an error while the engine keeps serving.
#pragma once

#include <functional>

#include "troupe/engine.hpp"

namespace troupe {

struct EngineHooks {
  // Called by the worker before every step, on the worker's thread.
  std::function<void()> before_step;
};

}  // namespace troupe
