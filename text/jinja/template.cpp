#include "text/jinja/template.hpp"

#include <cmath>
#include <new>

#include "text/jinja/builtins.hpp"
#include "text/jinja/filters.hpp"
#include "text/jinja/lexer.hpp"
#include "text/jinja/parser.hpp"

namespace troupe::text::jinja {

namespace {

// Macro calls nest at most this deep (a macro calling itself must stop somewhere).
constexpr int kMaxCallDepth = 64;
// range() makes at most this many numbers.
constexpr std::int64_t kMaxRange = 1'000'000;

enum class Flow { normal, break_, continue_ };

class Renderer {
 public:
  Renderer(const Dict& variables, const RenderOptions& options) : options_(options) {
    Frame globals;
    globals.vars = variables;
    add_globals(globals.vars);
    frames_.push_back(std::move(globals));
  }

  // A namespace may hold itself ({% set ns.me = ns %}); emptying them all breaks the
  // cycles their shared pointers would otherwise keep alive.
  ~Renderer() {
    for (const auto& ns : namespaces_) ns->clear();
  }
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  std::string run(const Body& body) {
    exec_body(body);
    return std::move(out_);
  }

 private:
  struct Frame {
    Dict vars;
    bool isolated = false;  // a macro's: names it lacks come from the globals only
  };

  // --- statements ---

  Flow exec_body(const Body& body) {
    for (const auto& s : body) {
      const Flow flow = exec(*s);
      if (flow != Flow::normal) return flow;
    }
    return Flow::normal;
  }

  Flow exec(const Stmt& s) {
    try {
      return exec_node(s);
    } catch (Failure& f) {
      if (f.line == 0) {
        f.line = s.line;
        f.column = s.column;
      }
      throw;
    }
  }

  Flow exec_node(const Stmt& s) {
    step();
    switch (s.kind) {
      case Stmt::Kind::text:
        write(s.text);
        return Flow::normal;
      case Stmt::Kind::print:
        write(to_str(eval(*s.expr)));
        return Flow::normal;
      case Stmt::Kind::if_:
        for (const auto& [condition, body] : s.branches) {
          if (eval(*condition).truthy()) return exec_body(body);
        }
        return exec_body(s.orelse);
      case Stmt::Kind::for_:
        exec_for(s);
        return Flow::normal;
      case Stmt::Kind::set:
        exec_set(s);
        return Flow::normal;
      case Stmt::Kind::macro:
        frames_.back().vars.set(s.targets[0], make_macro(s));
        return Flow::normal;
      case Stmt::Kind::break_:
        return Flow::break_;
      case Stmt::Kind::continue_:
        return Flow::continue_;
      case Stmt::Kind::block:
        return exec_body(s.body);
    }
    return Flow::normal;
  }

  // Each turn of the loop has a scope of its own (a `set` inside does not outlive it);
  // the loop's `if` filters the items before loop.index and loop.length count them.
  void exec_for(const Stmt& s) {
    List items;
    for (auto& item : iterate(eval(*s.expr))) {
      if (s.filter) {
        Scope scope(*this);
        bind_targets(s.targets, item);
        if (!eval(*s.filter).truthy()) continue;
      }
      items.push_back(std::move(item));
    }
    const auto n = static_cast<std::int64_t>(items.size());
    for (std::int64_t i = 0; i < n; ++i) {
      step();
      Scope scope(*this);
      bind_targets(s.targets, items[static_cast<std::size_t>(i)]);
      frames_.back().vars.set("loop", loop_object(items, i));
      if (exec_body(s.body) == Flow::break_) break;
    }
    if (items.empty()) {
      Scope scope(*this);
      exec_body(s.orelse);
    }
  }

  static Value loop_object(const List& items, std::int64_t i) {
    const auto n = static_cast<std::int64_t>(items.size());
    Dict loop;
    loop.set("index", i + 1);
    loop.set("index0", i);
    loop.set("revindex", n - i);
    loop.set("revindex0", n - i - 1);
    loop.set("first", i == 0);
    loop.set("last", i == n - 1);
    loop.set("length", n);
    loop.set("depth", 1);
    loop.set("depth0", 0);
    loop.set(
        "cycle",
        Callable{"cycle", [i](const CallArgs& args) -> Value {
                   if (args.positional.empty()) fail("loop.cycle needs arguments");
                   return args.positional[static_cast<std::size_t>(i) % args.positional.size()];
                 }});
    if (i > 0) loop.set("previtem", items[static_cast<std::size_t>(i - 1)]);
    if (i + 1 < n) loop.set("nextitem", items[static_cast<std::size_t>(i + 1)]);
    return loop;
  }

  void bind_targets(const std::vector<std::string>& targets, const Value& value) {
    if (targets.size() == 1) {
      frames_.back().vars.set(targets[0], value);
      return;
    }
    const List parts = iterate(value);
    if (parts.size() != targets.size()) {
      fail("cannot unpack " + std::to_string(parts.size()) + " values into " +
           std::to_string(targets.size()) + " names");
    }
    for (std::size_t i = 0; i < targets.size(); ++i) frames_.back().vars.set(targets[i], parts[i]);
  }

  void exec_set(const Stmt& s) {
    Value value;
    if (s.expr) {
      value = eval(*s.expr);
    } else {  // {% set x %}...{% endset %}
      std::string captured;
      std::swap(captured, out_);
      exec_body(s.body);
      std::swap(captured, out_);
      value = std::move(captured);
    }
    if (s.attribute.empty()) {
      bind_targets(s.targets, value);
      return;
    }
    const Value target = lookup(s.targets[0]);
    if (!target.is_dict() || !target.as_dict().is_namespace) {
      fail("cannot assign attribute on non-namespace object");
    }
    target.mutable_dict().set(s.attribute, std::move(value));
  }

  Value make_macro(const Stmt& s) {
    return Callable{s.targets[0], [this, &s](const CallArgs& args) -> Value {
                      if (depth_ >= kMaxCallDepth) fail("macros call each other too deeply");
                      ++depth_;
                      Frame frame;
                      frame.isolated = true;
                      for (std::size_t i = 0; i < s.params.size(); ++i) {
                        const auto& [name, dflt] = s.params[i];
                        const Value* given = args.get(i, name);
                        frame.vars.set(name, given != nullptr ? *given
                                             : dflt           ? eval(*dflt)
                                                              : Value(Undefined{name}));
                      }
                      frames_.push_back(std::move(frame));
                      std::string captured;
                      std::swap(captured, out_);
                      exec_body(s.body);
                      std::swap(captured, out_);
                      frames_.pop_back();
                      --depth_;
                      return captured;
                    }};
  }

  // --- expressions ---

  Value eval(const Expr& e) {
    try {
      return eval_node(e);
    } catch (Failure& f) {
      if (f.line == 0) {
        f.line = e.line;
        f.column = e.column;
      }
      throw;
    }
  }

  Value eval_node(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::literal:
        return e.value;
      case Expr::Kind::name:
        return lookup(e.name);
      case Expr::Kind::list: {
        List items;
        for (const auto& c : e.children) items.push_back(eval(*c));
        return items;
      }
      case Expr::Kind::dict: {
        Dict d;
        for (std::size_t i = 0; i + 1 < e.children.size(); i += 2) {
          const Value key = eval(*e.children[i]);
          if (!key.is_string()) fail("only string keys are supported in dict literals");
          d.set(key.as_string(), eval(*e.children[i + 1]));
        }
        return d;
      }
      case Expr::Kind::attribute:
        return get_attribute(eval(*e.children[0]), e.name);
      case Expr::Kind::subscript:
        return get_item(eval(*e.children[0]), eval(*e.children[1]));
      case Expr::Kind::slice:
        return eval_slice(e);
      case Expr::Kind::call:
        return eval_call(e);
      case Expr::Kind::filter:
        return apply_filter(e.name, eval(*e.children[0]), eval_args(e));
      case Expr::Kind::test:
        return apply_test(e.name, eval(*e.children[0]), eval_args(e)) != e.negated;
      case Expr::Kind::unary:
        return eval_unary(e);
      case Expr::Kind::binary:
        return eval_binary(e);
      case Expr::Kind::condition:
        if (eval(*e.children[0]).truthy()) return eval(*e.children[1]);
        return e.children[2] ? eval(*e.children[2]) : Value(Undefined{"else"});
    }
    return Undefined{};
  }

  Value eval_slice(const Expr& e) {
    const Value target = eval(*e.children[0]);
    Value parts[3];
    for (int i = 0; i < 3; ++i) {
      if (e.children[static_cast<std::size_t>(i) + 1]) {
        parts[i] = eval(*e.children[static_cast<std::size_t>(i) + 1]);
      }
    }
    auto part = [&](int i) {
      return e.children[static_cast<std::size_t>(i) + 1] ? &parts[i] : nullptr;
    };
    return get_slice(target, part(0), part(1), part(2));
  }

  // Arguments after the first child (a call's callee, a filter's or test's input).
  CallArgs eval_args(const Expr& e) {
    CallArgs args;
    for (std::size_t i = 1; i < e.children.size(); ++i)
      args.positional.push_back(eval(*e.children[i]));
    for (const auto& [key, value] : e.keywords) args.keyword.emplace_back(key, eval(*value));
    return args;
  }

  Value eval_call(const Expr& e) {
    const Value callee = eval(*e.children[0]);
    if (callee.is_undefined()) fail("'" + callee.undefined_name() + "' is undefined");
    if (!callee.is_callable())
      fail("'" + std::string(callee.type_name()) + "' object is not callable");
    return callee.as_callable().call(eval_args(e));
  }

  Value eval_unary(const Expr& e) {
    const Value v = eval(*e.children[0]);
    if (e.name == "not") return !v.truthy();
    if (!v.is_number())
      fail("bad operand type for unary " + e.name + ": '" + std::string(v.type_name()) + "'");
    if (e.name == "+") return v.is_float() ? v : Value(v.to_int());
    if (v.is_float()) return -v.as_float();
    if (v.to_int() == INT64_MIN) fail("integer overflow");
    return -v.to_int();
  }

  Value eval_binary(const Expr& e) {
    const std::string& op = e.name;
    const Value a = eval(*e.children[0]);
    if (op == "and") return a.truthy() ? eval(*e.children[1]) : a;
    if (op == "or") return a.truthy() ? a : eval(*e.children[1]);
    const Value b = eval(*e.children[1]);
    if (op == "==") return equals(a, b);
    if (op == "!=") return !equals(a, b);
    if (op == "<") return less_than(a, b);
    if (op == ">") return less_than(b, a);
    if (op == "<=") return !less_than(b, a);
    if (op == ">=") return !less_than(a, b);
    if (op == "in") return contains(b, a);
    if (op == "not in") return !contains(b, a);
    if (op == "~") return to_str(a) + to_str(b);
    return arithmetic(op, a, b);
  }

  // --- names, output, limits ---

  Value lookup(const std::string& name) const {
    for (auto frame = frames_.rbegin(); frame != frames_.rend(); ++frame) {
      if (const Value* v = frame->vars.find(name)) return *v;
      if (frame->isolated) {
        const Value* v = frames_.front().vars.find(name);
        return v != nullptr ? *v : Value(Undefined{name});
      }
    }
    return Undefined{name};
  }

  void write(const std::string& text) {
    num_output_bytes_ += text.size();
    if (num_output_bytes_ > options_.max_output_bytes) fail("the template's output is too long");
    out_ += text;
  }

  void step() {
    if (++num_steps_ > options_.max_steps) fail("the template runs too long");
  }

  // A scope for one loop turn; the frame goes when it does.
  struct Scope {
    explicit Scope(Renderer& r) : renderer(r) { renderer.frames_.emplace_back(); }
    ~Scope() { renderer.frames_.pop_back(); }
    Renderer& renderer;
  };

  void add_globals(Dict& globals) {
    globals.set("range",
                Callable{"range", [](const CallArgs& args) -> Value { return range(args); }});
    globals.set("namespace",
                Callable{"namespace", [this](const CallArgs& args) -> Value {
                           auto ns = std::make_shared<Dict>();
                           namespaces_.push_back(ns);
                           ns->is_namespace = true;
                           if (!args.positional.empty() && args.positional[0].is_dict()) {
                             ns->items = args.positional[0].as_dict().items;
                           }
                           for (const auto& [k, v] : args.keyword) ns->set(k, v);
                           return Value(std::move(ns));
                         }});
    globals.set("dict", Callable{"dict", [](const CallArgs& args) -> Value {
                                   Dict d;
                                   for (const auto& [k, v] : args.keyword) d.set(k, v);
                                   return d;
                                 }});
    globals.set("raise_exception", Callable{"raise_exception", [](const CallArgs& args) -> Value {
                                              const Value* m = args.get(0, "message");
                                              throw Failure{m != nullptr ? to_str(*m) : "", true};
                                            }});
    globals.set("strftime_now", Callable{"strftime_now", [this](const CallArgs& args) -> Value {
                                           return strftime_now(args);
                                         }});
  }

  static Value range(const CallArgs& args) {
    if (args.positional.empty() || args.positional.size() > 3) fail("range takes 1 to 3 integers");
    std::int64_t start = 0, stop = 0, step = 1;
    if (args.positional.size() == 1) {
      stop = args.positional[0].to_int();
    } else {
      start = args.positional[0].to_int();
      stop = args.positional[1].to_int();
      if (args.positional.size() == 3) step = args.positional[2].to_int();
    }
    if (step == 0) fail("range() arg 3 must not be zero");
    List out;
    for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (static_cast<std::int64_t>(out.size()) >= kMaxRange) fail("range() is too long");
      out.emplace_back(i);
    }
    return out;
  }

  Value strftime_now(const CallArgs& args) const {
    const Value* format = args.get(0, "format");
    if (format == nullptr || !format->is_string()) fail("strftime_now needs a format string");
    std::tm now{};
    if (options_.now) {
      now = options_.now();
    } else {
      const std::time_t t = std::time(nullptr);
      localtime_r(&t, &now);
    }
    char buf[256];
    const std::size_t n = std::strftime(buf, sizeof buf, format->as_string().c_str(), &now);
    return std::string(buf, n);
  }

  const RenderOptions& options_;
  std::vector<std::shared_ptr<Dict>> namespaces_;  // made by namespace(); emptied at the end
  std::vector<Frame> frames_;  // [0]: the variables and globals; then loop turns and macros
  std::string out_;
  std::size_t num_output_bytes_ = 0;
  std::int64_t num_steps_ = 0;
  int depth_ = 0;  // macro calls in progress
};

}  // namespace

Result<Template> Template::parse(std::string_view source) {
  TROUPE_TRY(const auto tokens, lex(source));
  TROUPE_TRY(auto body, jinja::parse(tokens));
  Template t;
  t.body_ = std::make_shared<const Body>(std::move(body));
  return t;
}

Result<std::string> Template::render(const Dict& variables, const RenderOptions& options) const {
  // Failure unwinds the renderer and becomes the error here; nothing escapes.
  try {
    return Renderer(variables, options).run(*body_);
  } catch (const Failure& f) {
    if (f.raised) return make_error(ErrorCode::invalid_argument, f.message);
    return make_error(ErrorCode::invalid_argument, "chat template error at line " +
                                                       std::to_string(f.line) + ", column " +
                                                       std::to_string(f.column) + ": " + f.message);
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::out_of_range, "chat template: out of memory while rendering");
  }
}

}  // namespace troupe::text::jinja
