#include "net/tool_calls.hpp"

#include <atomic>
#include <boost/json.hpp>
#include <random>

#include "net/structured_output.hpp"

namespace troupe::net {

namespace json = boost::json;

namespace {

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralMarker = "[TOOL_CALLS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";

std::string_view trim_left(std::string_view s) {
  while (!s.empty() &&
         (s.front() == ' ' || s.front() == '\n' || s.front() == '\t' || s.front() == '\r')) {
    s.remove_prefix(1);
  }
  return s;
}

std::string_view trim(std::string_view s) {
  s = trim_left(s);
  while (!s.empty() &&
         (s.back() == ' ' || s.back() == '\n' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

// One JSON value at the start of `text` (after whitespace); `rest` is what follows it.
std::optional<json::value> leading_json(std::string_view text, std::string_view& rest) {
  text = trim_left(text);
  json::parser parser;
  boost::system::error_code ec;
  const std::size_t used = parser.write_some(text.data(), text.size(), ec);
  if (ec) return std::nullopt;  // not one whole value
  rest = text.substr(used);
  return parser.release();
}

// {"name": ..., "arguments" | "parameters": {...} or a JSON string}
std::optional<ToolCall> call_of(const json::value& v) {
  if (!v.is_object()) return std::nullopt;
  const auto& o = v.as_object();
  const auto* name = o.if_contains("name");
  if (name == nullptr || !name->is_string() || name->get_string().empty()) return std::nullopt;
  const json::value* args = o.if_contains("arguments");
  if (args == nullptr) args = o.if_contains("parameters");
  ToolCall call;
  call.name = std::string(name->get_string());
  if (args == nullptr) {
    call.arguments = "{}";
  } else if (args->is_string()) {
    call.arguments = std::string(args->get_string());
  } else {
    call.arguments = json::serialize(*args);
  }
  const auto* id = o.if_contains("id");
  call.id = id != nullptr && id->is_string() && !id->get_string().empty()
                ? std::string(id->get_string())
                : new_tool_call_id();
  return call;
}

// An array of calls (Mistral's and "required"'s form).
std::optional<std::vector<ToolCall>> calls_of_array(std::string_view text) {
  std::string_view rest;
  const auto v = leading_json(text, rest);
  if (!v || !v->is_array() || v->as_array().empty() || !trim(rest).empty()) return std::nullopt;
  std::vector<ToolCall> calls;
  for (const auto& item : v->as_array()) {
    auto call = call_of(item);
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
  }
  return calls;
}

std::optional<std::vector<ToolCall>> hermes_calls(std::string_view text) {
  std::vector<ToolCall> calls;
  while (true) {
    text = trim_left(text);
    if (text.empty()) break;
    if (!text.starts_with(kHermesOpen)) return std::nullopt;
    text.remove_prefix(kHermesOpen.size());
    const auto close = text.find(kHermesClose);
    const std::string_view body = text.substr(0, close);
    std::string_view rest;
    const auto v = leading_json(body, rest);
    if (!v || !trim(rest).empty()) return std::nullopt;
    auto call = call_of(*v);
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
    if (close == std::string_view::npos) break;
    text.remove_prefix(close + kHermesClose.size());
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

// Llama 3.1: one or more bare objects, separated by ';' (after an optional <|python_tag|>).
std::optional<std::vector<ToolCall>> llama3_calls(std::string_view text) {
  text = trim_left(text);
  if (text.starts_with(kPythonTag)) text.remove_prefix(kPythonTag.size());
  std::vector<ToolCall> calls;
  while (true) {
    std::string_view rest;
    const auto v = leading_json(text, rest);
    if (!v) return std::nullopt;
    auto call = call_of(*v);
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
    rest = trim_left(rest);
    if (rest.empty()) break;
    if (rest.front() != ';') return std::nullopt;
    text = rest.substr(1);
  }
  return calls;
}

// The longest end of `text` that could begin `marker`.
std::size_t partial_marker(std::string_view text, std::string_view marker) {
  for (std::size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (marker.starts_with(text.substr(text.size() - n))) return n;
  }
  return 0;
}

}  // namespace

std::string new_tool_call_id() {
  static std::atomic<std::uint64_t> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "call_";
  const std::uint64_t a = rng() ^ counter.fetch_add(1);
  const std::uint64_t b = rng();
  for (int i = 0; i < 16; ++i) id += kHex[(a >> (4 * i)) & 15];
  for (int i = 0; i < 8; ++i) id += kHex[(b >> (4 * i)) & 15];
  return id;
}

ToolCallFormat detect_tool_call_format(std::string_view chat_template) {
  if (chat_template.find(kHermesOpen) != std::string_view::npos) return ToolCallFormat::hermes;
  if (chat_template.find(kMistralMarker) != std::string_view::npos) return ToolCallFormat::mistral;
  if (chat_template.find(kPythonTag) != std::string_view::npos ||
      chat_template.find("<|start_header_id|>") != std::string_view::npos) {
    return ToolCallFormat::llama3_json;
  }
  return ToolCallFormat::hermes;
}

std::string_view tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::hermes:
      return "hermes";
    case ToolCallFormat::llama3_json:
      return "llama3_json";
    case ToolCallFormat::mistral:
      return "mistral";
  }
  return "hermes";
}

std::optional<ToolCallFormat> tool_call_format_named(std::string_view name) {
  for (auto f : {ToolCallFormat::hermes, ToolCallFormat::llama3_json, ToolCallFormat::mistral}) {
    if (tool_call_format_name(f) == name) return f;
  }
  return std::nullopt;
}

namespace {

// Rewrites the local references under `v` ("#", "#/$defs/X", "#/definitions/X": the
// function's own parameters and their definitions) to "#/$defs/<prefix>..." names.
// Recursion is bounded by the request's JSON depth (Boost.JSON's parser stops at 32).
void rebase_refs(json::value& v, const std::string& prefix) {
  if (v.is_array()) {
    for (auto& item : v.as_array()) rebase_refs(item, prefix);
    return;
  }
  if (!v.is_object()) return;
  for (auto& [key, value] : v.as_object()) {
    if (key == "$ref" && value.is_string()) {
      const std::string target(value.as_string());
      for (const char* section : {"#/$defs/", "#/definitions/"}) {
        if (target.rfind(section, 0) == 0) {
          value = "#/$defs/" + prefix + target.substr(std::string(section).size());
        }
      }
      if (target == "#") value = "#/$defs/" + prefix + "root";
      continue;
    }
    rebase_refs(value, prefix);
  }
}

}  // namespace

json::value hoist_definitions(const json::value& parameters, const std::string& prefix,
                              json::object& defs) {
  json::value own = parameters;
  if (!own.is_object()) return own;
  json::object& o = own.as_object();
  bool refers_to_itself = false;
  for (const char* section : {"$defs", "definitions"}) {
    if (const auto* found = o.if_contains(section); found != nullptr && found->is_object()) {
      for (const auto& [name, definition] : found->as_object()) {
        json::value moved = definition;
        rebase_refs(moved, prefix);
        defs[prefix + std::string(name)] = std::move(moved);
      }
      o.erase(section);
    }
  }
  const std::string self = json::serialize(own);
  refers_to_itself = self.find("\"$ref\":\"#\"") != std::string::npos;
  rebase_refs(own, prefix);
  if (refers_to_itself) defs[prefix + "root"] = own;
  return own;
}

tl::expected<ToolRequest, ApiError> parse_tool_request(const json::object& body,
                                                       ToolCallFormat format,
                                                       std::string& grammar) {
  ToolRequest request;
  request.format = format;
  const auto* tools = body.if_contains("tools");
  const auto* choice = body.if_contains("tool_choice");
  const bool has_tools = tools != nullptr && !tools->is_null();
  const bool parallel = [&] {
    const auto* p = body.if_contains("parallel_tool_calls");
    return p == nullptr || !p->is_bool() || p->get_bool();
  }();
  if (const auto* p = body.if_contains("parallel_tool_calls");
      p != nullptr && !p->is_null() && !p->is_bool()) {
    return tl::unexpected(
        bad_request("'parallel_tool_calls' must be a boolean", "parallel_tool_calls"));
  }
  // Each function's parameters by name, checked.
  std::vector<std::pair<std::string, json::value>> functions;
  if (has_tools) {
    if (!tools->is_array()) return tl::unexpected(bad_request("'tools' must be an array", "tools"));
    for (const auto& tool : tools->as_array()) {
      const auto* type = tool.is_object() ? tool.as_object().if_contains("type") : nullptr;
      const auto* function = tool.is_object() ? tool.as_object().if_contains("function") : nullptr;
      if (type == nullptr || !type->is_string() || type->get_string() != "function" ||
          function == nullptr || !function->is_object()) {
        return tl::unexpected(bad_request(
            "each tool must be {\"type\": \"function\", \"function\": {...}}", "tools"));
      }
      const auto& f = function->as_object();
      const auto* name = f.if_contains("name");
      if (name == nullptr || !name->is_string() || name->get_string().empty()) {
        return tl::unexpected(bad_request("each tool's function needs a 'name'", "tools"));
      }
      const auto* parameters = f.if_contains("parameters");
      if (parameters != nullptr && !parameters->is_null() && !parameters->is_object()) {
        return tl::unexpected(bad_request("the parameters of function '" +
                                              std::string(name->get_string()) +
                                              "' must be a JSON schema (an object)",
                                          "tools"));
      }
      json::value schema = parameters != nullptr && !parameters->is_null()
                               ? *parameters
                               : json::value(json::object{{"type", "object"}});
      // A call holds the arguments its function declares: where the parameters do not
      // say, no others (OpenAI's strict function calling says so always).
      if (auto& o = schema.as_object();
          o.contains("properties") && !o.contains("additionalProperties")) {
        o["additionalProperties"] = false;
      }
      functions.emplace_back(std::string(name->get_string()), std::move(schema));
    }
  }
  if (choice == nullptr || choice->is_null()) {
    request.choice = has_tools && !functions.empty() ? ToolRequest::Choice::automatic
                                                     : ToolRequest::Choice::none;
  } else if (choice->is_string()) {
    const auto& c = choice->get_string();
    if (c == "none") {
      request.choice = ToolRequest::Choice::none;
    } else if (c == "auto") {
      request.choice = ToolRequest::Choice::automatic;
    } else if (c == "required") {
      request.choice = ToolRequest::Choice::required;
    } else {
      return tl::unexpected(
          bad_request("'tool_choice' must be none, auto, required or "
                      "{\"type\": \"function\", \"function\": {\"name\": ...}}",
                      "tool_choice"));
    }
  } else {
    const auto* function =
        choice->is_object() ? choice->as_object().if_contains("function") : nullptr;
    const auto* name = function != nullptr && function->is_object()
                           ? function->as_object().if_contains("name")
                           : nullptr;
    if (name == nullptr || !name->is_string()) {
      return tl::unexpected(
          bad_request("'tool_choice' must be none, auto, required or "
                      "{\"type\": \"function\", \"function\": {\"name\": ...}}",
                      "tool_choice"));
    }
    request.choice = ToolRequest::Choice::named;
    request.function = std::string(name->get_string());
  }
  if (request.choice != ToolRequest::Choice::none && functions.empty()) {
    return tl::unexpected(bad_request("'tool_choice' needs 'tools'", "tool_choice"));
  }
  json::value schema;
  if (request.choice == ToolRequest::Choice::named) {
    const auto it = std::find_if(functions.begin(), functions.end(),
                                 [&](const auto& f) { return f.first == request.function; });
    if (it == functions.end()) {
      return tl::unexpected(bad_request(
          "'tool_choice' names function '" + request.function + "', which is not among the tools",
          "tool_choice"));
    }
    schema = it->second;
  } else if (request.choice == ToolRequest::Choice::required) {
    json::array any;
    json::object defs;  // every function's $defs, renamed apart
    for (std::size_t i = 0; i < functions.size(); ++i) {
      const auto& [name, parameters] = functions[i];
      json::object call{
          {"type", "object"},
          {"properties",
           json::object{
               {"name", json::object{{"const", name}}},
               {"parameters", hoist_definitions(parameters, "f" + std::to_string(i) + "-", defs)}}},
          {"required", json::array{"name", "parameters"}},
          {"additionalProperties", false}};
      any.emplace_back(std::move(call));
    }
    json::object array{{"type", "array"}, {"minItems", 1}, {"items", json::object{{"anyOf", any}}}};
    if (!parallel) array["maxItems"] = 1;
    if (!defs.empty()) array["$defs"] = std::move(defs);
    schema = std::move(array);
  }
  if (!schema.is_null()) {
    if (!grammar.empty()) {
      return tl::unexpected(bad_request(
          "'tool_choice' " +
              std::string(request.choice == ToolRequest::Choice::named ? "naming a function"
                                                                       : "required") +
              " holds the output to a call: it cannot be combined with "
              "another output constraint",
          "tool_choice"));
    }
    auto gbnf = schema_grammar(schema, "tools");
    if (!gbnf) return tl::unexpected(gbnf.error());
    grammar = std::move(*gbnf);
  }
  return request;
}

ToolOutput read_tool_calls(const ToolRequest& request, std::string_view text) {
  ToolOutput out;
  std::optional<std::vector<ToolCall>> calls;
  std::string_view content;
  switch (request.choice) {
    case ToolRequest::Choice::none:
      break;
    case ToolRequest::Choice::named: {
      std::string_view rest;
      if (const auto v = leading_json(text, rest); v && v->is_object() && trim(rest).empty()) {
        calls = std::vector<ToolCall>{{new_tool_call_id(), request.function, json::serialize(*v)}};
      }
      break;
    }
    case ToolRequest::Choice::required:
      calls = calls_of_array(text);
      break;
    case ToolRequest::Choice::automatic:
      switch (request.format) {
        case ToolCallFormat::hermes:
          if (const auto at = text.find(kHermesOpen); at != std::string_view::npos) {
            content = text.substr(0, at);
            calls = hermes_calls(text.substr(at));
          }
          break;
        case ToolCallFormat::mistral:
          if (const auto at = text.find(kMistralMarker); at != std::string_view::npos) {
            content = text.substr(0, at);
            calls = calls_of_array(text.substr(at + kMistralMarker.size()));
          } else if (trim_left(text).starts_with("[")) {
            calls = calls_of_array(text);  // the marker is a control token, not printed
          }
          break;
        case ToolCallFormat::llama3_json:
          if (const auto start = trim_left(text);
              start.starts_with("{") || start.starts_with(kPythonTag)) {
            calls = llama3_calls(text);
          }
          break;
      }
      break;
  }
  if (calls) {
    out.content = std::string(trim(content));
    out.calls = std::move(*calls);
  } else {
    out.content = std::string(text);
  }
  return out;
}

std::string ToolCallStream::feed(std::string_view text) {
  if (request_.choice == ToolRequest::Choice::none) return std::string(text);
  held_ += text;
  if (request_.choice != ToolRequest::Choice::automatic || in_call_) return "";
  // Llama 3.1 and Mistral (whose marker is a control token) open a call with the output
  // itself: wait until the first character that is not whitespace says.
  const bool opening = !sent_any_;
  if (opening && request_.format != ToolCallFormat::hermes) {
    const auto start = trim_left(held_);
    if (start.empty()) return "";
    if (request_.format == ToolCallFormat::llama3_json && start.size() < kPythonTag.size() &&
        kPythonTag.starts_with(start)) {
      return "";  // perhaps <|python_tag|>: wait for the next piece to say
    }
    const bool call = request_.format == ToolCallFormat::llama3_json
                          ? start.starts_with("{") || start.starts_with(kPythonTag)
                          : start.starts_with("[");
    if (call) {
      in_call_ = true;
      return "";
    }
  }
  const std::string_view marker =
      request_.format == ToolCallFormat::mistral ? kMistralMarker : kHermesOpen;
  std::size_t keep = 0;
  if (request_.format != ToolCallFormat::llama3_json) {
    if (const auto at = held_.find(marker); at != std::string::npos) {
      in_call_ = true;
      std::string out = held_.substr(0, at);
      held_.erase(0, at);
      sent_any_ = sent_any_ || !out.empty();
      return out;
    }
    keep = partial_marker(held_, marker);
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  sent_any_ = sent_any_ || !out.empty();
  return out;
}

ToolOutput ToolCallStream::take(std::string_view text, bool last) {
  ToolOutput out;
  out.content = feed(text);
  // From a call's start on, held_ only grows: the scanner reads what it has not yet.
  if (in_call_ || request_.choice == ToolRequest::Choice::named ||
      request_.choice == ToolRequest::Choice::required) {
    scanner_.feed(std::string_view(held_).substr(scanned_), out.deltas);
    scanned_ = held_.size();
  }
  if (!last) return out;
  ToolOutput read = read_tool_calls(request_, held_);
  held_.clear();
  out.content += read.content;
  // The calls as read whole keep the ids their deltas gave; what the deltas did not carry
  // (arguments given as a JSON string, a call the scanner did not see) goes out now.
  const auto& streamed = scanner_.calls();
  for (std::size_t i = 0; i < read.calls.size(); ++i) {
    ToolCall& call = read.calls[i];
    if (i < streamed.size()) {
      call.id = streamed[i].id;
      if (!streamed[i].arguments_begun) {
        out.deltas.push_back(ToolCallDelta{i, {}, {}, call.arguments});
      }
    } else {
      out.deltas.push_back(ToolCallDelta{i, call.id, call.name, call.arguments});
    }
  }
  out.calls = std::move(read.calls);
  return out;
}

json::array tool_calls_json(const std::vector<ToolCall>& calls, bool with_index) {
  json::array array;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    json::object call;
    if (with_index) call["index"] = i;
    call["id"] = calls[i].id;
    call["type"] = "function";
    call["function"] = json::object{{"name", calls[i].name}, {"arguments", calls[i].arguments}};
    array.emplace_back(std::move(call));
  }
  return array;
}

json::array tool_call_deltas_json(const std::vector<ToolCallDelta>& deltas) {
  json::array array;
  for (const ToolCallDelta& delta : deltas) {
    json::object call{{"index", delta.index}};
    json::object function;
    if (!delta.id.empty()) {
      call["id"] = delta.id;
      call["type"] = "function";
      function["name"] = delta.name;
    }
    function["arguments"] = delta.arguments;
    call["function"] = std::move(function);
    array.emplace_back(std::move(call));
  }
  return array;
}

}  // namespace troupe::net
