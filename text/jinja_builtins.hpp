// jinja2's filters and tests, the methods of str and dict that chat templates call,
// and how attributes and items are looked up. Errors are thrown as jinja::Failure
// (the renderer adds where they happened).
#pragma once

#include <string_view>

#include "text/jinja_value.hpp"

namespace troupe::text::jinja {

// `input | name(args)`.
Value apply_filter(std::string_view name, const Value& input, const CallArgs& args);
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
// Python's <, for numbers and strings.
bool less_than(const Value& a, const Value& b);

}  // namespace troupe::text::jinja
