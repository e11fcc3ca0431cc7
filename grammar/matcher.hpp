// One constrained output's place in its grammar, advanced byte by byte: the set of every
// way the bytes so far can continue (a pushdown automaton run on all its branches at once,
// as llama.cpp's grammar does). Each branch is a stack of element positions: the top is
// the byte element to match next; below it, where each rule entered continues. An empty
// stack means the grammar has matched completely.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "grammar/grammar.hpp"
#include "grammar/work_budget.hpp"

namespace troupe::grammar {

class Matcher {
 public:
  using Stack = std::vector<std::uint32_t>;

  // Branches past this many (a grammar ambiguous enough to multiply them) reject the byte.
  static constexpr std::size_t kMaxStacks = 4096;
  // Rules nested deeper than this reject the byte (a JSON value nested 1000 deep, say).
  static constexpr std::size_t kMaxDepth = 2048;
  // All branches' positions together past this reject the byte: a state stays under 1 MB,
  // and a token mask's walk, which keeps one state per byte of a token, under ~100 MB.
  static constexpr std::size_t kMaxPositions = std::size_t{1} << 18;
  // Work one byte may take, in all branches: rule entries expanded through, and positions
  // of the branches copied and kept. Past it the byte is refused (a matcher that copies
  // thousands of deep branches per byte would otherwise take seconds a byte).
  static constexpr std::size_t kMaxExpansionSteps = std::size_t{1} << 20;

  explicit Matcher(std::shared_ptr<const CompiledGrammar> grammar);
  // False when the grammar's start already passes the limits: such a matcher allows
  // nothing, and its grammar should be refused where it was given.
  bool ok() const { return ok_; }

  // Advances by one byte; false, with the state unchanged, where the grammar forbids it
  // (or where `budget` runs out: budget->exhausted() tells the two apart).
  bool accept_byte(std::uint8_t byte, WorkBudget* budget = nullptr);
  // Advances by every byte of `bytes`, or by none of them (false).
  bool accept_bytes(std::string_view bytes, WorkBudget* budget = nullptr);
  // Whether the output may end here (some branch has matched the whole grammar).
  bool can_end() const;
  // The bytes that may come next.
  ByteSet next_bytes() const;

  const CompiledGrammar& grammar() const { return *grammar_; }
  const std::vector<Stack>& stacks() const { return stacks_; }
  // The branches after `byte` from `stacks` (empty if none accepts it); for TokenMasker.
  // Every position copied or expanded through is spent from `budget`, if given: false,
  // with `out` empty, once it runs out.
  bool advance(const std::vector<Stack>& stacks, std::uint8_t byte, std::vector<Stack>& out,
               WorkBudget* budget = nullptr) const;

 private:
  // Adds `stack`, its top expanded through rule entries and ends until it is a byte
  // element or empty; false where a limit is passed or `budget` runs out. `steps` counts
  // the expansion steps of the whole byte, every branch's (kMaxExpansionSteps).
  bool push_expanded(Stack stack, std::vector<Stack>& out, WorkBudget* budget,
                     std::size_t& steps) const;
  // Sorts out and drops repeated branches; false when kMaxStacks distinct ones remain.
  static bool push_checked(std::vector<Stack>& out, WorkBudget* budget);

  std::shared_ptr<const CompiledGrammar> grammar_;
  std::vector<Stack> stacks_;
  bool ok_ = true;
};

}  // namespace troupe::grammar
