// A context-free grammar over bytes, the form every constraint compiles to (GBNF text
// today; JSON schemas, regular expressions and choices later): rules of alternatives of
// elements, each element a set of bytes or a reference to a rule. Unicode character
// classes are already expanded to their UTF-8 byte sequences, so matching works byte by
// byte, as tokens are bytes.
#pragma once

#include <bitset>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "troupe/result.hpp"

namespace troupe::grammar {

using ByteSet = std::bitset<256>;

struct Element {
  enum class Kind : std::uint8_t {
    bytes,  // one byte from byte_sets[index]
    rule,   // a whole match of rules[index]
    end,    // the end of an alternative (in CompiledGrammar::elements only)
  };
  Kind kind = Kind::end;
  std::uint32_t index = 0;

  friend bool operator==(const Element&, const Element&) = default;
};

using Alternative = std::vector<Element>;

struct Rule {
  std::string name;  // as written, or a made-up one ("value-3") for a group or repetition
  std::vector<Alternative> alternatives;
};

struct Grammar {
  std::vector<Rule> rules;
  std::vector<ByteSet> byte_sets;
  std::uint32_t root = 0;
  std::unordered_map<std::string, std::uint32_t> rule_ids;  // name -> index in rules
  std::unordered_map<ByteSet, std::uint32_t> byte_set_ids;  // set -> index in byte_sets

  // The index of a rule named `name`, adding an empty one if there is none.
  std::uint32_t rule_index(const std::string& name);
  // The index of `set` in byte_sets, adding it if it is new.
  std::uint32_t byte_set_index(const ByteSet& set);
};

// The grammar flattened for matching: each alternative's elements in one array, ended by
// an `end` element, so that a position in a match is one index.
struct CompiledGrammar {
  std::vector<Element> elements;
  std::vector<std::vector<std::uint32_t>> rule_starts;  // [rule] -> each alternative's start
  std::vector<ByteSet> byte_sets;
  std::vector<std::string> rule_names;
  std::uint32_t root = 0;
  std::uint64_t id = 0;  // unique to each compile(): what caches of its states key on
};

// Rules a grammar may have (compile() refuses more): bounds the work of checking it.
inline constexpr std::size_t kMaxRules = 20000;

// Checks `grammar` (every referenced rule defined, no rule that can call itself before
// consuming a byte: a matcher would never finish expanding it) and flattens it.
Result<CompiledGrammar> compile(const Grammar& grammar);

}  // namespace troupe::grammar
