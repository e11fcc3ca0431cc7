#include "grammar/integer_range.hpp"

#include <algorithm>
#include <vector>

namespace troupe::grammar {

namespace {

constexpr std::int64_t kMaxDigits = 18;  // an unbounded integer's digits

std::string same_length(const std::string& lo, const std::string& hi);

// A leading digit, then the rest: the rest in parentheses, since it may be alternatives.
std::string digit_then(char digit, const std::string& lo_rest, const std::string& hi_rest) {
  const std::string rest = same_length(lo_rest, hi_rest);
  return "\"" + std::string(1, digit) + "\"" + (rest.empty() ? "" : " ( " + rest + " )");
}

// Numbers lo..hi (lo <= hi, both >= 0) of one length, as a GBNF expression.
std::string same_length(const std::string& lo, const std::string& hi) {
  if (lo.empty()) return "";
  if (lo == hi) return "\"" + lo + "\"";
  if (lo[0] == hi[0]) return digit_then(lo[0], lo.substr(1), hi.substr(1));
  const std::size_t n = lo.size() - 1;
  const bool lo_rest_zero = lo.find_first_not_of('0', 1) == std::string::npos;
  const bool hi_rest_nine = hi.find_first_not_of('9', 1) == std::string::npos;
  std::vector<std::string> parts;
  char first = lo[0], last = hi[0];
  if (!lo_rest_zero) {
    parts.push_back(digit_then(lo[0], lo.substr(1), std::string(n, '9')));
    ++first;
  }
  if (!hi_rest_nine) --last;
  if (first <= last) {
    std::string middle = "[" + std::string(1, first) + "-" + std::string(1, last) + "]";
    if (n > 0) middle += " [0-9]{" + std::to_string(n) + "}";
    parts.push_back(middle);
  }
  if (!hi_rest_nine) {
    parts.push_back(digit_then(hi[0], std::string(n, '0'), hi.substr(1)));
  }
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : " | ") + std::string("( ") + p + " )";
  return out;
}

// Non-negative integers lo..hi, no leading zeros; hi empty: no upper bound.
std::string digits_range(const std::string& lo, const std::string& hi) {
  std::vector<std::string> parts;
  const std::size_t top = hi.empty() ? lo.size() : hi.size();
  for (std::size_t len = lo.size(); len <= top; ++len) {
    const std::string from =
        len == lo.size() ? lo : (len == 1 ? "0" : "1" + std::string(len - 1, '0'));
    const std::string to = !hi.empty() && len == hi.size() ? hi : std::string(len, '9');
    parts.push_back(same_length(from, to));
  }
  if (hi.empty() && static_cast<std::int64_t>(lo.size()) < kMaxDigits) {
    parts.push_back("[1-9] [0-9]{" + std::to_string(lo.size()) + "," +
                    std::to_string(kMaxDigits - 1) + "}");
  }
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : " | ") + std::string("( ") + p + " )";
  return out;
}

}  // namespace

// Integers in [lo, hi], either side open where empty.
std::string integer_range(std::optional<std::int64_t> lo, std::optional<std::int64_t> hi) {
  std::vector<std::string> parts;
  // The negative values: "-" then their magnitudes.
  if (!lo || *lo < 0) {
    const std::int64_t top = hi ? std::min<std::int64_t>(*hi, -1) : -1;
    if (!lo || *lo <= top) {
      const std::string from = std::to_string(-top);
      const std::string to = lo ? std::to_string(-*lo) : "";
      parts.push_back("\"-\" ( " + digits_range(from, to) + " )");
    }
  }
  if (!hi || *hi >= 0) {
    const std::int64_t from = lo ? std::max<std::int64_t>(*lo, 0) : 0;
    if (!hi || from <= *hi) {
      parts.push_back(digits_range(std::to_string(from), hi ? std::to_string(*hi) : ""));
    }
  }
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : " | ") + std::string("( ") + p + " )";
  return out;
}

}  // namespace troupe::grammar
