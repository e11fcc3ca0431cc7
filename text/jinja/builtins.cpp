#include "text/jinja/builtins.hpp"

#include <algorithm>
#include <cmath>

#include "text/jinja/strings.hpp"

namespace troupe::text::jinja {

namespace {

bool is_dict_method(std::string_view n) {
  return n == "items" || n == "keys" || n == "values" || n == "get";
}

Value bound_method(const Value& object, const std::string& name) {
  return Callable{name, [object, name](const CallArgs& args) -> Value {
                    if (object.is_string()) return string_method(object.as_string(), name, args);
                    return dict_method(object.as_dict(), name, args);
                  }};
}

std::int64_t checked(bool overflowed, std::int64_t value) {
  if (overflowed) fail("integer overflow");
  return value;
}

}  // namespace

Value dict_method(const Dict& d, std::string_view name, const CallArgs& args) {
  if (name == "items") {
    List out;
    for (const auto& [k, v] : d.items) out.emplace_back(List{Value(k), v});
    return out;
  }
  if (name == "keys" || name == "values") {
    List out;
    for (const auto& [k, v] : d.items) out.push_back(name == "keys" ? Value(k) : v);
    return out;
  }
  if (name == "get") {
    const Value* key = args.get(0, "key");
    if (key == nullptr) fail("get needs a key");
    const Value* found = key->is_string() ? d.find(key->as_string()) : nullptr;
    if (found != nullptr) return *found;
    const Value* dflt = args.get(1, "default");
    return dflt != nullptr ? *dflt : Value(nullptr);
  }
  fail("dict has no method '" + std::string(name) + "'");
}

bool apply_test(std::string_view name, const Value& v, const CallArgs& args) {
  auto arg = [&]() -> const Value& {
    const Value* a = args.get(0, "other");
    if (a == nullptr) fail("the test '" + std::string(name) + "' needs an argument");
    return *a;
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict() && !v.as_dict().is_namespace;
  if (name == "iterable") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "sequence") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "callable") return v.is_callable();
  if (name == "odd" || name == "even") {
    if (!v.is_int() && !v.is_bool()) fail("odd/even needs an integer");
    return (v.to_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    const std::int64_t d = arg().to_int();
    if (d == 0) fail("integer division or modulo by zero");
    return v.to_int() % d == 0;
  }
  if (name == "lower" || name == "upper") {
    const std::string s = to_str(v);
    return s == map_chars(s, name == "lower" ? lower : upper);
  }
  if (name == "equalto" || name == "eq" || name == "==" || name == "sameas")
    return equals(v, arg());
  if (name == "ne" || name == "!=") return !equals(v, arg());
  if (name == "lt" || name == "<" || name == "lessthan") return less_than(v, arg());
  if (name == "gt" || name == ">" || name == "greaterthan") return less_than(arg(), v);
  if (name == "le" || name == "<=") return !less_than(arg(), v);
  if (name == "ge" || name == ">=") return !less_than(v, arg());
  if (name == "in") return contains(arg(), v);
  fail("no test named '" + std::string(name) + "'");
}

Value get_attribute(const Value& object, const std::string& name) {
  if (object.is_undefined()) fail("'" + object.undefined_name() + "' is undefined");
  if (object.is_dict()) {
    if (!object.as_dict().is_namespace && is_dict_method(name)) return bound_method(object, name);
    const Value* found = object.as_dict().find(name);
    return found != nullptr ? *found : Value(Undefined{name});
  }
  if (object.is_string() && is_string_method(name)) return bound_method(object, name);
  return Undefined{name};
}

Value get_item(const Value& object, const Value& key) {
  if (object.is_undefined()) fail("'" + object.undefined_name() + "' is undefined");
  if (key.is_int() && (object.is_list() || object.is_string())) {
    std::int64_t i = key.as_int();
    if (object.is_list()) {
      const auto n = static_cast<std::int64_t>(object.as_list().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Undefined{"[" + std::to_string(key.as_int()) + "]"};
      return object.as_list()[static_cast<std::size_t>(i)];
    }
    const auto cps = code_points(object.as_string());
    const auto n = static_cast<std::int64_t>(cps.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Undefined{"[" + std::to_string(key.as_int()) + "]"};
    return std::string(cps[static_cast<std::size_t>(i)]);
  }
  if (object.is_dict() && key.is_string()) {
    if (const Value* found = object.as_dict().find(key.as_string())) return *found;
  }
  if (key.is_string()) return get_attribute(object, key.as_string());
  return Undefined{to_str(key)};
}

Value get_slice(const Value& object, const Value* start_v, const Value* stop_v,
                const Value* step_v) {
  if (object.is_undefined()) fail("'" + object.undefined_name() + "' is undefined");
  const bool is_str = object.is_string();
  if (!is_str && !object.is_list())
    fail("'" + std::string(object.type_name()) + "' cannot be sliced");
  const std::vector<std::string_view> cps =
      is_str ? code_points(object.as_string()) : std::vector<std::string_view>{};
  const auto n = static_cast<std::int64_t>(is_str ? cps.size() : object.as_list().size());
  auto given = [](const Value* v) { return v != nullptr && !v->is_none(); };
  const std::int64_t step = given(step_v) ? step_v->to_int() : 1;
  if (step == 0) fail("slice step cannot be zero");
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](const Value* v, std::int64_t dflt) {
    if (!given(v)) return dflt;
    std::int64_t i = v->to_int();
    if (i < 0) i = std::max<std::int64_t>(i + n, step < 0 ? -1 : 0);
    return std::min<std::int64_t>(i, step < 0 ? n - 1 : n);
  };
  const std::int64_t start = adjust(start_v, step < 0 ? n - 1 : 0);
  const std::int64_t stop = adjust(stop_v, step < 0 ? -1 : n);
  std::string text;
  List items;
  for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (is_str) {
      text += cps[static_cast<std::size_t>(i)];
    } else {
      items.push_back(object.as_list()[static_cast<std::size_t>(i)]);
    }
  }
  return is_str ? Value(std::move(text)) : Value(std::move(items));
}

bool contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string()) fail("'in <string>' requires string as left operand");
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_dict()) return item.is_string() && container.as_dict().find(item.as_string());
  if (container.is_list()) {
    const auto& l = container.as_list();
    return std::any_of(l.begin(), l.end(), [&](const Value& v) { return equals(v, item); });
  }
  if (container.is_undefined()) return false;
  fail("argument of type '" + std::string(container.type_name()) + "' is not iterable");
}

List iterate(const Value& value) {
  if (value.is_list()) return value.as_list();
  if (value.is_undefined()) return {};
  if (value.is_dict()) return dict_method(value.as_dict(), "keys", {}).as_list();
  if (value.is_string()) {
    List out;
    for (const auto cp : code_points(value.as_string())) out.emplace_back(std::string(cp));
    return out;
  }
  fail("'" + std::string(value.type_name()) + "' object is not iterable");
}

bool less_than(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.to_double() < b.to_double();
    return a.to_int() < b.to_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  fail("'<' not supported between '" + std::string(a.type_name()) + "' and '" +
       std::string(b.type_name()) + "'");
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined() || b.is_undefined()) {
    fail("'" + (a.is_undefined() ? a : b).undefined_name() + "' is undefined");
  }
  if (op == "+" && a.is_string() && b.is_string()) return a.as_string() + b.as_string();
  if (op == "+" && a.is_list() && b.is_list()) {
    List out = a.as_list();
    out.insert(out.end(), b.as_list().begin(), b.as_list().end());
    return out;
  }
  if (op == "*" && (a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) {
    const std::int64_t n = b.to_int();
    const std::size_t size = a.is_string() ? a.as_string().size() : a.as_list().size();
    if (n > 0 && size * static_cast<std::size_t>(n) > (std::size_t{1} << 24)) {
      fail("a repeated sequence would be too long");
    }
    if (a.is_string()) {
      std::string out;
      for (std::int64_t i = 0; i < n; ++i) out += a.as_string();
      return out;
    }
    List out;
    for (std::int64_t i = 0; i < n; ++i)
      out.insert(out.end(), a.as_list().begin(), a.as_list().end());
    return out;
  }
  if (!a.is_number() || !b.is_number()) {
    fail("unsupported operand types for " + op + ": '" + std::string(a.type_name()) + "' and '" +
         std::string(b.type_name()) + "'");
  }
  if (op == "/") {
    if (b.to_double() == 0.0) fail("division by zero");
    return a.to_double() / b.to_double();
  }
  if (a.is_float() || b.is_float() || (op == "**" && b.to_int() < 0)) {
    const double x = a.to_double(), y = b.to_double();
    if ((op == "//" || op == "%") && y == 0.0) fail("float division by zero");
    if (op == "+") return x + y;
    if (op == "-") return x - y;
    if (op == "*") return x * y;
    if (op == "//") return std::floor(x / y);
    if (op == "%") return x - std::floor(x / y) * y;
    return std::pow(x, y);
  }
  const std::int64_t x = a.to_int(), y = b.to_int();
  std::int64_t r = 0;
  bool overflowed = false;
  if (op == "+" || op == "-" || op == "*") {
    overflowed = op == "+"   ? __builtin_add_overflow(x, y, &r)
                 : op == "-" ? __builtin_sub_overflow(x, y, &r)
                             : __builtin_mul_overflow(x, y, &r);
    return checked(overflowed, r);
  }
  if (y == 0 && (op == "//" || op == "%")) fail("integer division or modulo by zero");
  if (op == "//" || op == "%") {
    if (x == INT64_MIN && y == -1) fail("integer overflow");
    std::int64_t q = x / y, m = x % y;
    if (m != 0 && ((m < 0) != (y < 0))) {  // Python floors; C++ truncates
      --q;
      m += y;
    }
    return op == "//" ? q : m;
  }
  std::int64_t result = 1;  // **, y >= 0
  for (std::int64_t i = 0; i < y; ++i) {
    if (__builtin_mul_overflow(result, x, &result)) fail("integer overflow");
    if (result == 0 || result == 1) break;
  }
  return result;
}

}  // namespace troupe::text::jinja
