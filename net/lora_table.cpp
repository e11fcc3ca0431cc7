#include "net/lora_table.hpp"

#include <algorithm>

namespace troupe::net {

std::vector<LoraEntry> LoraTable::list() const {
  const std::lock_guard lock(mutex_);
  return entries_;
}

std::optional<LoraEntry> LoraTable::find(std::string_view name) const {
  const std::lock_guard lock(mutex_);
  for (const auto& e : entries_) {
    if (e.name == name) return e;
  }
  return std::nullopt;
}

void LoraTable::add(LoraEntry entry) {
  const std::lock_guard lock(mutex_);
  entries_.push_back(std::move(entry));
}

std::optional<LoraEntry> LoraTable::remove(std::string_view name) {
  const std::lock_guard lock(mutex_);
  const auto it = std::find_if(entries_.begin(), entries_.end(),
                               [name](const LoraEntry& e) { return e.name == name; });
  if (it == entries_.end()) return std::nullopt;
  LoraEntry out = std::move(*it);
  entries_.erase(it);
  return out;
}

bool LoraTable::hold(const std::string& name) {
  const std::lock_guard lock(mutex_);
  const bool taken = std::any_of(entries_.begin(), entries_.end(),
                                 [&name](const LoraEntry& e) { return e.name == name; });
  return !taken && held_.insert(name).second;
}

void LoraTable::let_go(const std::string& name) {
  const std::lock_guard lock(mutex_);
  held_.erase(name);
}

}  // namespace troupe::net
