#include "text/jinja/parser.hpp"

#include "text/jinja/token_cursor.hpp"

#include <initializer_list>
#include <string_view>

namespace troupe::text::jinja {

namespace {

class Parser : TokenCursor {
 public:
  explicit Parser(const std::vector<Token>& tokens) : TokenCursor(tokens) {}

  Body parse_template() {
    Body body = parse_body({});
    if (peek().kind != TokenKind::end) error_here("unexpected '" + peek().text + "' tag");
    return body;
  }

 private:
  // --- statements ---

  // Statements up to (not taking) a block tag named in `ends`, or the template's end.
  Body parse_body(std::initializer_list<std::string_view> ends) {
    Depth depth(*this);
    Body body;
    while (true) {
      const Token& t = peek();
      if (t.kind == TokenKind::end) {
        if (ends.size() > 0)
          error_here("the template ends inside a block: expected '" + std::string(*ends.begin()) +
                     "'");
        return body;
      }
      if (t.kind == TokenKind::text) {
        auto s = make_stmt(Stmt::Kind::text, t);
        s->text = t.text;
        body.push_back(std::move(s));
        ++pos_;
      } else if (t.kind == TokenKind::print_begin) {
        auto s = make_stmt(Stmt::Kind::print, t);
        ++pos_;
        s->expr = parse_tuple();
        expect(TokenKind::print_end, "'}}'");
        body.push_back(std::move(s));
      } else if (t.kind == TokenKind::block_begin) {
        const Token& name = tokens_[pos_ + 1];
        for (const auto end : ends) {
          if (name.kind == TokenKind::name && name.text == end) return body;
        }
        ++pos_;
        body.push_back(parse_statement());
      } else {
        error_here("unexpected '" + t.text + "'");
      }
    }
  }

  StmtPtr parse_statement() {
    const Token& t = peek();
    if (t.kind != TokenKind::name) error_here("expected a statement name");
    ++pos_;
    if (t.text == "if") return parse_if(t);
    if (t.text == "for") return parse_for(t);
    if (t.text == "set") return parse_set(t);
    if (t.text == "macro") return parse_macro(t);
    if (t.text == "break" || t.text == "continue") {
      auto s = make_stmt(t.text == "break" ? Stmt::Kind::break_ : Stmt::Kind::continue_, t);
      end_tag();
      return s;
    }
    if (t.text == "generation") {  // Hugging Face's marker of the assistant's tokens
      auto s = make_stmt(Stmt::Kind::block, t);
      end_tag();
      s->body = parse_body({"endgeneration"});
      close_block("endgeneration");
      return s;
    }
    fail_at(t, "unknown or unsupported tag '" + t.text + "'");
  }

  StmtPtr parse_if(const Token& t) {
    auto s = make_stmt(Stmt::Kind::if_, t);
    ExprPtr condition = parse_expression();
    end_tag();
    while (true) {
      Body body = parse_body({"elif", "else", "endif"});
      s->branches.emplace_back(std::move(condition), std::move(body));
      ++pos_;  // the block_begin
      const std::string which = next().text;
      if (which == "elif") {
        condition = parse_expression();
        end_tag();
        continue;
      }
      if (which == "else") {
        end_tag();
        s->orelse = parse_body({"endif"});
        close_block("endif");
      } else {
        end_tag();
      }
      return s;
    }
  }

  StmtPtr parse_for(const Token& t) {
    auto s = make_stmt(Stmt::Kind::for_, t);
    s->targets = parse_targets();
    expect_name("in");
    s->expr = parse_tuple(/*with_condition=*/false);
    if (accept_name("if")) s->filter = parse_expression();
    if (peek().kind == TokenKind::name && peek().text == "recursive") {
      error_here("recursive loops are not supported");
    }
    end_tag();
    s->body = parse_body({"else", "endfor"});
    if (tokens_[pos_ + 1].text == "else") {
      pos_ += 2;
      end_tag();
      s->orelse = parse_body({"endfor"});
    }
    close_block("endfor");
    return s;
  }

  StmtPtr parse_set(const Token& t) {
    auto s = make_stmt(Stmt::Kind::set, t);
    s->targets = parse_targets();
    if (s->targets.size() == 1 && accept_op(".")) s->attribute = expect_name_token().text;
    if (accept_op("=")) {
      s->expr = parse_tuple();
      end_tag();
      return s;
    }
    if (!s->attribute.empty() || s->targets.size() != 1) error_here("expected '='");
    end_tag();
    s->body = parse_body({"endset"});
    close_block("endset");
    return s;
  }

  StmtPtr parse_macro(const Token& t) {
    auto s = make_stmt(Stmt::Kind::macro, t);
    s->targets.push_back(expect_name_token().text);
    expect_op("(");
    while (!accept_op(")")) {
      if (!s->params.empty()) expect_op(",");
      if (accept_op(")")) break;
      std::string name = expect_name_token().text;
      ExprPtr default_value = accept_op("=") ? parse_expression() : nullptr;
      s->params.emplace_back(std::move(name), std::move(default_value));
    }
    end_tag();
    s->body = parse_body({"endmacro"});
    close_block("endmacro");
    return s;
  }

  std::vector<std::string> parse_targets() {
    const bool parenthesized = accept_op("(");
    std::vector<std::string> names{expect_name_token().text};
    while (accept_op(",")) names.push_back(expect_name_token().text);
    if (parenthesized) expect_op(")");
    return names;
  }

  // Takes "{% name %}" (the name already known to be there).
  void close_block(std::string_view name) {
    ++pos_;
    expect_name(name);
    end_tag();
  }

  // --- expressions, loosest first ---

  // An expression, or several separated by commas (a tuple, as a list).
  ExprPtr parse_tuple(bool with_condition = true) {
    const Token& t = peek();
    ExprPtr first = with_condition ? parse_expression() : parse_or();
    if (!is_op(",")) return first;
    auto list = make_expr(Expr::Kind::list, t);
    list->children.push_back(std::move(first));
    while (accept_op(",")) {
      if (peek().kind == TokenKind::block_end || peek().kind == TokenKind::print_end) break;
      list->children.push_back(with_condition ? parse_expression() : parse_or());
    }
    return list;
  }

  ExprPtr parse_expression() {
    Depth depth(*this);
    ExprPtr e = parse_or();
    while (is_name("if")) {
      auto c = make_expr(Expr::Kind::condition, next());
      c->children.push_back(parse_or());
      c->children.push_back(std::move(e));
      c->children.push_back(accept_name("else") ? parse_expression() : nullptr);
      e = std::move(c);
    }
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const Token& t = next();
      e = binary(t, "or", std::move(e), parse_and());
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const Token& t = next();
      e = binary(t, "and", std::move(e), parse_not());
    }
    return e;
  }

  ExprPtr parse_not() {
    if (!is_name("not")) return parse_compare();
    Depth depth(*this);
    auto u = make_expr(Expr::Kind::unary, next());
    u->name = "not";
    u->children.push_back(parse_not());
    return u;
  }

  ExprPtr parse_compare() {
    ExprPtr e = parse_add();
    while (true) {
      const Token& t = peek();
      if (t.kind == TokenKind::op && (t.text == "==" || t.text == "!=" || t.text == "<" ||
                                      t.text == "<=" || t.text == ">" || t.text == ">=")) {
        ++pos_;
        e = binary(t, t.text, std::move(e), parse_add());
      } else if (is_name("in")) {
        ++pos_;
        e = binary(t, "in", std::move(e), parse_add());
      } else if (is_name("not") && tokens_[pos_ + 1].kind == TokenKind::name &&
                 tokens_[pos_ + 1].text == "in") {
        pos_ += 2;
        e = binary(t, "not in", std::move(e), parse_add());
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_add() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      e = binary(t, t.text, std::move(e), parse_concat());
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_multiply();
    while (is_op("~")) {
      const Token& t = next();
      e = binary(t, "~", std::move(e), parse_multiply());
    }
    return e;
  }

  ExprPtr parse_multiply() {
    ExprPtr e = parse_power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      e = binary(t, t.text, std::move(e), parse_power());
    }
    return e;
  }

  ExprPtr parse_power() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const Token& t = next();
      e = binary(t, "**", std::move(e), parse_unary(true));
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    Depth depth(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = make_expr(Expr::Kind::unary, peek());
      e->name = next().text;
      e->children.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    return with_filter ? parse_filters(std::move(e)) : std::move(e);
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    if (t.kind == TokenKind::name) {
      ++pos_;
      if (t.text == "true" || t.text == "True") return literal(t, true);
      if (t.text == "false" || t.text == "False") return literal(t, false);
      if (t.text == "none" || t.text == "None") return literal(t, nullptr);
      auto e = make_expr(Expr::Kind::name, t);
      e->name = t.text;
      return e;
    }
    if (t.kind == TokenKind::string) {
      std::string s;
      while (peek().kind == TokenKind::string) s += next().text;  // "a" "b" is "ab"
      return literal(t, std::move(s));
    }
    if (t.kind == TokenKind::integer) return ++pos_, literal(t, t.integer);
    if (t.kind == TokenKind::floating) return ++pos_, literal(t, t.floating);
    if (accept_op("(")) {
      if (accept_op(")")) return make_expr(Expr::Kind::list, t);
      ExprPtr e = parse_tuple();
      expect_op(")");
      return e;
    }
    if (accept_op("[")) {
      auto e = make_expr(Expr::Kind::list, t);
      while (!accept_op("]")) {
        if (!e->children.empty()) expect_op(",");
        if (accept_op("]")) break;
        e->children.push_back(parse_expression());
      }
      return e;
    }
    if (accept_op("{")) {
      auto e = make_expr(Expr::Kind::dict, t);
      while (!accept_op("}")) {
        if (!e->children.empty()) expect_op(",");
        if (accept_op("}")) break;
        e->children.push_back(parse_expression());
        expect_op(":");
        e->children.push_back(parse_expression());
      }
      return e;
    }
    error_here(t.kind == TokenKind::end ? "unexpected end of template"
                                        : "unexpected '" + describe(t) + "'");
  }

  // .name, [index], [start:stop:step] and calls.
  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      const Token& t = peek();
      if (accept_op(".")) {
        if (peek().kind == TokenKind::integer) {
          auto s = make_expr(Expr::Kind::subscript, t);
          s->children.push_back(std::move(e));
          s->children.push_back(literal(peek(), next().integer));
          e = std::move(s);
          continue;
        }
        auto a = make_expr(Expr::Kind::attribute, t);
        a->name = expect_name_token().text;
        a->children.push_back(std::move(e));
        e = std::move(a);
      } else if (accept_op("[")) {
        e = parse_subscript(t, std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(const Token& t, ExprPtr target) {
    Depth depth(*this);
    ExprPtr start = is_op(":") ? nullptr : parse_expression();
    if (!accept_op(":")) {
      expect_op("]");
      auto s = make_expr(Expr::Kind::subscript, t);
      s->children.push_back(std::move(target));
      s->children.push_back(std::move(start));
      return s;
    }
    auto s = make_expr(Expr::Kind::slice, t);
    s->children.push_back(std::move(target));
    s->children.push_back(std::move(start));
    s->children.push_back(is_op(":") || is_op("]") ? nullptr : parse_expression());
    s->children.push_back(accept_op(":") && !is_op("]") ? parse_expression() : nullptr);
    expect_op("]");
    return s;
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto c = make_expr(Expr::Kind::call, peek());
    c->children.push_back(std::move(callee));
    parse_arguments(*c);
    return c;
  }

  // "(a, b, key=value)" into children (after the first) and keywords.
  void parse_arguments(Expr& e) {
    Depth depth(*this);
    expect_op("(");
    bool first = true;
    while (!accept_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (accept_op(")")) break;
      if (peek().kind == TokenKind::name && tokens_[pos_ + 1].kind == TokenKind::op &&
          tokens_[pos_ + 1].text == "=") {
        std::string key = next().text;
        ++pos_;
        e.keywords.emplace_back(std::move(key), parse_expression());
      } else {
        if (!e.keywords.empty()) error_here("a positional argument follows a keyword argument");
        e.children.push_back(parse_expression());
      }
    }
  }

  // "| filter(args)", "is [not] test args" and calls after them.
  ExprPtr parse_filters(ExprPtr e) {
    while (true) {
      const Token& t = peek();
      if (accept_op("|")) {
        auto f = make_expr(Expr::Kind::filter, t);
        f->name = expect_name_token().text;
        f->children.push_back(std::move(e));
        if (is_op("(")) parse_arguments(*f);
        e = std::move(f);
      } else if (accept_name("is")) {
        auto test = make_expr(Expr::Kind::test, t);
        test->negated = accept_name("not");
        test->name = expect_name_token().text;
        test->children.push_back(std::move(e));
        if (is_op("(")) {
          parse_arguments(*test);
        } else if (starts_test_argument(peek())) {
          test->children.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(test);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  // jinja2 takes one bare argument after a test name ("is equalto 3", "is sameas none").
  static bool starts_test_argument(const Token& t) {
    if (t.kind == TokenKind::name) {
      return t.text != "else" && t.text != "or" && t.text != "and" && t.text != "if" &&
             t.text != "is" && t.text != "in" && t.text != "not";
    }
    return t.kind == TokenKind::string || t.kind == TokenKind::integer ||
           t.kind == TokenKind::floating ||
           (t.kind == TokenKind::op && (t.text == "[" || t.text == "{"));
  }
};

}  // namespace

Result<Body> parse(const std::vector<Token>& tokens) {
  if (tokens.empty() || tokens.back().kind != TokenKind::end) {
    return make_error(ErrorCode::invalid_argument, "chat template: no tokens to parse");
  }
  // Failure stays inside: the parser throws it to unwind, and it becomes the error here.
  try {
    return Parser(tokens).parse_template();
  } catch (const Failure& f) {
    return make_error(ErrorCode::invalid_argument, "chat template syntax error at line " +
                                                       std::to_string(f.line) + ", column " +
                                                       std::to_string(f.column) + ": " + f.message);
  }
}

}  // namespace troupe::text::jinja
