#include "text/stop_strings.hpp"

#include <algorithm>

namespace troupe::text {

StopStringFilter::StopStringFilter(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string StopStringFilter::push(std::string_view text) {
  if (stopped_) return {};
  held_.append(text);
  // The earliest stop string in what is held ends the stream.
  std::size_t first = std::string::npos;
  for (const auto& stop : stops_) {
    const std::size_t at = held_.find(stop);
    if (at < first) {
      first = at;
      matched_ = stop;
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back the longest tail that could still grow into a stop string.
  std::size_t hold = 0;
  for (const auto& stop : stops_) {
    for (std::size_t n = std::min(stop.size() - 1, held_.size()); n > hold; --n) {
      if (held_.compare(held_.size() - n, n, stop, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  // Never split a UTF-8 character: widen the held tail to a character boundary.
  while (hold < held_.size() &&
         (static_cast<unsigned char>(held_[held_.size() - hold]) & 0xC0) == 0x80) {
    ++hold;
  }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopStringFilter::flush() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace troupe::text
