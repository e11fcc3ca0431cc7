#include "grammar/grammar.hpp"

#include <algorithm>
#include <atomic>

namespace troupe::grammar {

std::uint32_t Grammar::rule_index(const std::string& name) {
  const auto [it, added] = rule_ids.try_emplace(name, static_cast<std::uint32_t>(rules.size()));
  if (added) rules.push_back(Rule{name, {}});
  return it->second;
}

std::uint32_t Grammar::byte_set_index(const ByteSet& set) {
  const auto [it, added] =
      byte_set_ids.try_emplace(set, static_cast<std::uint32_t>(byte_sets.size()));
  if (added) byte_sets.push_back(set);
  return it->second;
}

namespace {

// Rules that can match the empty string, by fixpoint.
std::vector<bool> nullable_rules(const Grammar& g) {
  std::vector<bool> nullable(g.rules.size(), false);
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t r = 0; r < g.rules.size(); ++r) {
      if (nullable[r]) continue;
      for (const auto& alt : g.rules[r].alternatives) {
        const bool empty = std::all_of(alt.begin(), alt.end(), [&](const Element& e) {
          return e.kind == Element::Kind::rule && nullable[e.index];
        });
        if (empty) {
          nullable[r] = true;
          changed = true;
          break;
        }
      }
    }
  }
  return nullable;
}

// The rules `rule` can enter before it consumes a byte.
std::vector<std::uint32_t> left_calls(const Grammar& g, std::uint32_t rule,
                                      const std::vector<bool>& nullable) {
  std::vector<std::uint32_t> calls;
  for (const auto& alt : g.rules[rule].alternatives) {
    for (const Element& e : alt) {
      if (e.kind != Element::Kind::rule) break;
      calls.push_back(e.index);
      if (!nullable[e.index]) break;
    }
  }
  return calls;
}

// A rule that reaches itself through left_calls: its name, or empty.
std::string find_left_recursion(const Grammar& g, const std::vector<bool>& nullable) {
  enum class Mark : std::uint8_t { none, active, done };
  std::vector<Mark> mark(g.rules.size(), Mark::none);
  std::vector<std::vector<std::uint32_t>> calls(g.rules.size());
  for (std::uint32_t r = 0; r < g.rules.size(); ++r) calls[r] = left_calls(g, r, nullable);
  // Iterative depth-first search: (rule, next call to follow).
  std::vector<std::pair<std::uint32_t, std::size_t>> path;
  for (std::uint32_t start = 0; start < g.rules.size(); ++start) {
    if (mark[start] != Mark::none) continue;
    path.push_back({start, 0});
    mark[start] = Mark::active;
    while (!path.empty()) {
      auto& [rule, next] = path.back();
      if (next == calls[rule].size()) {
        mark[rule] = Mark::done;
        path.pop_back();
        continue;
      }
      const std::uint32_t callee = calls[rule][next++];
      if (mark[callee] == Mark::active) return g.rules[callee].name;
      if (mark[callee] == Mark::none) {
        mark[callee] = Mark::active;
        path.push_back({callee, 0});
      }
    }
  }
  return {};
}

}  // namespace

Result<CompiledGrammar> compile(const Grammar& grammar) {
  if (grammar.root >= grammar.rules.size()) {
    return make_error(ErrorCode::invalid_argument, "the grammar has no root rule");
  }
  if (grammar.rules.size() > kMaxRules) {
    return make_error(ErrorCode::invalid_argument,
                      "the grammar has " + std::to_string(grammar.rules.size()) +
                          " rules (with those its groups and repetitions make); at most " +
                          std::to_string(kMaxRules) + " are allowed");
  }
  for (const Rule& rule : grammar.rules) {
    if (rule.alternatives.empty()) {
      return make_error(ErrorCode::invalid_argument, "rule '" + rule.name + "' is not defined");
    }
    for (const auto& alt : rule.alternatives) {
      for (const Element& e : alt) {
        const std::size_t limit =
            e.kind == Element::Kind::rule ? grammar.rules.size() : grammar.byte_sets.size();
        if (e.kind == Element::Kind::end || e.index >= limit) {
          return make_error(ErrorCode::invalid_argument,
                            "rule '" + rule.name + "' holds an invalid element");
        }
      }
    }
  }
  const auto nullable = nullable_rules(grammar);
  if (const std::string rule = find_left_recursion(grammar, nullable); !rule.empty()) {
    return make_error(ErrorCode::invalid_argument,
                      "rule '" + rule +
                          "' is left-recursive (it can reach itself before matching a "
                          "character); write the repetition with * or + instead");
  }
  static std::atomic<std::uint64_t> next_id{1};
  CompiledGrammar out;
  out.id = next_id.fetch_add(1);
  out.byte_sets = grammar.byte_sets;
  out.root = grammar.root;
  out.rule_starts.resize(grammar.rules.size());
  for (std::size_t r = 0; r < grammar.rules.size(); ++r) {
    out.rule_names.push_back(grammar.rules[r].name);
    for (const auto& alt : grammar.rules[r].alternatives) {
      out.rule_starts[r].push_back(static_cast<std::uint32_t>(out.elements.size()));
      out.elements.insert(out.elements.end(), alt.begin(), alt.end());
      out.elements.push_back(Element{Element::Kind::end, 0});
    }
  }
  return out;
}

}  // namespace troupe::grammar
