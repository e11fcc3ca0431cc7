// GBNF, llama.cpp's grammar notation, parsed into a Grammar:
//   root ::= "{" ws pair ("," ws pair)* "}"      # comments run to the end of the line
//   pair ::= [a-z]+ ":" ws ( "true" | "false" )
//   ws   ::= [ \t\n]*
// Literals "..." and character classes [...] / [^...] (escapes \n \r \t \\ \" \] \- \xHH
// \uHHHH \UHHHHHHHH), `.` for any character, groups ( ... ), alternatives |, and the
// repetitions * + ? {m} {m,} {m,n}. A rule ends at a newline outside parentheses; the
// grammar starts at `root`.
#pragma once

#include <string_view>

#include "grammar/grammar.hpp"
#include "troupe/result.hpp"

namespace troupe::grammar {

// Rules named with this prefix (and the rules they use) take no byte that a JSON string's
// text would have to escape: no control character, quote or backslash. A JSON schema's
// `pattern` matches a string's characters while the output is its JSON text; the schema's
// GBNF names its pattern rules so, and whoever parses that text again gets the same
// grammar. A literal in such a rule that needs one of those bytes is an error.
inline constexpr std::string_view kJsonSafeRulePrefix = "json-safe-";

// Parentheses nested deeper than this are an error (the parser recurses once a level).
inline constexpr int kMaxGbnfNesting = 64;

// The grammar `text` describes, or an error that says where (line:column) and why.
Result<Grammar> parse_gbnf(std::string_view text);

}  // namespace troupe::grammar
