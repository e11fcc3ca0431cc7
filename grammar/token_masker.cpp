#include "grammar/token_masker.hpp"

#include <algorithm>
#include <string_view>
#include <unordered_map>

namespace troupe::grammar {

TokenMasker::TokenMasker(std::vector<std::string> token_bytes)
    : token_bytes_(std::move(token_bytes)) {
  for (std::int32_t id = 0; id < vocab_size(); ++id) {
    if (!token_bytes_[id].empty()) sorted_.push_back(id);
  }
  std::sort(sorted_.begin(), sorted_.end(),
            [&](std::int32_t a, std::int32_t b) { return token_bytes_[a] < token_bytes_[b]; });
}

std::size_t TokenMasker::KeyHash::operator()(const Key& key) const {
  std::uint64_t h = key.grammar * 0x9E3779B97F4A7C15ull;
  for (const std::uint32_t p : key.stack) h = (h ^ p) * 0x100000001B3ull;
  return static_cast<std::size_t>(h);
}

std::size_t TokenMasker::num_cached_masks() const {
  std::lock_guard lock(mutex_);
  return cache_.size();
}

bool TokenMasker::fill_mask(const Matcher& matcher, std::vector<std::uint64_t>& allowed,
                            WorkBudget* budget) const {
  allowed.assign((token_bytes_.size() + 63) / 64, 0);
  // A token is allowed when one branch takes it: the union of each branch's mask.
  for (const Matcher::Stack& stack : matcher.stacks()) {
    if (stack.empty()) continue;  // complete: takes no more bytes
    Key key{matcher.grammar().id, stack};
    std::shared_ptr<const Mask> mask;
    {
      std::lock_guard lock(mutex_);
      if (const auto it = cache_.find(key); it != cache_.end()) mask = it->second;
    }
    if (!mask) {
      // What the top position decides alone, then the undecided tokens on the whole stack.
      const std::shared_ptr<const TopClass> top = classify(matcher, stack.back(), budget);
      if (!top) return false;
      auto computed = std::make_shared<Mask>(top->accepted);
      if (!top->uncertain.empty() &&
          !walk(matcher, stack, top->uncertain, *computed, nullptr, budget)) {
        return false;
      }
      mask = computed;
      std::lock_guard lock(mutex_);
      if (cache_.size() >= kMaxCachedMasks) cache_.clear();
      cache_.emplace(std::move(key), mask);
    }
    for (std::size_t i = 0; i < allowed.size(); ++i) allowed[i] |= (*mask)[i];
  }
  return true;
}

std::shared_ptr<const TokenMasker::TopClass> TokenMasker::classify(const Matcher& matcher,
                                                                   std::uint32_t top,
                                                                   WorkBudget* budget) const {
  Key key{matcher.grammar().id, Matcher::Stack{top}};
  {
    std::lock_guard lock(mutex_);
    if (const auto it = classes_.find(key); it != classes_.end()) return it->second;
  }
  auto computed = std::make_shared<TopClass>();
  computed->accepted.assign((token_bytes_.size() + 63) / 64, 0);
  if (!walk(matcher, key.stack, sorted_, computed->accepted, &computed->uncertain, budget)) {
    return nullptr;
  }
  std::lock_guard lock(mutex_);
  if (classes_.size() >= kMaxCachedMasks) classes_.clear();
  classes_.emplace(std::move(key), computed);
  return computed;
}

namespace {

// The branch sets one walk meets, each once, with the transitions between them: a byte's
// step from a set is a pure function of the two, so it is computed once per walk (inside a
// string, every token's every byte steps between the same few sets).
class StepMemo {
 public:
  StepMemo(const Matcher& matcher, const Matcher::Stack& start, WorkBudget* budget)
      : matcher_(matcher), budget_(budget) {
    std::vector<Matcher::Stack> first{start};
    intern(std::move(first));
  }

  // The set after `byte` from set `from`, or -1 where no branch takes it (or the budget
  // ran out: then nothing is remembered, and the walk ends).
  std::int32_t step(std::int32_t from, std::uint8_t byte) {
    const std::uint64_t key = (static_cast<std::uint64_t>(from) << 8) | byte;
    if (const auto it = next_.find(key); it != next_.end()) return it->second;
    std::vector<Matcher::Stack> out;
    const bool taken = matcher_.advance(sets_[static_cast<std::size_t>(from)], byte, out, budget_);
    if (budget_ != nullptr && budget_->exhausted()) return -1;
    const std::int32_t to = taken ? intern(std::move(out)) : -1;
    next_.emplace(key, to);
    return to;
  }
  // Whether a branch of set `id` has left the walk's start (an empty stack).
  bool leaves(std::int32_t id) const { return leaves_[static_cast<std::size_t>(id)] != 0; }

 private:
  struct Hash {
    std::size_t operator()(const std::vector<Matcher::Stack>& sets) const {
      std::uint64_t h = 0xcbf29ce484222325ull;
      for (const auto& stack : sets) {
        h = (h ^ 0xffu) * 0x100000001B3ull;
        for (const std::uint32_t p : stack) h = (h ^ p) * 0x100000001B3ull;
      }
      return static_cast<std::size_t>(h);
    }
  };

  std::int32_t intern(std::vector<Matcher::Stack>&& set) {
    if (const auto it = ids_.find(set); it != ids_.end()) return it->second;
    const auto id = static_cast<std::int32_t>(sets_.size());
    leaves_.push_back(
        std::any_of(set.begin(), set.end(), [](const Matcher::Stack& s) { return s.empty(); }) ? 1
                                                                                               : 0);
    sets_.push_back(set);
    ids_.emplace(std::move(set), id);
    return id;
  }

  const Matcher& matcher_;
  WorkBudget* budget_;
  std::vector<std::vector<Matcher::Stack>> sets_;
  std::vector<char> leaves_;
  std::unordered_map<std::vector<Matcher::Stack>, std::int32_t, Hash> ids_;
  std::unordered_map<std::uint64_t, std::int32_t> next_;
};

}  // namespace

bool TokenMasker::walk(const Matcher& matcher, const Matcher::Stack& stack,
                       const std::vector<std::int32_t>& ids, Mask& allowed,
                       std::vector<std::int32_t>* uncertain, WorkBudget* budget) const {
  // path[d]: the branch set after the first d bytes of the current token; left[d]: whether
  // one of path[0..d] left `stack` (a branch that matched it to its end: an empty stack),
  // so that, with `uncertain`, what follows depends on the frames below it. A prefix the
  // grammar rejected is remembered, so that the tokens after it that share it are decided
  // at once.
  StepMemo memo(matcher, stack, budget);
  std::vector<std::int32_t> path(1, 0);
  std::vector<char> left(1, 0);
  std::string_view previous;
  std::size_t dead_prefix = 0;  // bytes of `previous` whose last byte was rejected; 0: none
  bool dead_left = false;       // whether a branch had left before that prefix died
  for (const std::int32_t id : ids) {
    const std::string_view bytes = token_bytes_[id];
    std::size_t common = 0;
    const std::size_t limit = std::min(bytes.size(), previous.size());
    while (common < limit && bytes[common] == previous[common]) ++common;
    previous = bytes;
    // Every token visited costs a step, and every byte matched one more.
    if (budget != nullptr && !budget->spend(1)) return false;
    if (dead_prefix != 0 && common >= dead_prefix) {  // starts with a rejected prefix
      if (dead_left && uncertain != nullptr) uncertain->push_back(id);
      continue;
    }
    dead_prefix = 0;
    // path[0..common] holds for this token too; match the rest (a byte each).
    if (budget != nullptr && !budget->spend(bytes.size() - common)) return false;
    path.resize(common + 1);
    left.resize(common + 1);
    bool alive = true;
    for (std::size_t d = common; d < bytes.size(); ++d) {
      const std::int32_t next = memo.step(path[d], static_cast<std::uint8_t>(bytes[d]));
      if (budget != nullptr && budget->exhausted()) return false;
      if (next < 0) {
        dead_prefix = d + 1;
        dead_left = left[d] != 0;
        alive = false;
        break;
      }
      left.push_back(left[d] != 0 || memo.leaves(next) ? 1 : 0);
      path.push_back(next);
    }
    if (alive) {
      // Taken whole, by a branch inside `stack` or by one that left it at the last byte
      // (the frames below then hold, and need no more of this token).
      allowed[static_cast<std::size_t>(id) / 64] |= std::uint64_t{1} << (id % 64);
    } else if (dead_left && uncertain != nullptr) {
      uncertain->push_back(id);
    }
  }
  return true;
}

}  // namespace troupe::grammar
