// The request fields' readers, shared by the OpenAI parsers (net/openai_request.cpp):
// typed values read exactly (a wrong type or range is the client's 400, naming the field),
// the fields a request may carry, logit_bias and the bounds on stops. Internal to
// troupe_net_api.
#pragma once

#include <boost/json.hpp>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "net/api_error.hpp"
#include "net/openai_api.hpp"
#include "troupe/result.hpp"

namespace troupe::net::fields {

namespace json = boost::json;

// Reads an optional number field; a wrong type is the client's error.
tl::expected<std::optional<double>, ApiError> number(const json::object& o, std::string_view key);

// JSON integers are read exactly (Boost.JSON holds them as int64 or uint64; both fit
// here); a number written with a fraction or exponent counts only when it is whole and
// below 2^53, where a double is still exact. Anything else is the client's error.
using Wide = __int128;

tl::expected<std::optional<Wide>, ApiError> integer(const json::object& o, std::string_view key);
std::string wide_string(Wide v);
// An integer field that must lie in [lo, hi].
tl::expected<std::optional<Wide>, ApiError> integer_in(const json::object& o, std::string_view key,
                                                       Wide lo, Wide hi);
tl::expected<std::optional<bool>, ApiError> boolean(const json::object& o, std::string_view key);
// An array of token ids, each within the vocabulary.
tl::expected<std::vector<TokenId>, ApiError> token_array(const json::value& v, std::string_view key,
                                                         std::size_t vocab_size);
// The body as a JSON object, or the client's 400.
tl::expected<json::object, ApiError> parse_object(std::string_view body);

// "model", when given, must name the served model (or one of its other names): 404 else.
tl::expected<void, ApiError> check_model(const json::object& o, const ApiContext& context,
                                         CompletionRequest& r);
// Nothing is silently ignored: a field not read (and not a documented no-op) is a 400.
tl::expected<void, ApiError> check_fields(const json::object& o, bool chat, bool socket);

// A batch of prompts, and the sequences one request may run (prompts x best_of).
constexpr std::size_t kMostPrompts = 64;
constexpr std::int32_t kMostSequences = 64;

// {"token id": bias}: a bias in [-100, 100] added to the token's logit before sampling
// (-100 bans it, 100 all but forces it), as OpenAI's.
tl::expected<std::vector<std::pair<TokenId, float>>, ApiError> logit_bias(const json::object& o,
                                                                          std::size_t vocab_size);

// Each generated token is matched against every stop string (and the text held back
// for one, as long as the longest): their number and length are bounded.
constexpr std::size_t kMostStopStrings = 64;
constexpr std::size_t kMostStopBytes = 512;
constexpr std::size_t kMostStopTokenIds = 1024;
tl::expected<void, ApiError> check_stop_strings(const std::vector<std::string>& stops);

}  // namespace troupe::net::fields

// `lhs = *expr`, or return expr's ApiError from the enclosing function.
#define TROUPE_API_TRY(lhs, expr)                                             \
  auto TROUPE_TRY_CAT(api_, __LINE__) = (expr);                               \
  if (!TROUPE_TRY_CAT(api_, __LINE__))                                        \
    return tl::unexpected(std::move(TROUPE_TRY_CAT(api_, __LINE__)).error()); \
  lhs = std::move(*TROUPE_TRY_CAT(api_, __LINE__))
