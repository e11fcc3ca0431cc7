#include "model/collective.hpp"

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
    return make_error(ErrorCode::unavailable, "no rank set '" + key + "' within " +
                                                  std::to_string(timeout.count()) + " ms");
  }
  return values_.at(key);
}

}  // namespace troupe::model
