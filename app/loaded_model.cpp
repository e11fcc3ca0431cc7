#include "app/loaded_model.hpp"

#include "app/commands.hpp"
#include "worker/backend_factory.hpp"

namespace troupe::app {

Result<model::LoadedModel> open_model(std::string path, const EngineConfig& device,
                                      std::int32_t max_model_len) {
  if (path.empty()) {
    path = builtin_model_path();
    if (path.empty()) return make_error(ErrorCode::io, "the built-in model could not be written");
  }
  return worker::open_model(worker::spec_for(device, std::move(path), max_model_len));
}

}  // namespace troupe::app
