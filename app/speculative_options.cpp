#include "app/speculative_options.hpp"

#include <algorithm>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>
#include <cmath>
#include <limits>
#include <optional>

namespace troupe::app {

namespace {

// Most tokens proposed a step: a draft longer than this is seldom all accepted.
constexpr std::int64_t kMostSpeculativeTokens = 32;
// Most threads a draft model's own pool may have.
constexpr std::int64_t kMostDraftThreads = 1024;
// Longest n-gram looked up (the proposer scans the sequence once per length).
constexpr std::int64_t kMostLookup = 64;

auto bad(const std::string& what) {
  return make_error(ErrorCode::invalid_argument, "--speculative-config: " + what);
}

// An integer field within [lo, hi]; nothing when absent.
Result<std::optional<std::int32_t>> integer(const boost::json::object& o, const char* key,
                                            std::int64_t lo, std::int64_t hi) {
  const auto* v = o.if_contains(key);
  if (v == nullptr || v->is_null()) return std::optional<std::int32_t>{};
  std::int64_t n = 0;
  if (v->is_int64()) {
    n = v->as_int64();
  } else if (v->is_uint64()) {
    n = v->as_uint64() > static_cast<std::uint64_t>(hi) ? hi + 1
                                                        : static_cast<std::int64_t>(v->as_uint64());
  } else if (v->is_double() && std::trunc(v->as_double()) == v->as_double() &&
             std::abs(v->as_double()) < 1e15) {
    n = static_cast<std::int64_t>(v->as_double());
  } else {
    return bad(std::string(key) + " must be an integer");
  }
  if (n < lo || n > hi) {
    return bad(std::string(key) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
               "], not " + std::to_string(n));
  }
  return std::optional<std::int32_t>{static_cast<std::int32_t>(n)};
}

}  // namespace

Result<SpeculativeConfig> parse_speculative_config(const std::string& json) {
  boost::system::error_code ec;
  const boost::json::value parsed = boost::json::parse(json, ec);
  if (ec) return bad("not valid JSON (" + ec.message() + "): " + json);
  if (!parsed.is_object())
    return bad("must be a JSON object, such as {\"method\": \"ngram\", ...}");
  const auto& o = parsed.as_object();
  for (const auto& [key, value] : o) {
    static const char* const kKnown[] = {"method",
                                         "model",
                                         "num_speculative_tokens",
                                         "prompt_lookup_max",
                                         "prompt_lookup_min",
                                         "disable_by_batch_size",
                                         "draft_num_threads"};
    if (std::find_if(std::begin(kKnown), std::end(kKnown),
                     [&](const char* k) { return key == k; }) == std::end(kKnown)) {
      return bad("unknown field \"" + std::string(key) +
                 "\" (known: method, model, num_speculative_tokens, prompt_lookup_max, "
                 "prompt_lookup_min, disable_by_batch_size, draft_num_threads)");
    }
  }
  SpeculativeConfig config;
  const auto* model = o.if_contains("model");
  const auto* method = o.if_contains("method");
  const bool has_method = method != nullptr && !method->is_null();
  if (has_method && !method->is_string()) return bad("method must be a string");
  if (model != nullptr && !model->is_null()) {
    // vLLM: a draft model's method is "draft_model", named or not.
    if (!model->is_string() || model->as_string().empty()) {
      return bad("model must be the draft model's file path");
    }
    if (has_method && method->as_string() != "draft_model") {
      return bad("method \"" + std::string(method->as_string()) +
                 "\" does not take a model (\"draft_model\" does; \"ngram\" takes none)");
    }
    for (const char* key : {"prompt_lookup_max", "prompt_lookup_min"}) {
      if (const auto* v = o.if_contains(key); v != nullptr && !v->is_null()) {
        return bad(std::string(key) + " is for method \"ngram\", not a draft model");
      }
    }
    config.draft_model = std::string(model->as_string());
    TROUPE_TRY(const auto k, integer(o, "num_speculative_tokens", 1, kMostSpeculativeTokens));
    if (!k) return bad("num_speculative_tokens is required with a draft model");
    config.num_speculative_tokens = *k;
    TROUPE_TRY(const auto batch,
               integer(o, "disable_by_batch_size", 1, std::numeric_limits<std::int32_t>::max()));
    if (batch) config.disable_by_batch_size = *batch;
    TROUPE_TRY(const auto threads, integer(o, "draft_num_threads", 1, kMostDraftThreads));
    if (threads) config.draft_num_threads = *threads;
    return config;
  }
  if (!has_method) return bad("method is required (\"ngram\", or a draft model's \"model\")");
  if (const auto* v = o.if_contains("draft_num_threads"); v != nullptr && !v->is_null()) {
    return bad("draft_num_threads is for a draft model (\"model\"), not method \"" +
               std::string(method->is_string() ? method->as_string() : "") + "\"");
  }
  if (method->as_string() == "draft_model") return bad("method draft_model needs a \"model\"");
  if (method->as_string() != "ngram" && method->as_string() != "[ngram]") {
    return bad(
        "method must be \"ngram\" or \"draft_model\" (other proposers are not "
        "supported yet)");
  }
  TROUPE_TRY(const auto k, integer(o, "num_speculative_tokens", 1, kMostSpeculativeTokens));
  if (!k) return bad("num_speculative_tokens is required with method ngram");
  config.num_speculative_tokens = *k;
  TROUPE_TRY(auto max_n, integer(o, "prompt_lookup_max", 1, kMostLookup));
  TROUPE_TRY(auto min_n, integer(o, "prompt_lookup_min", 1, kMostLookup));
  // vLLM's defaults: neither given, both 5; one given, the other the same.
  if (!max_n && !min_n) max_n = min_n = 5;
  if (!max_n) max_n = min_n;
  if (!min_n) min_n = max_n;
  if (*min_n > *max_n) {
    return bad("prompt_lookup_min (" + std::to_string(*min_n) +
               ") must not exceed prompt_lookup_max (" + std::to_string(*max_n) + ")");
  }
  config.prompt_lookup_max = *max_n;
  config.prompt_lookup_min = *min_n;
  TROUPE_TRY(const auto batch,
             integer(o, "disable_by_batch_size", 1, std::numeric_limits<std::int32_t>::max()));
  if (batch) config.disable_by_batch_size = *batch;
  return config;
}

void add_speculative_option(CLI::App* cmd, EngineConfig& engine) {
  cmd->add_option_function<std::string>(
         "--speculative-config",
         [&engine](const std::string& json) {
           auto parsed = parse_speculative_config(json);
           if (!parsed) throw CLI::ValidationError(parsed.error().message);
           engine.speculative = *parsed;
         },
         "speculative decoding, as vLLM's JSON: {\"method\": \"ngram\", "
         "\"num_speculative_tokens\": k, \"prompt_lookup_max\": n, \"prompt_lookup_min\": m} "
         "proposes up to k tokens by looking the last n..m tokens up earlier in the sequence; "
         "{\"model\": \"draft.gguf\", \"num_speculative_tokens\": k} has a draft model with "
         "the same vocabulary propose them; the step verifies them (the output is the same). "
         "\"disable_by_batch_size\": b "
         "(default 4) turns proposals off while more than b sequences run or wait "
         "(default: off)")
      ->type_name("JSON");
}

}  // namespace troupe::app
