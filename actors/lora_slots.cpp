#include "actors/lora_slots.hpp"

#include <algorithm>
#include <string>

namespace troupe::actors {

LoraSlots::LoraSlots(std::int32_t num_slots, std::int32_t num_loaded)
    : slots_(static_cast<std::size_t>(std::max(num_slots, num_loaded))) {
  for (std::int32_t i = 0; i < num_loaded; ++i) slots_[static_cast<std::size_t>(i)].loaded = true;
}

Result<void> LoraSlots::acquire(std::int32_t slot) {
  if (slot == 0) return {};
  const std::lock_guard lock(mutex_);
  if (slot < 0 || slot > num_slots() || !slots_[static_cast<std::size_t>(slot - 1)].loaded) {
    return make_error(ErrorCode::invalid_argument, "LoRA adapter slot " + std::to_string(slot) +
                                                       " holds no adapter (" +
                                                       std::to_string(num_slots()) + " slots)");
  }
  ++slots_[static_cast<std::size_t>(slot - 1)].running;
  return {};
}

void LoraSlots::release(std::int32_t slot) {
  if (slot <= 0) return;
  const std::lock_guard lock(mutex_);
  if (slot <= num_slots()) --slots_[static_cast<std::size_t>(slot - 1)].running;
}

Result<std::int32_t> LoraSlots::reserve() {
  const std::lock_guard lock(mutex_);
  std::int32_t draining = 0;
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.loaded || s.reserved) continue;
    if (s.running > 0) {
      ++draining;
      continue;
    }
    s.reserved = true;
    return static_cast<std::int32_t>(i + 1);
  }
  std::string why = "no free LoRA adapter slot: all " + std::to_string(num_slots()) +
                    " (--max-loras) hold an adapter";
  if (draining > 0) {
    why += " or run requests of an unloaded one (" + std::to_string(draining) +
           " free once they finish)";
  }
  return make_error(ErrorCode::out_of_range, why);
}

void LoraSlots::fill(std::int32_t slot) {
  const std::lock_guard lock(mutex_);
  Slot& s = slots_[static_cast<std::size_t>(slot - 1)];
  s.reserved = false;
  s.loaded = true;
}

void LoraSlots::give_back(std::int32_t slot) {
  const std::lock_guard lock(mutex_);
  slots_[static_cast<std::size_t>(slot - 1)].reserved = false;
}

Result<bool> LoraSlots::unload(std::int32_t slot) {
  const std::lock_guard lock(mutex_);
  if (slot < 1 || slot > num_slots() || !slots_[static_cast<std::size_t>(slot - 1)].loaded) {
    return make_error(ErrorCode::invalid_argument,
                      "LoRA adapter slot " + std::to_string(slot) + " holds no adapter");
  }
  Slot& s = slots_[static_cast<std::size_t>(slot - 1)];
  s.loaded = false;
  if (s.running > 0) return false;
  s.reserved = true;
  return true;
}

}  // namespace troupe::actors
