// The engine's LoRA adapter slots (issue 33): which hold an adapter requests may name,
// and how many requests run with each. A slot is free for a run-time load once it holds
// none and the last request that ran with it has ended, so an adapter unloaded under
// running requests keeps its slot (and its weights on the workers) until they finish.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "troupe/result.hpp"

namespace troupe::actors {

class LoraSlots {
 public:
  // `num_slots` slots (1 .. num_slots), the first `num_loaded` holding their start-up
  // adapters.
  LoraSlots(std::int32_t num_slots, std::int32_t num_loaded);

  std::int32_t num_slots() const { return static_cast<std::int32_t>(slots_.size()); }
  // A request naming `slot` starts: refused unless the slot holds an adapter (0, the
  // base model, always may). Every acquire that succeeded is matched by one release.
  Result<void> acquire(std::int32_t slot);
  void release(std::int32_t slot);

  // A load takes a free slot (none: every slot holds an adapter or runs requests of an
  // unloaded one), and then either fills it or gives it back.
  Result<std::int32_t> reserve();
  void fill(std::int32_t slot);
  void give_back(std::int32_t slot);

  // An unload: requests may no longer name the slot. Whether it is idle already (no
  // request runs with it): then it is reserved for the caller to empty, who gives it back.
  Result<bool> unload(std::int32_t slot);

 private:
  struct Slot {
    bool loaded = false;    // requests may name it
    bool reserved = false;  // a load or an unload's emptying is under way
    std::int64_t running = 0;
  };
  std::mutex mutex_;
  std::vector<Slot> slots_;  // slot s at s - 1
};

}  // namespace troupe::actors
