#include "net/request_fields.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>

namespace troupe::net::fields {

// Reads an optional number field; a wrong type is the client's error.
tl::expected<std::optional<double>, ApiError> number(const json::object& o, std::string_view key) {
  const auto* v = o.if_contains(key);
  if (v == nullptr || v->is_null()) return std::optional<double>{};
  if (v->is_double()) {
    if (!std::isfinite(v->get_double())) {
      return tl::unexpected(
          bad_request("'" + std::string(key) + "' must be finite", std::string(key)));
    }
    return std::optional<double>{v->get_double()};
  }
  if (v->is_int64()) return std::optional<double>{static_cast<double>(v->get_int64())};
  if (v->is_uint64()) return std::optional<double>{static_cast<double>(v->get_uint64())};
  return tl::unexpected(
      bad_request("'" + std::string(key) + "' must be a number", std::string(key)));
}

// JSON integers are read exactly (Boost.JSON holds them as int64 or uint64; both fit
// here); a number written with a fraction or exponent counts only when it is whole and
// below 2^53, where a double is still exact. Anything else is the client's error.
using Wide = __int128;

tl::expected<std::optional<Wide>, ApiError> integer(const json::object& o, std::string_view key) {
  const auto* v = o.if_contains(key);
  if (v == nullptr || v->is_null()) return std::optional<Wide>{};
  if (v->is_int64()) return std::optional<Wide>{v->get_int64()};
  if (v->is_uint64()) return std::optional<Wide>{v->get_uint64()};
  constexpr double kExact = 9007199254740992.0;  // 2^53
  if (v->is_double() && std::floor(v->get_double()) == v->get_double() &&
      std::fabs(v->get_double()) <= kExact) {
    return std::optional<Wide>{static_cast<Wide>(v->get_double())};
  }
  return tl::unexpected(
      bad_request("'" + std::string(key) + "' must be an integer", std::string(key)));
}

std::string wide_string(Wide v) {
  if (v == 0) return "0";
  const bool negative = v < 0;
  auto magnitude = static_cast<unsigned __int128>(negative ? -v : v);
  std::string digits;
  while (magnitude != 0) {
    digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(magnitude % 10)));
    magnitude /= 10;
  }
  return negative ? "-" + digits : digits;
}

// An integer field that must lie in [lo, hi].
tl::expected<std::optional<Wide>, ApiError> integer_in(const json::object& o, std::string_view key,
                                                       Wide lo, Wide hi) {
  auto v = integer(o, key);
  if (v && *v && (**v < lo || **v > hi)) {
    return tl::unexpected(bad_request("'" + std::string(key) + "' must be in [" + wide_string(lo) +
                                          ", " + wide_string(hi) + "], not " + wide_string(**v),
                                      std::string(key)));
  }
  return v;
}

tl::expected<std::optional<bool>, ApiError> boolean(const json::object& o, std::string_view key) {
  const auto* v = o.if_contains(key);
  if (v == nullptr || v->is_null()) return std::optional<bool>{};
  if (v->is_bool()) return std::optional<bool>{v->get_bool()};
  return tl::unexpected(
      bad_request("'" + std::string(key) + "' must be a boolean", std::string(key)));
}

tl::expected<std::vector<TokenId>, ApiError> token_array(const json::value& v, std::string_view key,
                                                         std::size_t vocab_size) {
  std::vector<TokenId> ids;
  for (const auto& e : v.as_array()) {
    if (!e.is_int64() && !e.is_uint64()) {
      return tl::unexpected(
          bad_request("'" + std::string(key) + "' must hold token ids", std::string(key)));
    }
    const bool in_range =
        e.is_int64() ? e.get_int64() >= 0 && static_cast<std::uint64_t>(e.get_int64()) < vocab_size
                     : e.get_uint64() < vocab_size;
    if (!in_range) {
      const std::string id =
          e.is_int64() ? std::to_string(e.get_int64()) : std::to_string(e.get_uint64());
      return tl::unexpected(bad_request(
          "token id " + id + " is outside the vocabulary of " + std::to_string(vocab_size),
          std::string(key)));
    }
    ids.push_back(static_cast<TokenId>(e.is_int64() ? e.get_int64()
                                                    : static_cast<std::int64_t>(e.get_uint64())));
  }
  return ids;
}

tl::expected<json::object, ApiError> parse_object(std::string_view body) {
  json::error_code ec;
  json::value v = json::parse(body, ec);
  if (ec) return tl::unexpected(bad_request("the body is not valid JSON: " + ec.message()));
  if (!v.is_object()) return tl::unexpected(bad_request("the body must be a JSON object"));
  return std::move(v.as_object());
}

tl::expected<void, ApiError> check_model(const json::object& o, const ApiContext& context,
                                         CompletionRequest& r) {
  if (const auto* m = o.if_contains("model"); m != nullptr && !m->is_null()) {
    if (!m->is_string()) return tl::unexpected(bad_request("'model' must be a string", "model"));
    r.model = std::string(m->get_string());
    const auto adapter = context.adapter_of(r.model);
    if (!adapter) {
      return tl::unexpected(
          ApiError{404, "The model '" + r.model + "' does not exist.", "NotFoundError", "model"});
    }
    r.generate.lora_adapter = *adapter;
  }
  return {};
}

// Every field a request may carry: what troupe reads, and the accepted no-ops (user, an
// end-user id; store, metadata and service_tier, OpenAI's storage and tiers, which mean
// nothing here; guided_decoding_backend, vLLM's choice of engine: there is one). Any field
// may also be null.
constexpr std::string_view kCommonFields[] = {"model",
                                              "max_tokens",
                                              "temperature",
                                              "top_p",
                                              "top_k",
                                              "min_p",
                                              "seed",
                                              "presence_penalty",
                                              "frequency_penalty",
                                              "repetition_penalty",
                                              "min_tokens",
                                              "n",
                                              "stream",
                                              "stream_options",
                                              "ignore_eos",
                                              "stop",
                                              "stop_token_ids",
                                              "logprobs",
                                              "prompt_logprobs",
                                              "logit_bias",
                                              "response_format",
                                              "structured_outputs",
                                              "guided_json",
                                              "guided_regex",
                                              "guided_choice",
                                              "guided_grammar",
                                              "json_schema",
                                              "grammar",
                                              "user",
                                              "store",
                                              "metadata",
                                              "service_tier",
                                              "guided_decoding_backend",
                                              "priority",
                                              "skip_special_tokens",
                                              "spaces_between_special_tokens",
                                              "include_stop_str_in_output",
                                              "truncate_prompt_tokens"};
constexpr std::string_view kCompletionFields[] = {"prompt", "echo", "best_of", "suffix"};
constexpr std::string_view kChatFields[] = {"messages",
                                            "max_completion_tokens",
                                            "top_logprobs",
                                            "tools",
                                            "tool_choice",
                                            "parallel_tool_calls",
                                            "chat_template_kwargs",
                                            "add_generation_prompt",
                                            "continue_final_message",
                                            "documents",
                                            "reasoning_effort",
                                            "include_reasoning"};
constexpr std::string_view kSocketFields[] = {"type", "id"};

tl::expected<void, ApiError> check_fields(const json::object& o, bool chat, bool socket) {
  auto among = [](std::string_view key, auto const& fields) {
    return std::find(std::begin(fields), std::end(fields), key) != std::end(fields);
  };
  for (const auto& [key, value] : o) {
    if (among(key, kCommonFields) ||
        (chat ? among(key, kChatFields) : among(key, kCompletionFields)) ||
        (socket && among(key, kSocketFields))) {
      continue;
    }
    // Unset (null), or on chat the completions' echo and best_of at what leaving them out
    // means: clients that send every field with its default ask nothing of it.
    if (value.is_null() ||
        (chat && key == "best_of" && value.is_int64() && value.get_int64() == 1) ||
        (chat && key == "echo" && value.is_bool() && !value.get_bool())) {
      continue;
    }
    return tl::unexpected(
        bad_request("Unrecognized request argument supplied: " + std::string(key) +
                        (chat ? " (chat completions)" : " (completions)"),
                    std::string(key)));
  }
  return {};
}

// {"token id": bias}: a bias in [-100, 100] added to the token's logit before sampling
// (-100 bans it, 100 all but forces it), as OpenAI's.
tl::expected<std::vector<std::pair<TokenId, float>>, ApiError> logit_bias(const json::object& o,
                                                                          std::size_t vocab_size) {
  std::vector<std::pair<TokenId, float>> biases;
  const auto* field = o.if_contains("logit_bias");
  if (field == nullptr || field->is_null()) return biases;
  if (!field->is_object()) {
    return tl::unexpected(bad_request("'logit_bias' must map token ids to numbers", "logit_bias"));
  }
  for (const auto& [key, value] : field->get_object()) {
    TokenId id = kNoToken;
    const std::string text(key);
    std::size_t used = 0;
    try {
      const long long parsed = std::stoll(text, &used);
      if (used == text.size() && parsed >= 0 && static_cast<std::uint64_t>(parsed) < vocab_size) {
        id = static_cast<TokenId>(parsed);
      }
    } catch (const std::exception&) {
    }
    if (id == kNoToken) {
      return tl::unexpected(bad_request("'logit_bias' key '" + text +
                                            "' is not a token id of the vocabulary of " +
                                            std::to_string(vocab_size),
                                        "logit_bias"));
    }
    if (!value.is_number()) {
      return tl::unexpected(bad_request("'logit_bias' values must be numbers", "logit_bias"));
    }
    const double bias = value.to_number<double>();
    if (!(bias >= -100.0 && bias <= 100.0)) {
      return tl::unexpected(
          bad_request("'logit_bias' values must be within [-100, 100]", "logit_bias"));
    }
    biases.emplace_back(id, static_cast<float>(bias));
  }
  std::sort(biases.begin(), biases.end());
  return biases;
}

tl::expected<void, ApiError> check_stop_strings(const std::vector<std::string>& stops) {
  if (stops.size() > kMostStopStrings) {
    return tl::unexpected(bad_request("at most " + std::to_string(kMostStopStrings) +
                                          " stop strings, not " + std::to_string(stops.size()),
                                      "stop"));
  }
  for (const auto& stop : stops) {
    if (stop.size() > kMostStopBytes) {
      return tl::unexpected(bad_request("a stop string may be at most " +
                                            std::to_string(kMostStopBytes) + " bytes, not " +
                                            std::to_string(stop.size()),
                                        "stop"));
    }
  }
  return {};
}

}  // namespace troupe::net::fields
