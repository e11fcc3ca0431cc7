// The syntax tree of a Jinja template: expressions and statements as the parser
// builds them and the renderer walks them. Each node keeps its line and column for
// the errors it may raise.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/value.hpp"

namespace troupe::text::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    literal,    // value
    name,       // name
    list,       // children: the items
    dict,       // children: key, value, key, value, ...
    attribute,  // children[0].name
    subscript,  // children[0][children[1]]
    slice,      // children[0][start:stop:step]; absent parts are null
    call,       // children[0](children[1..], keywords)
    filter,     // children[0] | name(children[1..], keywords)
    test,       // children[0] is [not] name(children[1..])
    unary,      // op children[0]: "not", "-", "+"
    binary,     // children[0] op children[1]
    condition,  // children[1] if children[0] else children[2] (null: undefined)
  };
  Kind kind = Kind::literal;
  int line = 0;
  int column = 0;
  Value value;           // literal
  std::string name;      // name, attribute, filter, test; op for unary and binary
  bool negated = false;  // test: "is not"
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    text,   // text
    print,  // {{ expr }}
    if_,    // branches; orelse
    for_,   // for targets in expr [if filter]: body [else orelse]
    set,    // set targets (or target.attribute) = expr, or a block's output when !expr
    macro,  // macro name(params): body
    break_,
    continue_,
    block,  // body rendered as it is ({% generation %})
  };
  Kind kind = Kind::text;
  int line = 0;
  int column = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;                                       // for: the loop's "if"
  std::vector<std::string> targets;                     // for, set; macro: [name]
  std::string attribute;                                // set ns.attribute
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro: name and default (or null)
  std::vector<std::pair<ExprPtr, Body>> branches;       // if / elif
  Body body;
  Body orelse;
};

}  // namespace troupe::text::jinja
