#include "text/jinja/filters.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "text/jinja/builtins.hpp"
#include "text/jinja/strings.hpp"

namespace troupe::text::jinja {

namespace {

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

}  // namespace troupe::text::jinja
