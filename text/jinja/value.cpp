#include "text/jinja/value.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "text/tokenizer.hpp"

namespace troupe::text::jinja {

namespace {

// Lists and dicts nest at most this deep when printed or compared (a namespace can
// hold itself).
constexpr int kMaxNesting = 128;

void check_nesting(int depth) {
  if (depth > kMaxNesting) fail("a value nests too deeply");
}

bool equals_at(const Value& a, const Value& b, int depth);

bool dicts_equal(const Dict& a, const Dict& b, int depth) {
  if (a.items.size() != b.items.size()) return false;
  for (const auto& [key, value] : a.items) {
    const Value* other = b.find(key);
    if (other == nullptr || !equals_at(value, *other, depth + 1)) return false;
  }
  return true;
}

bool equals_at(const Value& a, const Value& b, int depth) {
  check_nesting(depth);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.to_double() == b.to_double();
    return a.to_int() == b.to_int();
  }
  if (a.is_undefined() || b.is_undefined()) return a.is_undefined() && b.is_undefined();
  if (a.is_none() || b.is_none()) return a.is_none() && b.is_none();
  if (a.is_string() && b.is_string()) return a.as_string() == b.as_string();
  if (a.is_list() && b.is_list()) {
    const auto &x = a.as_list(), &y = b.as_list();
    if (x.size() != y.size()) return false;
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (!equals_at(x[i], y[i], depth + 1)) return false;
    }
    return true;
  }
  if (a.is_dict() && b.is_dict()) {
    if (&a.as_dict() == &b.as_dict()) return true;
    if (a.as_dict().is_namespace || b.as_dict().is_namespace) return false;
    return dicts_equal(a.as_dict(), b.as_dict(), depth);
  }
  if (a.is_callable() && b.is_callable()) return &a.as_callable() == &b.as_callable();
  return false;
}

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == quote || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  out += quote;
  return out;
}

std::string repr_at(const Value& v, int depth);

std::string container_repr(const Value& v, int depth) {
  check_nesting(depth);
  std::string out;
  if (v.is_list()) {
    out = "[";
    for (const auto& item : v.as_list()) {
      if (out.size() > 1) out += ", ";
      out += repr_at(item, depth + 1);
    }
    return out + "]";
  }
  const Dict& d = v.as_dict();
  out = d.is_namespace ? "<Namespace {" : "{";
  bool first = true;
  for (const auto& [key, value] : d.items) {
    if (!first) out += ", ";
    first = false;
    out += string_repr(key) + ": " + repr_at(value, depth + 1);
  }
  return out + (d.is_namespace ? "}>" : "}");
}

std::string repr_at(const Value& v, int depth) {
  if (v.is_string()) return string_repr(v.as_string());
  if (v.is_undefined()) return "Undefined";
  if (v.is_list() || v.is_dict()) return container_repr(v, depth);
  return to_str(v);
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned char>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

void json_at(const Value& v, const JsonStyle& style, int depth, std::string& out) {
  check_nesting(depth);
  const std::string item_sep =
      !style.item_separator.empty() ? style.item_separator : (style.indent >= 0 ? "," : ", ");
  // Python's json puts a newline and the indent before each item when indenting.
  auto newline = [&](int level) {
    if (style.indent < 0) return;
    out += '\n';
    out.append(static_cast<std::size_t>(style.indent * level), ' ');
  };
  if (v.is_none()) {
    out += "null";
  } else if (v.is_bool()) {
    out += v.as_bool() ? "true" : "false";
  } else if (v.is_int()) {
    out += std::to_string(v.as_int());
  } else if (v.is_float()) {
    const double d = v.as_float();
    out += std::isnan(d)   ? "NaN"
           : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                           : float_repr(d);
  } else if (v.is_string()) {
    out += json_string(v.as_string());
  } else if (v.is_list()) {
    const auto& list = v.as_list();
    if (list.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (i > 0) out += item_sep;
      newline(depth + 1);
      json_at(list[i], style, depth + 1, out);
    }
    newline(depth);
    out += ']';
  } else if (v.is_dict() && !v.as_dict().is_namespace) {
    auto items = v.as_dict().items;
    if (items.empty()) {
      out += "{}";
      return;
    }
    if (style.sort_keys) {
      std::stable_sort(items.begin(), items.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
    }
    out += '{';
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out += item_sep;
      newline(depth + 1);
      out += json_string(items[i].first) + style.key_separator;
      json_at(items[i].second, style, depth + 1, out);
    }
    newline(depth);
    out += '}';
  } else {
    fail("Object of type " + std::string(v.type_name()) + " is not JSON serializable");
  }
}

}  // namespace

Dict::Dict(std::vector<std::pair<std::string, Value>> init) : items(std::move(init)) {}

std::size_t Dict::position(std::string_view key) const {
  if (items.size() < kIndexFrom) {
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (items[i].first == key) return i;
    }
    return items.size();
  }
  if (index_.size() != items.size()) {  // built, or brought up to date, here
    index_.clear();
    for (std::size_t i = 0; i < items.size(); ++i) index_.emplace(items[i].first, i);
  }
  const auto it = index_.find(key);
  return it == index_.end() ? items.size() : it->second;
}

const Value* Dict::find(std::string_view key) const {
  const std::size_t i = position(key);
  return i < items.size() ? &items[i].second : nullptr;
}

void Dict::set(std::string key, Value value) {
  if (const std::size_t i = position(key); i < items.size()) {
    items[i].second = std::move(value);
    return;
  }
  if (items.size() >= kIndexFrom && index_.size() == items.size()) {
    index_.emplace(key, items.size());
  }
  items.emplace_back(std::move(key), std::move(value));
}

void Dict::clear() {
  items.clear();
  index_.clear();
}

const Value* CallArgs::get(std::size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [k, v] : keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

double Value::to_double() const {
  if (is_float()) return as_float();
  if (is_int()) return static_cast<double>(as_int());
  if (is_bool()) return as_bool() ? 1.0 : 0.0;
  fail("expected a number, got " + std::string(type_name()));
}

std::int64_t Value::to_int() const {
  if (is_int()) return as_int();
  if (is_bool()) return as_bool() ? 1 : 0;
  if (is_float()) return static_cast<std::int64_t>(as_float());
  fail("expected an integer, got " + std::string(type_name()));
}

bool Value::truthy() const {
  if (is_undefined() || is_none()) return false;
  if (is_bool()) return as_bool();
  if (is_int()) return as_int() != 0;
  if (is_float()) return as_float() != 0.0;
  if (is_string()) return !as_string().empty();
  if (is_list()) return !as_list().empty();
  if (is_dict()) return as_dict().is_namespace || !as_dict().items.empty();
  return true;
}

std::string_view Value::type_name() const {
  if (is_undefined()) return "Undefined";
  if (is_none()) return "NoneType";
  if (is_bool()) return "bool";
  if (is_int()) return "int";
  if (is_float()) return "float";
  if (is_string()) return "str";
  if (is_list()) return "list";
  if (is_dict()) return as_dict().is_namespace ? "Namespace" : "dict";
  return "function";
}

bool equals(const Value& a, const Value& b) {
  return equals_at(a, b, 0);
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // The shortest digits that read back as d, then Python's layout: positional for
  // exponents in [-4, 16), scientific past them.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const auto e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  const int exponent = std::stoi(sci.substr(e + 1));
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (const char c : mantissa) {
    if (c != '.') digits += c;
  }
  std::string out = negative ? "-" : "";
  if (exponent >= 16 || exponent < -4) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + exp;
  }
  if (exponent < 0)
    return out + "0." + std::string(static_cast<std::size_t>(-exponent - 1), '0') + digits;
  const auto int_len = static_cast<std::size_t>(exponent + 1);
  if (digits.size() <= int_len) {
    return out + digits + std::string(int_len - digits.size(), '0') + ".0";
  }
  return out + digits.substr(0, int_len) + "." + digits.substr(int_len);
}

std::string to_str(const Value& v) {
  if (v.is_undefined()) return "";
  if (v.is_none()) return "None";
  if (v.is_bool()) return v.as_bool() ? "True" : "False";
  if (v.is_int()) return std::to_string(v.as_int());
  if (v.is_float()) return float_repr(v.as_float());
  if (v.is_string()) return v.as_string();
  if (v.is_callable()) return "<function " + v.as_callable().name + ">";
  return container_repr(v, 0);
}

std::string to_repr(const Value& v) {
  return repr_at(v, 0);
}

std::string to_json(const Value& value, const JsonStyle& style) {
  std::string out;
  json_at(value, style, 0, out);
  return out;
}

std::vector<std::string_view> code_points(std::string_view text) {
  std::vector<std::string_view> out;
  while (!text.empty()) {
    const std::size_t n = utf8_char_length(text);
    out.push_back(text.substr(0, n));
    text.remove_prefix(n);
  }
  return out;
}

void fail(std::string message) {
  throw Failure{std::move(message)};
}

}  // namespace troupe::text::jinja
