// Builds the syntax tree of a Jinja template from its tokens: the statements and the
// expression grammar of jinja2 (with its precedence: `~` binds tighter than `+`,
// filters and tests tighter than any operator).
#pragma once

#include <vector>

#include "text/jinja/ast.hpp"
#include "text/jinja/lexer.hpp"
#include "troupe/result.hpp"

namespace troupe::text::jinja {

// Nesting deeper than this (brackets, operators, blocks) is refused as a syntax error,
// so that a hostile template cannot exhaust the stack.
inline constexpr int kMaxParseDepth = 96;

Result<Body> parse(const std::vector<Token>& tokens);

}  // namespace troupe::text::jinja
