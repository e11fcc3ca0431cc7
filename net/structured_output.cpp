#include "net/structured_output.hpp"

#include <boost/json.hpp>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "grammar/gbnf.hpp"
#include "grammar/json_schema.hpp"
#include "grammar/matcher.hpp"
#include "grammar/regex.hpp"
#include "grammar/token_masker.hpp"

namespace troupe::net {

namespace json = boost::json;

namespace {

// One constraint as asked: what it is, and where it was given (for errors).
struct Asked {
  enum class Kind { json_schema, json_object, regex, choice, gbnf };
  Kind kind = Kind::gbnf;
  const json::value* value = nullptr;  // the schema, the regex, the choices or the GBNF
  std::string param;                   // "response_format.json_schema.schema", ...
};

tl::expected<std::string, ApiError> text_of(const json::value& v, const std::string& param) {
  if (!v.is_string()) return tl::unexpected(bad_request("'" + param + "' must be a string", param));
  return std::string(v.get_string());
}

// A schema given as an object, or as JSON text (vLLM's guided_json takes both).
tl::expected<json::value, ApiError> schema_of(const json::value& v, const std::string& param) {
  if (v.is_object() || v.is_bool()) return v;
  if (v.is_string()) {
    boost::system::error_code ec;
    json::value parsed = json::parse(v.get_string(), ec);
    if (ec) {
      return tl::unexpected(
          bad_request("'" + param + "' is not a JSON schema: " + ec.message(), param));
    }
    return parsed;
  }
  return tl::unexpected(bad_request("'" + param + "' must be a JSON schema (an object)", param));
}

tl::expected<std::string, ApiError> gbnf_of(const Asked& asked) {
  auto refused = [&](const Error& e) {
    return tl::unexpected(bad_request("'" + asked.param + "': " + e.message, asked.param));
  };
  switch (asked.kind) {
    case Asked::Kind::json_object: {
      json::object object;
      object["type"] = "object";
      auto gbnf = grammar::json_schema_to_gbnf(object);
      if (!gbnf) return refused(gbnf.error());
      return *gbnf;
    }
    case Asked::Kind::json_schema: {
      auto schema = schema_of(*asked.value, asked.param);
      if (!schema) return tl::unexpected(schema.error());
      auto gbnf = grammar::json_schema_to_gbnf(*schema);
      if (!gbnf) return refused(gbnf.error());
      return *gbnf;
    }
    case Asked::Kind::regex: {
      auto regex = text_of(*asked.value, asked.param);
      if (!regex) return tl::unexpected(regex.error());
      auto body = grammar::regex_to_gbnf(*regex);
      if (!body) return refused(body.error());
      return "root ::= " + *body + "\n";
    }
    case Asked::Kind::choice: {
      if (!asked.value->is_array() || asked.value->as_array().empty()) {
        return tl::unexpected(
            bad_request("'" + asked.param + "' must be a non-empty array of strings", asked.param));
      }
      std::string gbnf = "root ::= ";
      bool first = true;
      for (const auto& choice : asked.value->as_array()) {
        if (!choice.is_string() || choice.get_string().empty()) {
          return tl::unexpected(
              bad_request("'" + asked.param + "' must hold non-empty strings", asked.param));
        }
        if (!first) gbnf += " | ";
        gbnf += grammar::gbnf_literal(choice.get_string());
        first = false;
      }
      return gbnf + "\n";
    }
    case Asked::Kind::gbnf:
      return text_of(*asked.value, asked.param);
  }
  return std::string();
}

// Collects what `body` asks for, in every spelling; more than one is refused.
tl::expected<std::vector<Asked>, ApiError> constraints_in(const json::object& body) {
  std::vector<Asked> asked;
  auto add = [&](Asked::Kind kind, const json::value* value, std::string param) {
    if (value != nullptr && !value->is_null()) asked.push_back({kind, value, std::move(param)});
  };
  if (const auto* rf = body.if_contains("response_format"); rf != nullptr && !rf->is_null()) {
    const auto* type = rf->is_object() ? rf->as_object().if_contains("type") : nullptr;
    if (type == nullptr || !type->is_string()) {
      return tl::unexpected(
          bad_request("'response_format' must be an object with a 'type'", "response_format"));
    }
    const auto& o = rf->as_object();
    const json::string& kind = type->get_string();
    if (kind == "json_schema") {
      const auto* js = o.if_contains("json_schema");
      const auto* schema =
          js != nullptr && js->is_object() ? js->as_object().if_contains("schema") : nullptr;
      if (schema == nullptr) {
        return tl::unexpected(
            bad_request("'response_format' of type json_schema needs "
                        "'json_schema.schema'",
                        "response_format.json_schema.schema"));
      }
      add(Asked::Kind::json_schema, schema, "response_format.json_schema.schema");
    } else if (kind == "json_object") {
      // llama.cpp's server takes a schema here too.
      if (const auto* schema = o.if_contains("schema"); schema != nullptr) {
        add(Asked::Kind::json_schema, schema, "response_format.schema");
      } else {
        asked.push_back({Asked::Kind::json_object, rf, "response_format"});
      }
    } else if (kind != "text") {
      return tl::unexpected(
          bad_request("'response_format.type' must be text, json_object or "
                      "json_schema, not '" +
                          std::string(kind) + "'",
                      "response_format.type"));
    }
  }
  if (const auto* so = body.if_contains("structured_outputs"); so != nullptr && !so->is_null()) {
    if (!so->is_object()) {
      return tl::unexpected(
          bad_request("'structured_outputs' must be an object", "structured_outputs"));
    }
    const auto& o = so->as_object();
    for (const auto& [key, value] : o) {
      if (key != "json" && key != "regex" && key != "choice" && key != "grammar" &&
          key != "json_object") {
        return tl::unexpected(
            bad_request("'structured_outputs." + std::string(key) +
                            "' is not supported (json, regex, choice, grammar and "
                            "json_object are)",
                        "structured_outputs." + std::string(key)));
      }
    }
    add(Asked::Kind::json_schema, o.if_contains("json"), "structured_outputs.json");
    add(Asked::Kind::regex, o.if_contains("regex"), "structured_outputs.regex");
    add(Asked::Kind::choice, o.if_contains("choice"), "structured_outputs.choice");
    add(Asked::Kind::gbnf, o.if_contains("grammar"), "structured_outputs.grammar");
    if (const auto* jo = o.if_contains("json_object"); jo != nullptr && !jo->is_null()) {
      if (!jo->is_bool()) {
        return tl::unexpected(bad_request("'structured_outputs.json_object' must be a boolean",
                                          "structured_outputs.json_object"));
      }
      if (jo->get_bool()) add(Asked::Kind::json_object, jo, "structured_outputs.json_object");
    }
  }
  add(Asked::Kind::json_schema, body.if_contains("guided_json"), "guided_json");
  add(Asked::Kind::regex, body.if_contains("guided_regex"), "guided_regex");
  add(Asked::Kind::choice, body.if_contains("guided_choice"), "guided_choice");
  add(Asked::Kind::gbnf, body.if_contains("guided_grammar"), "guided_grammar");
  add(Asked::Kind::json_schema, body.if_contains("json_schema"), "json_schema");
  add(Asked::Kind::gbnf, body.if_contains("grammar"), "grammar");
  if (asked.size() > 1) {
    return tl::unexpected(
        bad_request("only one output constraint may be given; this request has '" + asked[0].param +
                        "' and '" + asked[1].param + "'",
                    asked[1].param));
  }
  return asked;
}

// Compiled here as the worker will compile it, so that what fails, fails now.
tl::expected<std::string, ApiError> checked(std::string gbnf, const std::string& param) {
  if (gbnf.empty()) return tl::unexpected(bad_request("'" + param + "' is empty", param));
  auto refused = [&](const std::string& why) {
    return tl::unexpected(bad_request("'" + param + "': " + why, param));
  };
  const auto parsed = grammar::parse_gbnf(gbnf);
  if (!parsed) return refused(parsed.error().message);
  auto compiled = grammar::compile(*parsed);
  if (!compiled) return refused(compiled.error().message);
  const grammar::Matcher start(std::make_shared<const grammar::CompiledGrammar>(*compiled));
  if (!start.ok()) return refused("the grammar's start passes the matcher's limits");
  return gbnf;
}

}  // namespace

tl::expected<std::string, ApiError> output_grammar(const json::object& body, std::string* param) {
  auto asked = constraints_in(body);
  if (!asked) return tl::unexpected(asked.error());
  if (asked->empty()) return std::string();
  const Asked& one = asked->front();
  auto gbnf = gbnf_of(one);
  if (!gbnf) return tl::unexpected(gbnf.error());
  if (param != nullptr) *param = one.param;
  return checked(std::move(*gbnf), one.param);
}

tl::expected<std::string, ApiError> schema_grammar(const json::value& schema,
                                                   const std::string& param) {
  auto gbnf = grammar::json_schema_to_gbnf(schema);
  if (!gbnf) return tl::unexpected(bad_request("'" + param + "': " + gbnf.error().message, param));
  return checked(std::move(*gbnf), param);
}

std::string first_mask_refusal(const std::string& gbnf, const grammar::TokenMasker& masker) {
  // The verdict is kept by the grammar's text (512 of them), so that a schema sent again
  // costs a lookup and the same constraint is refused the same way every time.
  static std::mutex mutex;
  static std::unordered_map<std::size_t, std::string> known;  // hash of the text -> why
  const std::size_t key = std::hash<std::string>{}(gbnf) ^ gbnf.size();
  {
    std::lock_guard lock(mutex);
    if (const auto it = known.find(key); it != known.end()) return it->second;
  }
  std::string why;
  auto parsed = grammar::parse_gbnf(gbnf);
  auto compiled = parsed ? grammar::compile(*parsed) : tl::unexpected(parsed.error());
  if (!compiled) {
    why = compiled.error().message;  // output_grammar() let it through: it does not happen
  } else {
    const grammar::Matcher start(
        std::make_shared<const grammar::CompiledGrammar>(std::move(*compiled)));
    grammar::WorkBudget budget;
    std::vector<std::uint64_t> mask;
    if (!masker.fill_mask(start, mask, &budget)) {
      why =
          "the constraint is too costly to follow: its first token mask alone needs more "
          "than " +
          std::to_string(budget.limit()) +
          " steps of matching (its alternatives multiply, as in a regex of many '.*'); "
          "simplify it";
    }
  }
  std::lock_guard lock(mutex);
  if (known.size() >= 512) known.clear();
  known.emplace(key, why);
  return why;
}

}  // namespace troupe::net
