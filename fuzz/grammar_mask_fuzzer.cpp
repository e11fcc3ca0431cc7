// Output constraints from anywhere (a request's guided_grammar, guided_regex, guided_json,
// guided_choice) through what a worker does with them: compile, then token masks over a
// 32 000-token vocabulary and the tokens they allow, each under a work budget. Beyond "no
// crash", the invariant is bounded work: every mask and every advance stays within its
// budget in counted steps (a budget passed by more than one charge is a count that is
// wrong) and in time (work the count misses would show as a mask that takes seconds).
//
// The first byte picks the front end (GBNF, regex, JSON schema, or choices one per line);
// the rest is its text.
#include <boost/json.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.hpp"
#include "grammar/gbnf.hpp"
#include "grammar/json_schema.hpp"
#include "grammar/regex.hpp"
#include "grammar/token_masker.hpp"

namespace {

using namespace troupe;

// Small enough that a unit runs in well under a second under ASan; the same code as the
// server's budget (grammar::kMaskWorkBudget), which only differs by its size.
constexpr std::uint64_t kBudget = std::uint64_t{1} << 20;
// No charge is larger than this (a sort of 4096 branches, a stack copy): a budget passed
// by more is work the count let through unchecked.
constexpr std::uint64_t kLargestCharge = std::uint64_t{1} << 17;
// A mask within its budget takes well under this, even under ASan on a loaded machine.
constexpr double kMaxMaskSeconds = 5.0;

const grammar::TokenMasker& masker() {
  static const grammar::TokenMasker instance = [] {
    const text::Tokenizer tokenizer = fuzz::builtin_spm_tokenizer(32000);
    std::vector<std::string> bytes(tokenizer.size());
    for (std::size_t id = 0; id < bytes.size(); ++id) {
      bytes[id] = std::string(tokenizer.piece(static_cast<TokenId>(id)));
    }
    return grammar::TokenMasker(std::move(bytes));
  }();
  return instance;
}

Result<grammar::Grammar> grammar_of(std::uint8_t kind, std::string_view text) {
  switch (kind % 4) {
    case 0:
      return grammar::parse_gbnf(text);
    case 1:
      return grammar::parse_regex(text);
    case 2: {
      boost::system::error_code ec;
      const boost::json::value schema = boost::json::parse(text, ec);
      if (ec) return make_error(ErrorCode::invalid_argument, "not JSON");
      return grammar::parse_json_schema(schema);
    }
    default: {
      std::vector<std::string> choices;
      std::size_t start = 0;
      for (std::size_t i = 0; i <= text.size(); ++i) {
        if (i == text.size() || text[i] == '\n') {
          if (i > start) choices.emplace_back(text.substr(start, i - start));
          start = i + 1;
        }
      }
      if (choices.empty()) return make_error(ErrorCode::invalid_argument, "no choice");
      return grammar::parse_choice(choices);
    }
  }
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto parsed = grammar_of(data[0], text);
  if (!parsed) return 0;
  auto compiled = grammar::compile(*parsed);
  if (!compiled) return 0;
  grammar::Matcher matcher(std::make_shared<const grammar::CompiledGrammar>(std::move(*compiled)));
  if (!matcher.ok()) return 0;
  const grammar::TokenMasker& tokens = masker();
  std::vector<std::uint64_t> mask;
  // A few tokens of output, each chosen among the allowed ones by the input's bytes.
  for (std::size_t step = 0; step < 8; ++step) {
    grammar::WorkBudget budget(kBudget);
    const auto start = std::chrono::steady_clock::now();
    const bool complete = tokens.fill_mask(matcher, mask, &budget);
    const double seconds = seconds_since(start);
    TROUPE_FUZZ_CHECK(seconds < kMaxMaskSeconds, "a mask within its budget took seconds");
    TROUPE_FUZZ_CHECK(budget.spent() <= kBudget + kLargestCharge, "a mask passed its budget");
    TROUPE_FUZZ_CHECK(complete == !budget.exhausted(), "a mask that failed had budget left");
    if (!complete) return 0;
    std::vector<TokenId> allowed;
    for (std::size_t id = 0; id < static_cast<std::size_t>(tokens.vocab_size()); ++id) {
      if ((mask[id / 64] >> (id % 64) & 1) != 0) allowed.push_back(static_cast<TokenId>(id));
    }
    if (allowed.empty()) return 0;
    const std::uint8_t pick = data[(step + 1) % size];
    const TokenId next = allowed[(pick * 7919u + step) % allowed.size()];
    grammar::WorkBudget advance(kBudget);
    grammar::Matcher after = matcher;
    const bool taken = after.accept_bytes(tokens.token_bytes(next), &advance);
    TROUPE_FUZZ_CHECK(advance.spent() <= kBudget + kLargestCharge, "an advance passed its budget");
    // A refusal is the budget's, or a limit of the matcher's that the whole state meets
    // where the mask's walk, branch by branch, did not: the output cannot go on either way.
    if (!taken) return 0;
    matcher = std::move(after);
  }
  return 0;
}
