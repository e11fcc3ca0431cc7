// Rendezvous stores for ranks outside a cluster: a map for threads of one process (tests),
// files for processes of one machine (the benchmarks). A cluster's ranks meet through
// their group actor instead (actors/parallel/group_actor).
#pragma once

#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>

#include "model/collective.hpp"

namespace troupe::model {

// The store for ranks that are processes of one machine (the benchmarks): a file per key
// in a directory they share.
class FileStore final : public RendezvousStore {
 public:
  explicit FileStore(std::filesystem::path dir) : dir_(std::move(dir)) {}

  Result<void> set(const std::string& key, const std::vector<char>& value) override;
  Result<std::vector<char>> get(const std::string& key, std::chrono::milliseconds timeout) override;

 private:
  std::filesystem::path file(std::string key) const;
  std::filesystem::path dir_;
};

// The store for ranks in one process (tests, benchmarks).
class InProcessStore final : public RendezvousStore {
 public:
  Result<void> set(const std::string& key, const std::vector<char>& value) override;
  Result<std::vector<char>> get(const std::string& key, std::chrono::milliseconds timeout) override;

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<char>> values_;
};

}  // namespace troupe::model
