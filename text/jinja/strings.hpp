// Python's str operations as chat templates use them (case mapping and whitespace
// are ASCII's), the str methods, and the argument helpers the built-ins share.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "text/jinja/value.hpp"

namespace troupe::text::jinja {

bool is_py_space(char c);
char upper(char c);
char lower(char c);
std::string map_chars(std::string s, char (*f)(char));
// str.strip / lstrip / rstrip: whitespace, or the characters of `chars` when given.
std::string strip(const std::string& s, const Value* chars, bool left, bool right);
std::string capitalize(const std::string& s);
std::string title(const std::string& s);
// str.replace: at most `count` times (all when negative).
std::string replace(const std::string& s, const std::string& from, const std::string& to,
                    std::int64_t count);
// str.split: on runs of whitespace when `sep` is null or none.
List split(const std::string& s, const Value* sep, std::int64_t max_split);

// The str methods templates call (strip, split, startswith, replace, ...).
bool is_string_method(std::string_view name);
Value string_method(const std::string& s, std::string_view name, const CallArgs& args);

// Arguments: the string a value must be; an int or bool argument at a position or name.
const std::string& need_string(const Value& v, std::string_view what);
std::int64_t int_arg(const CallArgs& args, std::size_t i, std::string_view name, std::int64_t dflt);
bool bool_arg(const CallArgs& args, std::size_t i, std::string_view name, bool dflt);

}  // namespace troupe::text::jinja
