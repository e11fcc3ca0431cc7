#include "text/jinja/strings.hpp"

#include <algorithm>

namespace troupe::text::jinja {

namespace {

bool is_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || static_cast<unsigned char>(c) >= 0x80;
}

}  // namespace

bool is_py_space(char c) {
  return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f');
}
char upper(char c) {
  return c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c;
}
char lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c;
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

namespace {

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

}  // namespace

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

bool is_string_method(std::string_view n) {
  return n == "strip" || n == "lstrip" || n == "rstrip" || n == "upper" || n == "lower" ||
         n == "title" || n == "capitalize" || n == "split" || n == "startswith" ||
         n == "endswith" || n == "replace" || n == "find";
}

}  // namespace troupe::text::jinja
