// `troupe bench grammar`: what constrained decoding costs for a vocabulary: the grammar's
// compile time, the vocabulary's preprocessing, and the time to compute one token mask, per
// step of a constrained output drawn at random (median, p99, mean), with each mask's work
// in the steps a worker's budget counts (grammar::kMaskWorkBudget): a mask that runs out
// of it ends the output, as it ends a served request.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <boost/json/parse.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include "app/commands.hpp"
#include "gguf/gguf_file.hpp"
#include "grammar/gbnf.hpp"
#include "grammar/json_schema.hpp"
#include "grammar/regex.hpp"
#include "grammar/token_masker.hpp"
#include "text/tokenizer.hpp"

namespace troupe::app {

namespace {

using Clock = std::chrono::steady_clock;

// A function-calling argument schema of the kind agents send.
constexpr const char* kDefaultSchema = R"({
  "type": "object",
  "properties": {
    "city": {"type": "string", "maxLength": 40},
    "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 14},
    "hourly": {"type": "boolean"},
    "fields": {"type": "array", "items": {"type": "string"}, "maxItems": 4}
  },
  "required": ["city", "days"],
  "additionalProperties": false
})";

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw CLI::ValidationError("cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

void add_bench_grammar_command(CLI::App& bench) {
  struct Options {
    std::string vocab, schema_file, gbnf_file, regex;
    int steps = 64, outputs = 4;
    std::uint64_t seed = 1;
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = bench.add_subcommand(
      "grammar", "constrained decoding's cost: compile time and per-token mask time");
  cmd->add_option("--vocab", opts->vocab, "GGUF file whose tokenizer to use")->required();
  cmd->add_option("--schema", opts->schema_file,
                  "JSON schema file (default: a function-call argument schema)");
  cmd->add_option("--gbnf", opts->gbnf_file, "GBNF grammar file instead of a schema");
  cmd->add_option("--regex", opts->regex, "a regular expression instead of a schema");
  cmd->add_option("--steps", opts->steps, "tokens per output at most")->check(CLI::PositiveNumber);
  cmd->add_option("--outputs", opts->outputs, "outputs drawn")->check(CLI::PositiveNumber);
  cmd->add_option("--seed", opts->seed, "the draws' seed");
  cmd->callback([opts] {
    auto file = gguf::GgufFile::open(opts->vocab);
    if (!file) throw CLI::ValidationError("--vocab", file.error().message);
    auto tokenizer = text::Tokenizer::from_gguf(*file);
    if (!tokenizer) throw CLI::ValidationError("--vocab", tokenizer.error().message);

    auto start = Clock::now();
    Result<grammar::Grammar> parsed = make_error(ErrorCode::internal, "no grammar");
    if (!opts->regex.empty()) {
      parsed = grammar::parse_regex(opts->regex);
    } else if (!opts->gbnf_file.empty()) {
      parsed = grammar::parse_gbnf(read_file(opts->gbnf_file));
    } else {
      const std::string schema =
          opts->schema_file.empty() ? kDefaultSchema : read_file(opts->schema_file);
      boost::system::error_code ec;
      const auto json = boost::json::parse(schema, ec);
      if (ec) throw CLI::ValidationError("--schema", "not JSON: " + ec.message());
      parsed = grammar::parse_json_schema(json);
    }
    if (!parsed) throw CLI::ValidationError(parsed.error().message);
    auto compiled = grammar::compile(*parsed);
    if (!compiled) throw CLI::ValidationError(compiled.error().message);
    const double compile_seconds = seconds_since(start);
    const auto g = std::make_shared<const grammar::CompiledGrammar>(std::move(*compiled));

    start = Clock::now();
    std::vector<std::string> pieces(tokenizer->size());
    for (TokenId id = 0; id < static_cast<TokenId>(tokenizer->size()); ++id) {
      pieces[static_cast<std::size_t>(id)] = std::string(tokenizer->piece(id));
    }
    const grammar::TokenMasker masker(std::move(pieces));
    const double vocab_seconds = seconds_since(start);

    // Outputs drawn at random among the allowed tokens, timing every mask.
    std::mt19937_64 rng(opts->seed);
    std::vector<double> mask_us;
    std::vector<std::uint64_t> mask_steps;
    std::vector<std::uint64_t> mask;
    std::size_t allowed_total = 0, over_budget = 0;
    for (int o = 0; o < opts->outputs; ++o) {
      grammar::Matcher matcher(g);
      for (int step = 0; step < opts->steps; ++step) {
        grammar::WorkBudget budget;
        start = Clock::now();
        const bool complete = masker.fill_mask(matcher, mask, &budget);
        mask_us.push_back(seconds_since(start) * 1e6);
        mask_steps.push_back(budget.spent());
        if (!complete) {
          ++over_budget;  // as a worker would: the output ends with an error
          break;
        }
        std::vector<TokenId> allowed;
        for (TokenId id = 0; id < masker.vocab_size(); ++id) {
          if ((mask[static_cast<std::size_t>(id) / 64] >> (id % 64) & 1) != 0)
            allowed.push_back(id);
        }
        allowed_total += allowed.size();
        if (allowed.empty() || (matcher.can_end() && rng() % 4 == 0)) break;
        const TokenId next = allowed[rng() % allowed.size()];
        if (!matcher.accept_bytes(tokenizer->piece(next))) {
          throw CLI::RuntimeError(1);  // the mask allowed what the matcher refuses
        }
      }
    }
    std::vector<double> sorted = mask_us;
    std::sort(sorted.begin(), sorted.end());
    const auto at = [&](double q) {
      return sorted[std::min(sorted.size() - 1, static_cast<std::size_t>(q * sorted.size()))];
    };
    double mean = 0.0;
    for (const double v : mask_us) mean += v / static_cast<double>(mask_us.size());
    std::printf("vocabulary %s: %d tokens\n", opts->vocab.c_str(),
                static_cast<int>(tokenizer->size()));
    std::printf("grammar: %zu rules, compiled in %.2f ms; vocabulary prepared in %.2f ms\n",
                g->rule_starts.size(), compile_seconds * 1e3, vocab_seconds * 1e3);
    std::printf(
        "token mask, %zu steps: median %.1f us, p99 %.1f us, mean %.1f us; "
        "%.0f tokens allowed per step on average\n",
        mask_us.size(), at(0.5), at(0.99), mean,
        static_cast<double>(allowed_total) / static_cast<double>(mask_us.size()));
    std::sort(mask_steps.begin(), mask_steps.end());
    const double slowest_us = sorted.back();
    std::printf(
        "mask work: median %llu steps, max %llu steps of a budget of %llu; the slowest mask "
        "%.1f ms; %zu of %d outputs ended over the budget\n",
        static_cast<unsigned long long>(mask_steps[mask_steps.size() / 2]),
        static_cast<unsigned long long>(mask_steps.back()),
        static_cast<unsigned long long>(grammar::kMaskWorkBudget), slowest_us / 1e3, over_budget,
        opts->outputs);
  });
}

}  // namespace troupe::app
