#include "text/jinja_builtins.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace troupe::text::jinja {

namespace {

// --- strings (case mapping and whitespace are ASCII's; chat templates need no more) ---

bool is_py_space(char c) {
  return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f');
}
char upper(char c) {
  return c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c;
}
char lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c;
}
bool is_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || static_cast<unsigned char>(c) >= 0x80;
}

std::string strip(const std::string& s, const Value* chars, bool left, bool right) {
  auto drop = [&](char c) {
    if (chars == nullptr || chars->is_none()) return is_py_space(c);
    if (!chars->is_string()) fail("strip arg must be None or str");
    return chars->as_string().find(c) != std::string::npos;
  };
  std::size_t begin = 0, end = s.size();
  while (left && begin < end && drop(s[begin])) ++begin;
  while (right && end > begin && drop(s[end - 1])) --end;
  return s.substr(begin, end - begin);
}

std::string map_chars(std::string s, char (*f)(char)) {
  for (char& c : s) c = f(c);
  return s;
}

std::string capitalize(const std::string& s) {
  std::string out = map_chars(s, lower);
  if (!out.empty()) out[0] = upper(out[0]);
  return out;
}

// str.title(): a letter after a non-letter is upper case, the others lower case.
std::string title(const std::string& s) {
  std::string out = s;
  bool previous_letter = false;
  for (char& c : out) {
    c = previous_letter ? lower(c) : upper(c);
    previous_letter = is_alpha(c);
  }
  return out;
}

std::string replace(const std::string& s, const std::string& from, const std::string& to,
                    std::int64_t count) {
  if (from.empty()) fail("replacing an empty string is not supported");
  std::string out;
  std::size_t pos = 0;
  for (std::int64_t n = 0; count < 0 || n < count; ++n) {
    const std::size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += to;
    pos = hit + from.size();
  }
  return out + s.substr(pos);
}

List split(const std::string& s, const Value* sep, std::int64_t max_split) {
  List out;
  if (sep == nullptr || sep->is_none()) {  // runs of whitespace, no empty parts
    std::size_t i = 0;
    while (true) {
      while (i < s.size() && is_py_space(s[i])) ++i;
      if (i >= s.size()) break;
      if (max_split >= 0 && static_cast<std::int64_t>(out.size()) == max_split) {
        out.emplace_back(strip(s.substr(i), nullptr, false, true));
        break;
      }
      std::size_t j = i;
      while (j < s.size() && !is_py_space(s[j])) ++j;
      out.emplace_back(s.substr(i, j - i));
      i = j;
    }
    return out;
  }
  if (!sep->is_string() || sep->as_string().empty()) fail("split needs a non-empty separator");
  const std::string& d = sep->as_string();
  std::size_t pos = 0;
  while (max_split < 0 || static_cast<std::int64_t>(out.size()) < max_split) {
    const std::size_t hit = s.find(d, pos);
    if (hit == std::string::npos) break;
    out.emplace_back(s.substr(pos, hit - pos));
    pos = hit + d.size();
  }
  out.emplace_back(s.substr(pos));
  return out;
}

bool affix_matches(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Value& a) {
    if (!a.is_string()) fail("startswith/endswith takes a string or a tuple of strings");
    return prefix ? s.starts_with(a.as_string()) : s.ends_with(a.as_string());
  };
  if (affix.is_list()) {
    return std::any_of(affix.as_list().begin(), affix.as_list().end(), one);
  }
  return one(affix);
}

const std::string& need_string(const Value& v, std::string_view what) {
  if (!v.is_string())
    fail(std::string(what) + " needs a string, got " + std::string(v.type_name()));
  return v.as_string();
}

std::int64_t int_arg(const CallArgs& args, std::size_t i, std::string_view name,
                     std::int64_t dflt) {
  const Value* v = args.get(i, name);
  return v == nullptr || v->is_none() ? dflt : v->to_int();
}
bool bool_arg(const CallArgs& args, std::size_t i, std::string_view name, bool dflt) {
  const Value* v = args.get(i, name);
  return v == nullptr ? dflt : v->truthy();
}

// --- methods of str and dict ---

Value string_method(const std::string& s, std::string_view name, const CallArgs& args) {
  if (name == "strip") return strip(s, args.get(0, "chars"), true, true);
  if (name == "lstrip") return strip(s, args.get(0, "chars"), true, false);
  if (name == "rstrip") return strip(s, args.get(0, "chars"), false, true);
  if (name == "upper") return map_chars(s, upper);
  if (name == "lower") return map_chars(s, lower);
  if (name == "title") return title(s);
  if (name == "capitalize") return capitalize(s);
  if (name == "split") return split(s, args.get(0, "sep"), int_arg(args, 1, "maxsplit", -1));
  if (name == "startswith" || name == "endswith") {
    const Value* affix = args.get(0, "prefix");
    if (affix == nullptr) fail(std::string(name) + " needs an argument");
    return affix_matches(s, *affix, name == "startswith");
  }
  if (name == "replace") {
    const Value* from = args.get(0, "old");
    const Value* to = args.get(1, "new");
    if (from == nullptr || to == nullptr) fail("replace needs two arguments");
    return replace(s, need_string(*from, "replace"), need_string(*to, "replace"),
                   int_arg(args, 2, "count", -1));
  }
  if (name == "find") {
    const Value* what = args.get(0, "sub");
    if (what == nullptr) fail("find needs an argument");
    const auto hit = s.find(need_string(*what, "find"));
    return hit == std::string::npos
               ? std::int64_t{-1}
               : static_cast<std::int64_t>(code_points(s.substr(0, hit)).size());
  }
  fail("str has no method '" + std::string(name) + "'");
}

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

bool is_string_method(std::string_view n) {
  return n == "strip" || n == "lstrip" || n == "rstrip" || n == "upper" || n == "lower" ||
         n == "title" || n == "capitalize" || n == "split" || n == "startswith" ||
         n == "endswith" || n == "replace" || n == "find";
}
bool is_dict_method(std::string_view n) {
  return n == "items" || n == "keys" || n == "values" || n == "get";
}

Value bound_method(const Value& object, const std::string& name) {
  return Callable{name, [object, name](const CallArgs& args) -> Value {
                    if (object.is_string()) return string_method(object.as_string(), name, args);
                    return dict_method(object.as_dict(), name, args);
                  }};
}

// --- filters over sequences ---

std::int64_t length(const Value& v) {
  if (v.is_string()) return static_cast<std::int64_t>(code_points(v.as_string()).size());
  if (v.is_list()) return static_cast<std::int64_t>(v.as_list().size());
  if (v.is_dict()) return static_cast<std::int64_t>(v.as_dict().items.size());
  if (v.is_undefined()) return 0;
  fail("object of type '" + std::string(v.type_name()) + "' has no len()");
}

// An attribute path "a.b" or an index, as jinja2's attribute= arguments take it.
Value attribute_path(const Value& v, const Value& path) {
  if (path.is_int()) return get_item(v, path);
  Value out = v;
  std::size_t pos = 0;
  const std::string& p = need_string(path, "attribute");
  while (pos <= p.size()) {
    const std::size_t dot = std::min(p.find('.', pos), p.size());
    const std::string part = p.substr(pos, dot - pos);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(),
                                                     [](char c) { return c >= '0' && c <= '9'; });
    out =
        digits ? get_item(out, Value(std::int64_t{std::atoll(part.c_str())})) : get_item(out, part);
    pos = dot + 1;
  }
  return out;
}

// select/reject (attribute empty) and selectattr/rejectattr.
Value select_items(const Value& input, const CallArgs& args, bool with_attribute, bool keep) {
  std::size_t i = 0;
  Value attribute;
  if (with_attribute) {
    const Value* a = args.get(i++, "attribute");
    if (a == nullptr) fail("selectattr needs an attribute");
    attribute = *a;
  }
  const Value* test = args.get(i++, "");
  CallArgs test_args;
  for (; i < args.positional.size(); ++i) test_args.positional.push_back(args.positional[i]);
  List out;
  for (const auto& item : iterate(input)) {
    const Value subject = with_attribute ? attribute_path(item, attribute) : item;
    const bool passed = test == nullptr
                            ? subject.truthy()
                            : apply_test(need_string(*test, "a test name"), subject, test_args);
    if (passed == keep) out.push_back(item);
  }
  return out;
}

Value map_items(const Value& input, const CallArgs& args) {
  List out;
  if (const Value* attribute = args.get(99, "attribute")) {
    const Value* dflt = args.get(99, "default");
    for (const auto& item : iterate(input)) {
      Value v = attribute_path(item, *attribute);
      out.push_back(v.is_undefined() && dflt != nullptr ? *dflt : v);
    }
    return out;
  }
  const Value* filter = args.get(0, "");
  if (filter == nullptr) fail("map needs a filter name or attribute=");
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const auto& item : iterate(input)) {
    out.push_back(apply_filter(need_string(*filter, "map"), item, rest));
  }
  return out;
}

std::string sort_key_text(const Value& v, bool case_sensitive) {
  return case_sensitive ? v.as_string() : map_chars(v.as_string(), lower);
}

bool sort_less(const Value& a, const Value& b, bool case_sensitive) {
  if (a.is_string() && b.is_string() && !case_sensitive) {
    return sort_key_text(a, false) < sort_key_text(b, false);
  }
  return less_than(a, b);
}

Value sort_items(const Value& input, const CallArgs& args) {
  const bool reverse = bool_arg(args, 0, "reverse", false);
  const bool case_sensitive = bool_arg(args, 1, "case_sensitive", false);
  const Value* attribute = args.get(2, "attribute");
  List items = iterate(input);
  auto key = [&](const Value& v) { return attribute ? attribute_path(v, *attribute) : v; };
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    return reverse ? sort_less(key(b), key(a), case_sensitive)
                   : sort_less(key(a), key(b), case_sensitive);
  });
  return items;
}

Value dictsort(const Value& input, const CallArgs& args) {
  if (!input.is_dict()) fail("dictsort needs a dict");
  const bool case_sensitive = bool_arg(args, 0, "case_sensitive", false);
  const Value* by = args.get(1, "by");
  const bool by_value = by != nullptr && by->is_string() && by->as_string() == "value";
  const bool reverse = bool_arg(args, 2, "reverse", false);
  List items = dict_method(input.as_dict(), "items", {}).as_list();
  const std::size_t k = by_value ? 1 : 0;
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    const Value &x = a.as_list()[k], &y = b.as_list()[k];
    return reverse ? sort_less(y, x, case_sensitive) : sort_less(x, y, case_sensitive);
  });
  return items;
}

Value unique(const Value& input, const CallArgs& args) {
  const bool case_sensitive = bool_arg(args, 0, "case_sensitive", false);
  List out;
  std::vector<Value> seen;
  for (const auto& item : iterate(input)) {
    const Value key =
        item.is_string() && !case_sensitive ? Value(sort_key_text(item, false)) : item;
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return out;
}

std::string indent(const std::string& s, const CallArgs& args) {
  const Value* width = args.get(0, "width");
  const std::string pad =
      width != nullptr && width->is_string()
          ? width->as_string()
          : std::string(
                static_cast<std::size_t>(std::max<std::int64_t>(0, int_arg(args, 0, "width", 4))),
                ' ');
  const bool first = bool_arg(args, 1, "first", false);
  const bool blank = bool_arg(args, 2, "blank", false);
  std::string out;
  std::size_t pos = 0;
  bool first_line = true;
  while (pos <= s.size()) {
    const std::size_t nl = std::min(s.find('\n', pos), s.size());
    const std::string line = s.substr(pos, nl - pos);
    if (!first_line) out += '\n';
    const bool indent_it = first_line ? first : (blank || !line.empty());
    if (indent_it) out += pad;
    out += line;
    first_line = false;
    pos = nl + 1;
  }
  return out;
}

Value tojson(const Value& input, const CallArgs& args) {
  JsonStyle style;
  if (const Value* i = args.get(0, "indent"); i != nullptr && !i->is_none()) {
    style.indent = static_cast<int>(std::clamp<std::int64_t>(i->to_int(), 0, 64));
  }
  if (const Value* sep = args.get(99, "separators"); sep != nullptr && !sep->is_none()) {
    if (!sep->is_list() || sep->as_list().size() != 2) fail("separators must be a pair");
    style.item_separator = need_string(sep->as_list()[0], "separators");
    style.key_separator = need_string(sep->as_list()[1], "separators");
    if (style.item_separator.empty()) fail("an empty item separator is not supported");
  }
  style.sort_keys = bool_arg(args, 99, "sort_keys", false);
  return to_json(input, style);
}

Value round_number(const Value& input, const CallArgs& args) {
  const double x = input.to_double();
  const std::int64_t precision = int_arg(args, 0, "precision", 0);
  const Value* method = args.get(1, "method");
  const std::string how = method != nullptr ? need_string(*method, "round") : "common";
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double scaled = x * scale;
  const double r = how == "ceil"    ? std::ceil(scaled)
                   : how == "floor" ? std::floor(scaled)
                                    : std::nearbyint(scaled);
  return r / scale;
}

Value to_int(const Value& input, const CallArgs& args) {
  const std::int64_t dflt = int_arg(args, 0, "default", 0);
  if (input.is_number())
    return input.is_float() && !std::isfinite(input.as_float()) ? dflt : input.to_int();
  if (!input.is_string()) return dflt;
  const std::string s = strip(input.as_string(), nullptr, true, true);
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, static_cast<int>(int_arg(args, 1, "base", 10)));
  if (!s.empty() && end == s.c_str() + s.size()) return std::int64_t{v};
  const double d = std::strtod(s.c_str(), &end);
  if (!s.empty() && end == s.c_str() + s.size() && std::isfinite(d))
    return static_cast<std::int64_t>(d);
  return dflt;
}

Value to_float(const Value& input, const CallArgs& args) {
  const Value* d = args.get(0, "default");
  const Value dflt = d != nullptr ? *d : Value(0.0);
  if (input.is_number()) return input.to_double();
  if (!input.is_string()) return dflt;
  const std::string s = strip(input.as_string(), nullptr, true, true);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  return !s.empty() && end == s.c_str() + s.size() ? Value(v) : dflt;
}

Value reverse(const Value& input) {
  if (input.is_string()) {
    auto cps = code_points(input.as_string());
    std::string out;
    for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
    return out;
  }
  List items = iterate(input);
  std::reverse(items.begin(), items.end());
  return items;
}

Value join(const Value& input, const CallArgs& args) {
  const Value* sep = args.get(0, "d");
  const Value* attribute = args.get(1, "attribute");
  std::string out;
  bool first = true;
  for (const auto& item : iterate(input)) {
    if (!first && sep != nullptr) out += to_str(*sep);
    first = false;
    out += to_str(attribute != nullptr ? attribute_path(item, *attribute) : item);
  }
  return out;
}

}  // namespace

Value apply_filter(std::string_view name, const Value& input, const CallArgs& args) {
  if (name == "default" || name == "d") {
    const Value* dflt = args.get(0, "default_value");
    const bool boolean = bool_arg(args, 1, "boolean", false);
    if (input.is_undefined() || (boolean && !input.truthy())) return dflt ? *dflt : Value("");
    return input;
  }
  if (name == "length" || name == "count") return length(input);
  if (name == "string") return to_str(input);
  if (name == "safe") return input;
  if (name == "tojson") return tojson(input, args);
  if (name == "list") return iterate(input);
  if (name == "items") {
    if (input.is_undefined()) return List{};
    if (!input.is_dict()) fail("items needs a dict");
    return dict_method(input.as_dict(), "items", args);
  }
  if (name == "first" || name == "last") {
    List items = iterate(input);
    if (items.empty()) return Undefined{"first"};
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") return join(input, args);
  if (name == "select" || name == "reject")
    return select_items(input, args, false, name == "select");
  if (name == "selectattr" || name == "rejectattr") {
    return select_items(input, args, true, name == "selectattr");
  }
  if (name == "map") return map_items(input, args);
  if (name == "sort") return sort_items(input, args);
  if (name == "dictsort") return dictsort(input, args);
  if (name == "unique") return unique(input, args);
  if (name == "reverse") return reverse(input);
  if (name == "int") return to_int(input, args);
  if (name == "float") return to_float(input, args);
  if (name == "abs") {
    if (input.is_float()) return std::fabs(input.as_float());
    const std::int64_t i = input.to_int();
    if (i == INT64_MIN) fail("integer overflow");
    return i < 0 ? -i : i;
  }
  if (name == "round") return round_number(input, args);
  // The rest work on text (jinja2 converts the input with str()).
  const std::string s = to_str(input);
  if (name == "trim") return strip(s, args.get(0, "chars"), true, true);
  if (name == "upper") return map_chars(s, upper);
  if (name == "lower") return map_chars(s, lower);
  if (name == "capitalize") return capitalize(s);
  if (name == "title") return title(s);
  if (name == "indent") return indent(s, args);
  if (name == "replace") {
    const Value* from = args.get(0, "old");
    const Value* to = args.get(1, "new");
    if (from == nullptr || to == nullptr) fail("replace needs two arguments");
    return replace(s, to_str(*from), to_str(*to), int_arg(args, 2, "count", -1));
  }
  fail("no filter named '" + std::string(name) + "'");
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

}  // namespace troupe::text::jinja
