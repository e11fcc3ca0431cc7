// Streams generated text through a request's stop strings. Text is released as
// soon as it cannot be the start of a stop string; when one appears, the text
// before it is released and the stream ends (the stop string itself is not
// part of the output, as in OpenAI's API).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace troupe::text {

class StopStringFilter {
 public:
  explicit StopStringFilter(std::vector<std::string> stops);

  // Adds text (whole UTF-8 characters); returns what may be shown now.
  std::string push(std::string_view text);
  // At the end of the stream: whatever was held back.
  std::string flush();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  std::string matched_;
  bool stopped_ = false;
};

}  // namespace troupe::text
