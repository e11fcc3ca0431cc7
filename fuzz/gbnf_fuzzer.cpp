// GBNF text from anywhere (a request's `grammar`): parsing and compiling either succeed or
// fail with an error, never crash; a grammar that compiles is then matched against the
// input's own bytes (within a work budget), and its next-byte set must agree with what
// accept_byte does.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "grammar/gbnf.hpp"
#include "grammar/matcher.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto grammar = troupe::grammar::parse_gbnf(text);
  if (!grammar) return 0;
  auto compiled = troupe::grammar::compile(*grammar);
  if (!compiled) return 0;
  troupe::grammar::Matcher matcher(
      std::make_shared<const troupe::grammar::CompiledGrammar>(std::move(*compiled)));
  // The input's bytes under one work budget, as a server's matcher works (grammar/
  // work_budget.hpp): a grammar whose branches multiply stops there, not at the timeout.
  troupe::grammar::WorkBudget budget(std::uint64_t{1} << 22);
  for (std::size_t i = 0; i < size && i < 256; ++i) {
    const bool allowed = matcher.next_bytes().test(data[i]);
    troupe::grammar::Matcher probe = matcher;
    const bool accepted = probe.accept_byte(data[i], &budget);
    if (budget.exhausted()) break;
    // A byte in next_bytes can still be refused where the limits cut branches.
    if (accepted && !allowed) __builtin_trap();
    if (!accepted) break;
    matcher = probe;
  }
  (void)matcher.can_end();
  return 0;
}
