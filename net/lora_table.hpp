// The LoRA adapters a server answers to by name (issue 33): those given at start
// (--lora-modules) and those loaded and unloaded at run time (POST /v1/load_lora_adapter,
// /v1/unload_lora_adapter). Shared by the server's threads, so every call locks.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::net {

struct LoraEntry {
  std::string name;       // the API name: a request's `model`
  std::string path;       // the adapter file (/v1/models' root)
  std::int32_t slot = 0;  // GenerateRequest::lora_adapter
};

class LoraTable {
 public:
  LoraTable() = default;
  LoraTable(const LoraTable&) = delete;
  LoraTable& operator=(const LoraTable&) = delete;

  // Every adapter, in the order they came.
  std::vector<LoraEntry> list() const;
  std::optional<LoraEntry> find(std::string_view name) const;
  void add(LoraEntry entry);
  // Takes the adapter out: requests may no longer name it.
  std::optional<LoraEntry> remove(std::string_view name);
  // A run-time load holds its name from the check to the end of the load, so that two
  // loads of one name do not both go on: false when the name is taken or held.
  bool hold(const std::string& name);
  void let_go(const std::string& name);

 private:
  mutable std::mutex mutex_;
  std::vector<LoraEntry> entries_;
  std::set<std::string, std::less<>> held_;
};

}  // namespace troupe::net
