#include "grammar/matcher.hpp"

#include <algorithm>

namespace troupe::grammar {

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> grammar) : grammar_(std::move(grammar)) {
  std::size_t steps = 0;
  for (const std::uint32_t start : grammar_->rule_starts[grammar_->root]) {
    if (!push_expanded(Stack{start}, stacks_, nullptr, steps)) {
      stacks_.clear();  // past the limits from the start: nothing is allowed (ok() says so)
      ok_ = false;
      return;
    }
  }
  std::sort(stacks_.begin(), stacks_.end());
  stacks_.erase(std::unique(stacks_.begin(), stacks_.end()), stacks_.end());
}

bool Matcher::push_expanded(Stack stack, std::vector<Stack>& out, WorkBudget* budget,
                            std::size_t& steps) const {
  const auto& elements = grammar_->elements;
  // Most bytes land on another byte element (the next character of a literal, a class
  // repeated in place): nothing to expand.
  if (!stack.empty() && elements[stack.back()].kind == Element::Kind::bytes) {
    if ((steps += stack.size()) > kMaxExpansionSteps) return false;
    out.push_back(std::move(stack));
    return out.size() < kMaxStacks || push_checked(out, budget);
  }
  // Branches still to expand: a work list, not recursion, so that a long chain of rules
  // entered without a byte cannot exhaust the thread's stack.
  std::vector<Stack> work;
  work.push_back(std::move(stack));
  while (!work.empty()) {
    Stack s = std::move(work.back());
    work.pop_back();
    while (!s.empty()) {
      if (s.size() > kMaxDepth || ++steps > kMaxExpansionSteps) return false;
      const Element& e = elements[s.back()];
      if (e.kind == Element::Kind::bytes) break;
      if (e.kind == Element::Kind::end) {  // back to where the rule was entered
        s.pop_back();
        continue;
      }
      // Enter the rule: continue after it once one of its alternatives has matched. A rule
      // entered last in its alternative leaves nothing to continue: its frame goes (a tail
      // call), so that repetitions, which recurse on the right, keep stacks flat.
      ++s.back();
      if (elements[s.back()].kind == Element::Kind::end) s.pop_back();
      const auto& starts = grammar_->rule_starts[e.index];
      // Each branch copies the stack: its positions are the work.
      const std::size_t copied = (starts.size() - 1) * (s.size() + 1);
      if ((steps += copied) > kMaxExpansionSteps) return false;
      if (budget != nullptr && !budget->spend(1 + copied)) return false;
      for (std::size_t a = 0; a + 1 < starts.size(); ++a) {
        Stack branch = s;
        branch.push_back(starts[a]);
        work.push_back(std::move(branch));
      }
      s.push_back(starts.back());
    }
    if ((steps += s.size()) > kMaxExpansionSteps) return false;
    out.push_back(std::move(s));
    if (out.size() >= kMaxStacks && !push_checked(out, budget)) return false;
  }
  return true;
}

bool Matcher::push_checked(std::vector<Stack>& out, WorkBudget* budget) {
  // Count distinct branches only. The sort compares whole stacks: about n log n of them.
  if (budget != nullptr && !budget->spend(out.size() * 12)) return false;
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out.size() < kMaxStacks;
}

bool Matcher::advance(const std::vector<Stack>& stacks, std::uint8_t byte, std::vector<Stack>& out,
                      WorkBudget* budget) const {
  out.clear();
  std::size_t steps = 0;  // of this byte, over every branch
  for (const Stack& stack : stacks) {
    if (stack.empty()) continue;  // complete: takes no more bytes
    const Element& e = grammar_->elements[stack.back()];
    if (!grammar_->byte_sets[e.index].test(byte)) continue;
    if (budget != nullptr && !budget->spend(stack.size())) {
      out.clear();
      return false;
    }
    Stack next = stack;
    ++next.back();
    if (!push_expanded(std::move(next), out, budget, steps)) {
      out.clear();
      return false;
    }
  }
  if (out.size() > 1) {
    if (budget != nullptr && !budget->spend(out.size() * 12)) {
      out.clear();
      return false;
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  }
  std::size_t positions = 0;
  for (const Stack& stack : out) positions += stack.size();
  if (positions > kMaxPositions) {
    out.clear();
    return false;
  }
  return !out.empty();
}

bool Matcher::accept_byte(std::uint8_t byte, WorkBudget* budget) {
  std::vector<Stack> next;
  if (!advance(stacks_, byte, next, budget)) return false;
  stacks_ = std::move(next);
  return true;
}

bool Matcher::accept_bytes(std::string_view bytes, WorkBudget* budget) {
  std::vector<Stack> current = stacks_, next;
  for (const char c : bytes) {
    if (!advance(current, static_cast<std::uint8_t>(c), next, budget)) return false;
    current.swap(next);
  }
  stacks_ = std::move(current);
  return true;
}

bool Matcher::can_end() const {
  return std::any_of(stacks_.begin(), stacks_.end(), [](const Stack& s) { return s.empty(); });
}

ByteSet Matcher::next_bytes() const {
  ByteSet bytes;
  for (const Stack& stack : stacks_) {
    if (!stack.empty()) bytes |= grammar_->byte_sets[grammar_->elements[stack.back()].index];
  }
  return bytes;
}

}  // namespace troupe::grammar
