// Regular expressions (the common subset of Python's re and ECMAScript that JSON schema
// `pattern`s and vLLM's guided_regex use) and choices, as grammars. A regex must match
// the whole output: a leading ^ and trailing $ are allowed and change nothing.
// Supported: literals and escapes (\n \t \r \f \v \xHH \uHHHH, escaped punctuation), . (any
// character but a newline), \d \w \s \D \W \S, classes [...] / [^...] (with \d \w \s
// inside), groups ( ) (?: ) (?P<name> ) (?<name> ), |, and * + ? {m} {m,} {m,n} (a lazy or
// possessive suffix is accepted and changes nothing). Refused, with an error saying so:
// lookaround, backreferences, anchors elsewhere, word boundaries, inline flags.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar.hpp"
#include "troupe/result.hpp"

namespace troupe::grammar {

// The GBNF expression (a rule's body) matching exactly what `regex` matches.
Result<std::string> regex_to_gbnf(std::string_view regex);
// A grammar whose root matches `regex`.
Result<Grammar> parse_regex(std::string_view regex);

// A GBNF string literal for `text` (every byte that is not a letter or digit escaped).
std::string gbnf_literal(std::string_view text);
// A grammar matching exactly one of `choices`.
Result<Grammar> parse_choice(const std::vector<std::string>& choices);

}  // namespace troupe::grammar
