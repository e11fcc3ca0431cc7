#include "grammar/json_schema.hpp"

#include <algorithm>
#include <boost/json/serialize.hpp>
#include <cctype>
#include <cmath>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include "grammar/gbnf.hpp"
#include "grammar/integer_range.hpp"
#include "grammar/regex.hpp"

namespace troupe::grammar {

namespace json = boost::json;

namespace {

// Nested schemas and $ref hops together: every step of the converter's recursion is one
// level, so a schema cannot take the thread's stack however its nesting is spelled (a flat
// chain of 10 000 $defs, each a $ref to the next, used to overflow it).
constexpr int kMaxDepth = 64;
// Pattern rules' bytes are kept JSON-safe by parse_gbnf (gbnf.hpp): the worker that
// compiles this text again gets the same grammar.
const std::string kPatternRulePrefix = std::string(kJsonSafeRulePrefix) + "pattern-";

// The building blocks, each added to the grammar the first time a schema uses it.
const std::vector<std::pair<std::string, std::string>> kPrimitives = {
    {"ws", R"(( " " | "\n" [ \t]{0,20} )?)"},
    // \u escapes of UTF-16: a surrogate only as a high-low pair (a lone one is not text).
    {"json-char",
     R"([^"\\\x7f\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" ( [0-9a-cA-CefEF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} ) | "u" [dD] [89abAB] [0-9a-fA-F]{2} "\\u" [dD] [c-fC-F] [0-9a-fA-F]{2} ))"},
    {"json-string", R"("\"" json-char* "\"" ws)"},
    {"json-int", R"("-"? ( "0" | [1-9] [0-9]{0,17} ))"},
    {"json-frac", R"("." [0-9]{1,16})"},
    {"json-exp", R"([eE] [-+]? [0-9]{1,3})"},
    {"json-number", R"(json-int json-frac? json-exp? ws)"},
    {"json-integer", R"(json-int ws)"},
    {"json-boolean", R"(( "true" | "false" ) ws)"},
    {"json-null", R"("null" ws)"},
    {"json-kv", R"(json-string ":" ws json-value)"},
    {"json-object", R"("{" ws ( json-kv ( "," ws json-kv )* )? "}" ws)"},
    {"json-array", R"("[" ws ( json-value ( "," ws json-value )* )? "]" ws)"},
    {"json-value",
     R"(json-object | json-array | json-string | json-number | json-boolean | json-null)"},
    // Days by month; February stops at 28 (a 29th would need the year's leap rule).
    {"json-date",
     R"([0-9]{4} "-" ( ( "0" [13578] | "1" [02] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ) | ( "0" [469] | "11" ) "-" ( "0" [1-9] | [12] [0-9] | "30" ) | "02-" ( "0" [1-9] | "1" [0-9] | "2" [0-8] ) ))"},
    {"json-email",
     R"([a-zA-Z0-9_%+-] [a-zA-Z0-9._%+-]{0,63} "@" ( [a-zA-Z0-9] [a-zA-Z0-9-]{0,62} "." ){1,4} [a-zA-Z]{2,24})"},
    {"json-ipv4",
     R"(( [0-9] | [1-9] [0-9] | "1" [0-9]{2} | "2" [0-4] [0-9] | "25" [0-5] ) ( "." ( [0-9] | [1-9] [0-9] | "1" [0-9]{2} | "2" [0-4] [0-9] | "25" [0-5] ) ){3})"},
    {"json-time",
     R"(( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,6} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ))"},
    {"json-uuid",
     R"([0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12})"},
};

// The formats that are grammars; the others are annotations.
const std::set<std::string> kFormatsWithGrammar = {"date", "time",  "date-time",
                                                   "uuid", "email", "ipv4"};

// What each primitive uses, so that adding one adds them too.
const std::unordered_map<std::string, std::vector<std::string>> kUses = {
    {"json-string", {"json-char", "ws"}},
    {"json-number", {"json-int", "json-frac", "json-exp", "ws"}},
    {"json-integer", {"json-int", "ws"}},
    {"json-boolean", {"ws"}},
    {"json-null", {"ws"}},
    {"json-kv", {"json-string", "ws", "json-value"}},
    {"json-object", {"ws", "json-kv"}},
    {"json-array", {"ws", "json-value"}},
    {"json-value",
     {"json-object", "json-array", "json-string", "json-number", "json-boolean", "json-null"}},
};

// Keywords that only annotate: ignored.
const std::set<std::string> kAnnotations = {
    "title",           "description",   "default",  "examples",
    "$schema",         "$id",           "$comment", "readOnly",
    "writeOnly",       "deprecated",    "format",   "$defs",
    "definitions",     "strict",        "name",     "contentMediaType",
    "contentEncoding", "discriminator", "nullable"};

std::string sanitize(const std::string& name) {
  std::string out;
  for (const char c : name) {
    out += std::isalnum(static_cast<unsigned char>(c)) != 0 ? c : '-';
  }
  return out.empty() ? "schema" : out;
}

class Converter {
 public:
  explicit Converter(const json::value& root) : root_(root) {
    for (const auto& [name, body] : kPrimitives) taken_.insert(name);
  }

  Result<std::string> convert() {
    TROUPE_TRY(const std::string root, visit(root_, "root", "", 0));
    if (root != "root") add_rule("root", root);
    std::string text;
    for (const auto& [name, body] : rules_) text += name + " ::= " + body + "\n";
    for (const auto& [name, body] : kPrimitives) {
      if (used_.contains(name)) text += name + " ::= " + body + "\n";
    }
    return text;
  }

 private:
  tl::unexpected<Error> error(const std::string& path, const std::string& what) const {
    return make_error(ErrorCode::invalid_argument,
                      "JSON schema at '" + (path.empty() ? std::string("/") : path) + "': " + what);
  }

  void use(const std::string& primitive) {
    if (!used_.insert(primitive).second) return;
    if (const auto it = kUses.find(primitive); it != kUses.end()) {
      for (const auto& p : it->second) use(p);
    }
  }

  std::string primitive(const std::string& name) {
    use(name);
    return name;
  }

  std::string fresh_name(const std::string& base) {
    std::string name = sanitize(base);
    if (!taken_.insert(name).second) {
      // Each base counts its own suffixes on: trying them all from 2 again made 10 000
      // properties (10 000 "-rest" rules) cost 5 * 10^7 tries, 12 s.
      int& i = next_suffix_.try_emplace(name, 2).first->second;
      while (!taken_.insert(name + "-" + std::to_string(i)).second) ++i;
      name += "-" + std::to_string(i++);
    }
    return name;
  }

  void add_rule(const std::string& name, const std::string& body) {
    taken_.insert(name);
    rules_.emplace_back(name, body);
  }

  // A rule for `schema`, named after `name`; returns the rule's name.
  Result<std::string> visit(const json::value& schema, const std::string& name,
                            const std::string& path, int depth) {
    TROUPE_TRY(const std::string body, expression(schema, name, path, depth));
    // A body that is a single rule name needs no rule of its own.
    if (body.find_first_of(" \"[(|") == std::string::npos) return body;
    const std::string rule = fresh_name(name);
    add_rule(rule, body);
    return rule;
  }

  Result<std::string> expression(const json::value& schema, const std::string& name,
                                 const std::string& path, int depth) {
    if (depth > kMaxDepth) {
      return error(path, "schemas nested too deep: more than " + std::to_string(kMaxDepth) +
                             " levels of nesting and $ref hops");
    }
    if (schema.is_bool()) {
      if (schema.as_bool()) return primitive("json-value");
      return error(path, "the schema false admits nothing");
    }
    if (!schema.is_object()) return error(path, "a schema must be an object or a boolean");
    const json::object& s = schema.as_object();
    // Checked before $ref, const, enum and the combinators take the schema over: a keyword
    // beside them that cannot be honoured is refused too, not dropped ("not" beside "anyOf"
    // used to pass unchecked).
    for (const auto& [key, value] : s) {
      if (!known_keyword(std::string(key))) {
        return error(path, "keyword '" + std::string(key) + "' is not supported");
      }
    }
    // $ref, const, enum and the combinators take the schema over: any other keyword beside
    // them but annotations (and a type beside const or enum) would be dropped, so it is
    // refused ({"$ref": ..., "maxLength": 2} used to allow the target's longer strings).
    for (const char* taker : {"$ref", "const", "enum", "anyOf", "oneOf", "allOf"}) {
      if (!s.contains(taker)) continue;
      const std::string_view took = taker;
      for (const auto& [key, value] : s) {
        if (key == took || kAnnotations.contains(std::string(key))) continue;
        if (key == "type" && (took == "const" || took == "enum")) continue;
        return error(path, "keyword '" + std::string(key) + "' beside '" + std::string(took) +
                               "' is not supported (it would be ignored)");
      }
      break;
    }
    if (const auto* ref = s.if_contains("$ref")) return reference(*ref, path, depth);
    // A "type" beside const or enum still holds: values of other types are left out
    // ({"type": "string", "enum": ["a", 1]} used to give 1).
    if (const auto* value = s.if_contains("const")) {
      if (!of_type(*value, s.if_contains("type"))) return error(path, "const is not of its type");
      return literal(*value);
    }
    if (const auto* values = s.if_contains("enum")) {
      if (!values->is_array() || values->as_array().empty()) {
        return error(path + "/enum", "enum must be a non-empty array");
      }
      std::string out;
      for (const auto& v : values->as_array()) {
        if (of_type(v, s.if_contains("type"))) out += (out.empty() ? "" : " | ") + literal(v);
      }
      if (out.empty()) return error(path + "/enum", "no value of the enum is of its type");
      return "( " + out + " )";
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (const auto* options = s.if_contains(key)) {
        if (!options->is_array() || options->as_array().empty()) {
          return error(path + "/" + key, std::string(key) + " must be a non-empty array");
        }
        std::string out;
        std::size_t i = 0;
        for (const auto& option : options->as_array()) {
          TROUPE_TRY(const std::string rule,
                     visit(option, name + "-" + std::to_string(i),
                           path + "/" + key + "/" + std::to_string(i), depth + 1));
          out += (out.empty() ? "" : " | ") + rule;
          ++i;
        }
        return out;
      }
    }
    if (const auto* all = s.if_contains("allOf")) {
      if (!all->is_array() || all->as_array().size() != 1) {
        return error(path + "/allOf", "allOf of more than one schema is not supported");
      }
      return visit(all->as_array()[0], name, path + "/allOf/0", depth + 1);
    }
    const json::value* type = s.if_contains("type");
    if (type != nullptr && type->is_array()) {
      std::string out;
      for (const auto& t : type->as_array()) {
        if (!t.is_string()) return error(path + "/type", "type names must be strings");
        TROUPE_TRY(const std::string one, typed(s, std::string(t.as_string()), name, path, depth));
        out += (out.empty() ? "" : " | ") + std::string("( ") + one + " )";
      }
      if (out.empty()) return error(path + "/type", "an empty list of types");
      return out;
    }
    if (type != nullptr && !type->is_string()) return error(path + "/type", "a bad type");
    std::string t = type != nullptr ? std::string(type->as_string()) : "";
    if (t.empty()) {
      if (s.contains("properties") || s.contains("additionalProperties") ||
          s.contains("required")) {
        t = "object";
      } else if (s.contains("items") || s.contains("prefixItems")) {
        t = "array";
      } else {
        return primitive("json-value");
      }
    }
    return typed(s, t, name, path, depth);
  }

  // Whether `value` is of `type` (a name or a list of names; none: any).
  static bool of_type(const json::value& value, const json::value* type) {
    if (type == nullptr) return true;
    if (type->is_array()) {
      return std::any_of(type->as_array().begin(), type->as_array().end(),
                         [&](const json::value& t) { return t.is_string() && of_type(value, &t); });
    }
    if (!type->is_string()) return true;  // a bad type: typed() says so where it matters
    const std::string t(type->as_string());
    if (t == "string") return value.is_string();
    if (t == "number") return value.is_number();
    if (t == "integer") {
      return value.is_int64() || value.is_uint64() ||
             (value.is_double() && std::trunc(value.as_double()) == value.as_double());
    }
    if (t == "boolean") return value.is_bool();
    if (t == "null") return value.is_null();
    if (t == "array") return value.is_array();
    if (t == "object") return value.is_object();
    return false;
  }

  static bool known_keyword(const std::string& key) {
    static const std::set<std::string> handled = {"$ref",
                                                  "const",
                                                  "enum",
                                                  "anyOf",
                                                  "oneOf",
                                                  "allOf",
                                                  "type",
                                                  "properties",
                                                  "required",
                                                  "additionalProperties",
                                                  "items",
                                                  "prefixItems",
                                                  "minItems",
                                                  "maxItems",
                                                  "minLength",
                                                  "maxLength",
                                                  "pattern",
                                                  "minimum",
                                                  "maximum",
                                                  "exclusiveMinimum",
                                                  "exclusiveMaximum"};
    return handled.contains(key) || kAnnotations.contains(key);
  }

  std::string literal(const json::value& value) {
    use("ws");
    return gbnf_literal(json::serialize(value)) + " ws";
  }

  Result<std::string> reference(const json::value& ref, const std::string& path, int depth) {
    if (!ref.is_string()) return error(path + "/$ref", "$ref must be a string");
    const std::string target(ref.as_string());
    if (const auto it = refs_.find(target); it != refs_.end()) return it->second;
    std::string key;
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      if (target.rfind(prefix, 0) == 0) key = target.substr(std::string(prefix).size());
    }
    if (target == "#") key = "#";
    if (key.empty())
      return error(path + "/$ref", "only local references (#/$defs/...) are supported");
    const json::value* schema = &root_;
    if (key != "#") {
      const char* section = target.rfind("#/$defs/", 0) == 0 ? "$defs" : "definitions";
      const auto* defs = root_.is_object() ? root_.as_object().if_contains(section) : nullptr;
      schema = defs != nullptr && defs->is_object() ? defs->as_object().if_contains(key) : nullptr;
      if (schema == nullptr) return error(path + "/$ref", "'" + target + "' is not defined");
    }
    // Named before it is visited, so that a recursive schema refers to itself.
    const std::string rule = fresh_name("ref-" + (key == "#" ? std::string("root") : key));
    refs_[target] = rule;
    TROUPE_TRY(const std::string body, expression(*schema, rule, target, depth + 1));
    add_rule(rule, body);
    return rule;
  }

  Result<std::string> typed(const json::object& s, const std::string& type, const std::string& name,
                            const std::string& path, int depth) {
    if (type == "string") return string_schema(s, path);
    if (type == "integer") return integer_schema(s, path);
    if (type == "number") return number_schema(s, path);
    if (type == "boolean") return primitive("json-boolean");
    if (type == "null") return primitive("json-null");
    if (type == "array") return array_schema(s, name, path, depth);
    if (type == "object") return object_schema(s, name, path, depth);
    return error(path + "/type", "unknown type '" + type + "'");
  }

  Result<std::optional<std::int64_t>> count(const json::object& s, const char* key,
                                            const std::string& path) {
    const auto* v = s.if_contains(key);
    if (v == nullptr) return std::optional<std::int64_t>{};
    if (!v->is_int64() && !v->is_uint64()) return error(path + "/" + key, "must be an integer");
    const std::int64_t n =
        v->is_int64() ? v->as_int64() : static_cast<std::int64_t>(v->as_uint64());
    if (n < 0 || n > 4096) return error(path + "/" + key, "must be between 0 and 4096");
    return std::optional<std::int64_t>{n};
  }

  // "{min,max}", "{min,}", "*" or "" (exactly once) for a repetition.
  static std::string repeat(std::optional<std::int64_t> min, std::optional<std::int64_t> max) {
    const std::int64_t lo = min.value_or(0);
    if (!max) return lo == 0 ? "*" : "{" + std::to_string(lo) + ",}";
    return "{" + std::to_string(lo) + "," + std::to_string(*max) + "}";
  }

  Result<std::string> string_schema(const json::object& s, const std::string& path) {
    use("ws");
    // A pattern or a format is its own grammar, which a length bound would have to cut:
    // refused rather than dropped, since a dropped bound lets through strings the schema
    // refuses (found by tests/net/structured_outputs_test.cpp: "pattern": "^[a-z ]+$" with
    // "maxLength": 4 ran on for hundreds of letters).
    const auto* format = s.if_contains("format");
    const bool format_grammar = format != nullptr && format->is_string() &&
                                kFormatsWithGrammar.contains(std::string(format->as_string()));
    if ((s.contains("pattern") || format_grammar) &&
        (s.contains("minLength") || s.contains("maxLength"))) {
      return error(path, std::string("minLength or maxLength together with ") +
                             (s.contains("pattern") ? "a pattern" : "a format") +
                             " is not supported yet");
    }
    if (const auto* pattern = s.if_contains("pattern")) {
      if (!pattern->is_string()) return error(path + "/pattern", "pattern must be a string");
      const std::string regex(pattern->as_string());
      auto body = regex_to_gbnf(regex);
      if (!body) return error(path + "/pattern", body.error().message);
      // A schema's pattern searches: unanchored ends take any characters. Its own rule, whose
      // bytes parse_json_schema then keeps to those a JSON string holds unescaped.
      const bool from_start = !regex.empty() && regex.front() == '^';
      const bool to_end = !regex.empty() && regex.back() == '$' &&
                          (regex.size() < 2 || regex[regex.size() - 2] != '\\');
      const std::string any = "[^\"\\\\\\x00-\\x1f]*";
      const std::string rule = fresh_name(kPatternRulePrefix + std::to_string(taken_.size()));
      add_rule(rule,
               (from_start ? "" : any + " ") + "( " + *body + " )" + (to_end ? "" : " " + any));
      return "\"\\\"\" " + rule + " \"\\\"\" ws";
    }
    if (format_grammar) {
      const std::string f(format->as_string());
      std::string body;
      if (f == "date") body = primitive("json-date");
      if (f == "time") body = primitive("json-time");
      if (f == "date-time") body = primitive("json-date") + " \"T\" " + primitive("json-time");
      if (f == "uuid") body = primitive("json-uuid");
      if (f == "email") body = primitive("json-email");
      if (f == "ipv4") body = primitive("json-ipv4");
      if (!body.empty()) return "\"\\\"\" " + body + " \"\\\"\" ws";
    }
    TROUPE_TRY(const auto min, count(s, "minLength", path));
    TROUPE_TRY(const auto max, count(s, "maxLength", path));
    if (min && max && *max < *min) return error(path, "maxLength is below minLength");
    if (!min && !max) return primitive("json-string");
    use("json-char");
    return "\"\\\"\" json-char" + repeat(min, max) + " \"\\\"\" ws";
  }

  Result<std::string> integer_schema(const json::object& s, const std::string& path) {
    std::optional<std::int64_t> lo, hi;
    for (const char* key : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
      const auto* v = s.if_contains(key);
      if (v == nullptr) continue;
      if (!v->is_number()) return error(path + "/" + key, "must be a number");
      const double bound = v->to_number<double>();
      if (std::fabs(bound) > 1e17) return error(path + "/" + key, "is beyond the range supported");
      const std::string k = key;
      if (k == "minimum") lo = static_cast<std::int64_t>(std::ceil(bound));
      if (k == "exclusiveMinimum") lo = static_cast<std::int64_t>(std::floor(bound)) + 1;
      if (k == "maximum") hi = static_cast<std::int64_t>(std::floor(bound));
      if (k == "exclusiveMaximum") hi = static_cast<std::int64_t>(std::ceil(bound)) - 1;
    }
    if (!lo && !hi) return primitive("json-integer");
    if (lo && hi && *lo > *hi) return error(path, "no integer lies within the bounds");
    use("ws");
    return "( " + integer_range(lo, hi) + " ) ws";
  }

  Result<std::string> number_schema(const json::object& s, const std::string& path) {
    for (const char* key : {"maximum", "exclusiveMaximum"}) {
      if (s.contains(key))
        return error(path + "/" + key, "bounds on a number are not supported yet");
    }
    for (const char* key : {"minimum", "exclusiveMinimum"}) {
      const auto* v = s.if_contains(key);
      if (v != nullptr && (!v->is_number() || v->to_number<double>() != 0.0)) {
        return error(path + "/" + key,
                     std::string("a number's ") + key + " other than 0 is not supported yet");
      }
    }
    if (!s.contains("minimum") && !s.contains("exclusiveMinimum")) return primitive("json-number");
    use("json-frac");
    use("ws");
    if (s.contains("exclusiveMinimum")) {
      // Above 0: a nonzero digit somewhere in the mantissa. The exponent keeps to two digits,
      // so that the smallest value (1e-16 by the mantissa, times 1e-99) stays a positive
      // double: a validator that reads 1e-400 as a double sees 0. (The header promised
      // exclusiveMinimum 0, which this function used to refuse.)
      return std::string(
          "( [1-9] [0-9]{0,17} json-frac? | \"0.\" \"0\"{0,15} [1-9] [0-9]{0,15} ) "
          "( [eE] [-+]? [0-9]{1,2} )? ws");
    }
    use("json-exp");
    return std::string("( \"0\" | [1-9] [0-9]{0,17} ) json-frac? json-exp? ws");
  }

  Result<std::string> array_schema(const json::object& s, const std::string& name,
                                   const std::string& path, int depth) {
    use("ws");
    std::vector<std::string> prefix;
    if (const auto* items = s.if_contains("prefixItems")) {
      if (!items->is_array()) return error(path + "/prefixItems", "must be an array");
      std::size_t i = 0;
      for (const auto& item : items->as_array()) {
        TROUPE_TRY(const std::string rule,
                   visit(item, name + "-" + std::to_string(i),
                         path + "/prefixItems/" + std::to_string(i), depth + 1));
        prefix.push_back(rule);
        ++i;
      }
    }
    std::string item;
    if (const auto* items = s.if_contains("items")) {
      if (items->is_bool() && !items->as_bool()) {
        item.clear();  // no items beyond the prefix
      } else {
        TROUPE_TRY(item, visit(*items, name + "-item", path + "/items", depth + 1));
      }
    } else {
      item = prefix.empty() ? primitive("json-value") : "";
    }
    TROUPE_TRY(const auto min, count(s, "minItems", path));
    TROUPE_TRY(const auto max, count(s, "maxItems", path));
    if (min && max && *max < *min) return error(path, "maxItems is below minItems");
    if (!prefix.empty()) {
      if (min || max) return error(path, "minItems/maxItems with prefixItems are not supported");
      std::string out = "\"[\" ws";
      for (std::size_t i = 0; i < prefix.size(); ++i)
        out += (i == 0 ? " " : " \",\" ws ") + prefix[i];
      if (!item.empty()) out += " ( \",\" ws " + item + " )*";
      return out + " \"]\" ws";
    }
    const std::int64_t lo = min.value_or(0);
    // item ( "," item ){lo-1, max-1}, optional as a whole when lo is 0.
    std::string tail;
    if (!max) {
      tail = lo <= 1 ? "*" : "{" + std::to_string(lo - 1) + ",}";
    } else if (*max == 0) {
      return std::string("\"[\" ws \"]\" ws");
    } else {
      tail = "{" + std::to_string(std::max<std::int64_t>(lo - 1, 0)) + "," +
             std::to_string(*max - 1) + "}";
    }
    const std::string list = item + " ( \",\" ws " + item + " )" + tail;
    return "\"[\" ws " + (lo == 0 ? "( " + list + " )?" : list) + " \"]\" ws";
  }

  Result<std::string> object_schema(const json::object& s, const std::string& name,
                                    const std::string& path, int depth) {
    use("ws");
    std::set<std::string> required;
    if (const auto* req = s.if_contains("required")) {
      if (!req->is_array()) return error(path + "/required", "must be an array");
      for (const auto& r : req->as_array()) {
        if (!r.is_string()) return error(path + "/required", "names must be strings");
        required.insert(std::string(r.as_string()));
      }
    }
    std::vector<std::string> required_kvs, optional_kvs;
    std::set<std::string> declared;
    if (const auto* props = s.if_contains("properties")) {
      if (!props->is_object()) return error(path + "/properties", "must be an object");
      for (const auto& [key, value] : props->as_object()) {
        const std::string k(key);
        declared.insert(k);
        TROUPE_TRY(const std::string rule,
                   visit(value, name + "-" + k, path + "/properties/" + k, depth + 1));
        const std::string kv =
            gbnf_literal(json::serialize(json::string(k))) + " ws \":\" ws " + rule;
        (required.contains(k) ? required_kvs : optional_kvs).push_back(kv);
      }
    }
    // Extra keys: additionalProperties true (the default), false, or a schema of the values.
    std::string extra;
    std::string extra_value = "json-value";  // the rule of an extra key's value; empty: none
    if (const auto* additional = s.if_contains("additionalProperties")) {
      if (additional->is_bool()) {
        if (additional->as_bool()) extra = primitive("json-kv");
        if (!additional->as_bool()) extra_value.clear();
      } else {
        TROUPE_TRY(extra_value, visit(*additional, name + "-additional",
                                      path + "/additionalProperties", depth + 1));
        extra = primitive("json-string") + " \":\" ws " + extra_value;
      }
    } else {
      extra = primitive("json-kv");
    }
    // A required key with no declared schema is an extra key, its value as
    // additionalProperties says (it used to be any value, even where additionalProperties
    // was a schema or false).
    for (const auto& r : required) {
      if (declared.contains(r)) continue;
      if (extra_value.empty()) {
        return error(path + "/required", "'" + r +
                                             "' is required but additionalProperties is false "
                                             "and it is not among the properties: no object is "
                                             "valid");
      }
      if (extra_value == "json-value") use("json-value");
      required_kvs.push_back(gbnf_literal(json::serialize(json::string(r))) + " ws \":\" ws " +
                             extra_value);
    }
    // The optional members, each maybe there, commas between those that are: rule i holds
    // "member i, then any of the later ones" or "any of the later ones" alone.
    std::vector<std::string> optional = optional_kvs;
    if (!extra.empty()) optional.push_back("( " + extra + " ( \",\" ws " + extra + " )* )");
    std::string rest;  // a non-empty run of the optional members from i on
    for (std::size_t i = optional.size(); i-- > 0;) {
      const std::string rule = fresh_name(name + "-rest");
      add_rule(rule,
               rest.empty() ? optional[i] : optional[i] + " ( \",\" ws " + rest + " )? | " + rest);
      rest = rule;
    }
    std::string out = "\"{\" ws";
    for (std::size_t i = 0; i < required_kvs.size(); ++i) {
      out += (i == 0 ? " " : " \",\" ws ") + required_kvs[i];
    }
    if (!rest.empty()) {
      out += required_kvs.empty() ? " ( " + rest + " )?" : " ( \",\" ws " + rest + " )?";
    }
    return out + " \"}\" ws";
  }

  const json::value& root_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::set<std::string> taken_;
  std::set<std::string> used_;
  std::unordered_map<std::string, std::string> refs_;  // $ref target -> rule
  std::unordered_map<std::string, int> next_suffix_;   // base name -> the next suffix to try
};

}  // namespace

Result<std::string> json_schema_to_gbnf(const json::value& schema) {
  return Converter(schema).convert();
}

Result<Grammar> parse_json_schema(const json::value& schema) {
  TROUPE_TRY(const std::string text, json_schema_to_gbnf(schema));
  auto grammar = parse_gbnf(text);
  if (!grammar) {
    return make_error(grammar.error().code, "the grammar made from a JSON schema does not parse (" +
                                                grammar.error().message + ")");
  }
  return grammar;
}

Result<Grammar> json_object_grammar() {
  json::object schema;
  schema["type"] = "object";
  return parse_json_schema(schema);
}

}  // namespace troupe::grammar
