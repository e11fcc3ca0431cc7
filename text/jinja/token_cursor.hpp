// The parser's view of the token list: where it is, what comes next, the checks
// that take a token or fail with its line and column, and the nodes it makes.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/jinja/ast.hpp"
#include "text/jinja/lexer.hpp"
#include "text/jinja/parser.hpp"

namespace troupe::text::jinja {

class TokenCursor {
 protected:
  explicit TokenCursor(const std::vector<Token>& tokens) : tokens_(tokens) {}

  // Counts nesting for the whole parse; deeper than kMaxParseDepth is an error.
  struct Depth {
    explicit Depth(TokenCursor& c) : cursor(c) {
      if (++cursor.depth_ > kMaxParseDepth) cursor.error_here("the template nests too deeply");
    }
    ~Depth() { --cursor.depth_; }
    TokenCursor& cursor;
  };

  const Token& peek() const { return tokens_[pos_]; }
  const Token& next() {
    const Token& t = tokens_[pos_];
    if (t.kind != TokenKind::end) ++pos_;
    return t;
  }
  bool is_op(std::string_view op) const {
    return peek().kind == TokenKind::op && peek().text == op;
  }
  bool is_name(std::string_view name) const {
    return peek().kind == TokenKind::name && peek().text == name;
  }
  bool accept_op(std::string_view op) {
    if (!is_op(op)) return false;
    ++pos_;
    return true;
  }
  bool accept_name(std::string_view name) {
    if (!is_name(name)) return false;
    ++pos_;
    return true;
  }
  void expect_op(std::string_view op) {
    if (!accept_op(op))
      error_here("expected '" + std::string(op) + "', got '" + describe(peek()) + "'");
  }
  void expect_name(std::string_view name) {
    if (!accept_name(name))
      error_here("expected '" + std::string(name) + "', got '" + describe(peek()) + "'");
  }
  const Token& expect_name_token() {
    if (peek().kind != TokenKind::name)
      error_here("expected a name, got '" + describe(peek()) + "'");
    return next();
  }
  void expect(TokenKind kind, std::string_view what) {
    if (peek().kind != kind)
      error_here("expected " + std::string(what) + ", got '" + describe(peek()) + "'");
    ++pos_;
  }
  void end_tag() { expect(TokenKind::block_end, "'%}'"); }

  static std::string describe(const Token& t) {
    switch (t.kind) {
      case TokenKind::end:
        return "end of template";
      case TokenKind::print_begin:
        return "{{";
      case TokenKind::print_end:
        return "}}";
      case TokenKind::block_begin:
        return "{%";
      case TokenKind::block_end:
        return "%}";
      case TokenKind::text:
        return "text";
      default:
        return t.text;
    }
  }

  static StmtPtr make_stmt(Stmt::Kind kind, const Token& t) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = t.line;
    s->column = t.column;
    return s;
  }
  static ExprPtr make_expr(Expr::Kind kind, const Token& t) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = t.line;
    e->column = t.column;
    return e;
  }
  static ExprPtr literal(const Token& t, Value v) {
    auto e = make_expr(Expr::Kind::literal, t);
    e->value = std::move(v);
    return e;
  }
  static ExprPtr binary(const Token& t, std::string op, ExprPtr a, ExprPtr b) {
    auto e = make_expr(Expr::Kind::binary, t);
    e->name = std::move(op);
    e->children.push_back(std::move(a));
    e->children.push_back(std::move(b));
    return e;
  }

  [[noreturn]] void error_here(const std::string& what) const { fail_at(peek(), what); }
  [[noreturn]] static void fail_at(const Token& t, const std::string& what) {
    throw Failure{what, false, t.line, t.column};
  }

  // The list ends with TokenKind::end, which next() never passes.
  const std::vector<Token>& tokens_;
  std::size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace troupe::text::jinja
