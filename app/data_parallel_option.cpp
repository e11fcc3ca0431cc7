#include "app/data_parallel_option.hpp"

#include <charconv>
#include <string>

#include "troupe/config.hpp"

namespace troupe::app {

namespace {

// A whole number of replicas in [1, kMostReplicas], or why not (`what` names the part).
Result<std::int32_t> replicas_of(std::string_view text, const std::string& what) {
  std::int32_t n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (text.empty() || ec == std::errc::invalid_argument || end != text.data() + text.size()) {
    return make_error(ErrorCode::invalid_argument,
                      what + " '" + std::string(text) + "' is not a whole number");
  }
  if (ec == std::errc::result_out_of_range || n < 1 || n > kMostReplicas) {
    return make_error(
        ErrorCode::invalid_argument,
        what + " must be in [1, " + std::to_string(kMostReplicas) + "], not " + std::string(text));
  }
  return n;
}

}  // namespace

Result<DataParallelSize> parse_data_parallel_size(std::string_view text) {
  constexpr std::string_view kForms = " (a number, a range MIN:MAX such as 2:8, or auto)";
  if (text.size() > 32) {
    return make_error(ErrorCode::invalid_argument, "expected replicas" + std::string(kForms) +
                                                       ", not a value of " +
                                                       std::to_string(text.size()) + " bytes");
  }
  if (text == "auto") return DataParallelSize{1, EngineConfig::kUnboundedReplicas};
  const auto colon = text.find(':');
  if (colon == std::string_view::npos) {
    auto n = replicas_of(text, "the replica count");
    if (!n) return tl::unexpected(Error{n.error().code, n.error().message + std::string(kForms)});
    return DataParallelSize{*n, 0};
  }
  auto min = replicas_of(text.substr(0, colon), "the range's minimum");
  if (!min)
    return tl::unexpected(Error{min.error().code, min.error().message + std::string(kForms)});
  auto max = replicas_of(text.substr(colon + 1), "the range's maximum");
  if (!max)
    return tl::unexpected(Error{max.error().code, max.error().message + std::string(kForms)});
  if (*min > *max) {
    return make_error(ErrorCode::invalid_argument,
                      "the range " + std::string(text) + " has its minimum " +
                          std::to_string(*min) + " above its maximum " + std::to_string(*max));
  }
  return DataParallelSize{*min, *max};
}

}  // namespace troupe::app
