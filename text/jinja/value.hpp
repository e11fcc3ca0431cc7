// The values a Jinja chat template computes with: Python's none, bool, int, float, str,
// list and dict (insertion-ordered), jinja2's Undefined, and callables (macros and
// built-in functions). Printing, equality and JSON follow Python's str(), == and
// json.dumps, so that a template renders here byte for byte as under jinja2.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace troupe::text::jinja {

class Value;
using List = std::vector<Value>;

// A str-keyed mapping in insertion order (Python's dict), also jinja2's namespace().
// Lookups are by an index once it holds more than a few keys: a request's tools can hold
// 10^5 of them, and a linear search per insertion made converting them take 30 s.
struct Dict {
  Dict() = default;
  Dict(std::vector<std::pair<std::string, Value>> init);  // NOLINT: {{key, value}, ...}

  std::vector<std::pair<std::string, Value>> items;  // change only through set() and clear()
  bool is_namespace = false;

  const Value* find(std::string_view key) const;
  void set(std::string key, Value value);
  void clear();

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  // key -> position in items, for dicts of kIndexFrom keys or more; built on demand.
  static constexpr std::size_t kIndexFrom = 16;
  std::size_t position(std::string_view key) const;  // items.size() when absent
  mutable std::unordered_map<std::string, std::size_t, Hash, std::equal_to<>> index_;
};

// A call's arguments: positional, then keyword.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // The argument at `index` or named `name`, or nullptr when neither was given.
  const Value* get(std::size_t index, std::string_view name) const;
};

// A macro or a built-in function; it reports errors by throwing jinja::Failure.
struct Callable {
  std::string name;
  std::function<Value(const CallArgs&)> call;
};

struct Undefined {
  std::string name;  // what was looked up, for the error when it is used
};

class Value {
 public:
  using Storage =
      std::variant<Undefined, std::nullptr_t, bool, std::int64_t, double, std::string,
                   std::shared_ptr<List>, std::shared_ptr<Dict>, std::shared_ptr<const Callable>>;

  Value() = default;
  Value(Undefined u) : storage_(std::move(u)) {}
  Value(std::nullptr_t) : storage_(nullptr) {}
  Value(bool b) : storage_(b) {}
  Value(int i) : storage_(std::int64_t{i}) {}
  Value(std::int64_t i) : storage_(i) {}
  Value(double d) : storage_(d) {}
  Value(std::string s) : storage_(std::move(s)) {}
  Value(const char* s) : storage_(std::string(s)) {}
  Value(List list) : storage_(std::make_shared<List>(std::move(list))) {}
  Value(Dict dict) : storage_(std::make_shared<Dict>(std::move(dict))) {}
  Value(std::shared_ptr<Dict> dict) : storage_(std::move(dict)) {}
  Value(Callable c) : storage_(std::make_shared<const Callable>(std::move(c))) {}

  bool is_undefined() const { return std::holds_alternative<Undefined>(storage_); }
  bool is_none() const { return std::holds_alternative<std::nullptr_t>(storage_); }
  bool is_bool() const { return std::holds_alternative<bool>(storage_); }
  bool is_int() const { return std::holds_alternative<std::int64_t>(storage_); }
  bool is_float() const { return std::holds_alternative<double>(storage_); }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return std::holds_alternative<std::string>(storage_); }
  bool is_list() const { return std::holds_alternative<std::shared_ptr<List>>(storage_); }
  bool is_dict() const { return std::holds_alternative<std::shared_ptr<Dict>>(storage_); }
  bool is_callable() const {
    return std::holds_alternative<std::shared_ptr<const Callable>>(storage_);
  }

  bool as_bool() const { return std::get<bool>(storage_); }
  std::int64_t as_int() const { return std::get<std::int64_t>(storage_); }
  double as_float() const { return std::get<double>(storage_); }
  const std::string& as_string() const { return std::get<std::string>(storage_); }
  const List& as_list() const { return *std::get<std::shared_ptr<List>>(storage_); }
  const Dict& as_dict() const { return *std::get<std::shared_ptr<Dict>>(storage_); }
  Dict& mutable_dict() const { return *std::get<std::shared_ptr<Dict>>(storage_); }
  const Callable& as_callable() const {
    return *std::get<std::shared_ptr<const Callable>>(storage_);
  }
  const std::string& undefined_name() const { return std::get<Undefined>(storage_).name; }

  // A number as a double / an integer (bool counts as 0 or 1, as in Python).
  double to_double() const;
  std::int64_t to_int() const;

  // Python's truth value (jinja2's Undefined is false).
  bool truthy() const;
  // Python's type name, for errors ("str", "list", "NoneType", ...).
  std::string_view type_name() const;

 private:
  Storage storage_;
};

// Python's ==, deep for lists and dicts (1 == 1.0 == True).
bool equals(const Value& a, const Value& b);

// str(value) as jinja2 prints it: "" for Undefined, "None", "True", Python's repr
// inside lists and dicts.
std::string to_str(const Value& value);
// Python's repr(): strings quoted.
std::string to_repr(const Value& value);
// Python's repr of a float ("1.0", "1e+16", "0.1").
std::string float_repr(double d);

// json.dumps(value, ensure_ascii=False, indent=indent, separators=separators,
// sort_keys=sort_keys); indent < 0 means none. Throws Failure for what JSON cannot hold.
struct JsonStyle {
  int indent = -1;
  std::string item_separator;  // empty: ", " without an indent, "," with one
  std::string key_separator = ": ";
  bool sort_keys = false;
};
std::string to_json(const Value& value, const JsonStyle& style = {});

// Code points of a UTF-8 string (Python indexes and counts strings by them).
std::vector<std::string_view> code_points(std::string_view text);

// An error raised while rendering; template.cpp turns it into a troupe::Error.
struct Failure {
  std::string message;
  bool raised = false;  // raise_exception() from the template: its message as it is
  int line = 0;         // 0 until the node that failed is known
  int column = 0;
};
[[noreturn]] void fail(std::string message);

}  // namespace troupe::text::jinja
