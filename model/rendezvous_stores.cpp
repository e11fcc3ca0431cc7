#include "model/rendezvous_stores.hpp"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <system_error>
#include <thread>

namespace troupe::model {

Result<void> InProcessStore::set(const std::string& key, const std::vector<char>& value) {
  {
    std::lock_guard lock(mutex_);
    values_.insert_or_assign(key, value);
  }
  changed_.notify_all();
  return {};
}

Result<std::vector<char>> InProcessStore::get(const std::string& key,
                                              std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!changed_.wait_for(lock, timeout, [&] { return values_.contains(key); })) {
    return make_error(ErrorCode::timed_out, "no rank set '" + key + "' within " +
                                                std::to_string(timeout.count()) + " ms");
  }
  return values_.at(key);
}

std::filesystem::path FileStore::file(std::string key) const {
  std::replace(key.begin(), key.end(), '/', '_');
  return dir_ / key;
}

Result<void> FileStore::set(const std::string& key, const std::vector<char>& value) {
  // Written aside, then renamed: a reader sees the whole value or none.
  const auto path = file(key);
  const auto partial = path.string() + ".partial-" + std::to_string(::getpid());
  {
    std::ofstream out(partial, std::ios::binary);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    if (!out) return make_error(ErrorCode::io, "cannot write " + partial);
  }
  std::error_code error;
  std::filesystem::rename(partial, path, error);
  if (error) return make_error(ErrorCode::io, "cannot rename " + partial + ": " + error.message());
  return {};
}

Result<std::vector<char>> FileStore::get(const std::string& key,
                                         std::chrono::milliseconds timeout) {
  const auto path = file(key);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!std::filesystem::exists(path)) {
    if (std::chrono::steady_clock::now() > deadline) {
      return make_error(ErrorCode::timed_out, "no rank set '" + key + "' within " +
                                                  std::to_string(timeout.count()) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

}  // namespace troupe::model
