// jinja2's tests, the dict methods, and how attributes, items and slices are looked
// up, as jinja2 does it. Errors are thrown as jinja::Failure (the renderer adds where
// they happened).
#pragma once

#include <string>
#include <string_view>

#include "text/jinja/value.hpp"

namespace troupe::text::jinja {

// The dict methods templates call: items, keys, values, get.
Value dict_method(const Dict& d, std::string_view name, const CallArgs& args);
// `input is name(args)`.
bool apply_test(std::string_view name, const Value& input, const CallArgs& args);

// `object.name`: an attribute first (a method), then an item; Undefined when neither.
Value get_attribute(const Value& object, const std::string& name);
// `object[key]`: an item first, then an attribute; Undefined when neither.
Value get_item(const Value& object, const Value& key);
// `object[start:stop:step]` for lists and strings; null parts are absent.
Value get_slice(const Value& object, const Value* start, const Value* stop, const Value* step);
// `item in container`.
bool contains(const Value& container, const Value& item);
// The items a for loop walks: a list's items, a dict's keys, a string's characters.
List iterate(const Value& value);
// Python's + - * / // % ** on ints and floats (bool counts as int), str and list
// concatenation and repetition; integer overflow is an error, not a wrap.
Value arithmetic(const std::string& op, const Value& a, const Value& b);
// Python's <, for numbers and strings.
bool less_than(const Value& a, const Value& b);

}  // namespace troupe::text::jinja
