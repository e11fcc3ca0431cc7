#include "net/chat_input.hpp"

#include <boost/json.hpp>
#include <optional>

namespace troupe::net {

namespace json = boost::json;
namespace jinja = text::jinja;

namespace {

tl::expected<jinja::Value, ApiError> content_of(const json::object& message) {
  const auto* c = message.if_contains("content");
  if (c == nullptr || c->is_null()) return jinja::Value(nullptr);
  if (c->is_string()) return jinja::Value(std::string(c->get_string()));
  if (!c->is_array()) {
    return tl::unexpected(
        bad_request("a message's content must be a string or text parts", "messages"));
  }
  // [{"type": "text", "text": ...}, ...]: the texts, one a line, as vLLM joins them for a
  // template that reads content as a string.
  std::string text;
  bool first = true;
  for (const auto& part : c->as_array()) {
    if (!part.is_object()) {
      return tl::unexpected(bad_request("each content part must be an object", "messages"));
    }
    const auto& po = part.as_object();
    const auto* type = po.if_contains("type");
    if (type != nullptr && type->is_string() && type->get_string() != "text" &&
        type->get_string() != "input_text") {
      return tl::unexpected(bad_request("content parts of type '" +
                                            std::string(type->get_string()) +
                                            "' are not supported: this server reads text only",
                                        "messages"));
    }
    const auto* t = po.if_contains("text");
    if (t == nullptr || !t->is_string()) {
      return tl::unexpected(bad_request("a text content part needs its 'text'", "messages"));
    }
    if (!first) text += '\n';
    text += std::string(t->get_string());
    first = false;
  }
  return jinja::Value(std::move(text));
}

// Each call's function.arguments as the object its JSON text holds, when it holds one.
tl::expected<jinja::Value, ApiError> tool_calls_of(const json::value& calls) {
  if (!calls.is_array())
    return tl::unexpected(bad_request("'tool_calls' must be an array", "messages"));
  jinja::List out;
  for (const auto& call : calls.as_array()) {
    if (!call.is_object())
      return tl::unexpected(bad_request("each tool call must be an object", "messages"));
    jinja::Value value = template_value(call);
    const jinja::Value* function = value.as_dict().find("function");
    if (function != nullptr && function->is_dict()) {
      const jinja::Value* arguments = function->as_dict().find("arguments");
      if (arguments != nullptr && arguments->is_string()) {
        boost::system::error_code ec;
        const json::value parsed = json::parse(arguments->as_string(), ec);
        if (!ec && parsed.is_object())
          function->mutable_dict().set("arguments", template_value(parsed));
      }
    }
    out.push_back(std::move(value));
  }
  return jinja::Value(std::move(out));
}

tl::expected<jinja::Value, ApiError> message_of(const json::value& m) {
  if (!m.is_object())
    return tl::unexpected(bad_request("each message must be an object", "messages"));
  const auto& mo = m.as_object();
  const auto* role = mo.if_contains("role");
  if (role == nullptr || !role->is_string() ||
      (role->get_string() != "system" && role->get_string() != "developer" &&
       role->get_string() != "user" && role->get_string() != "assistant" &&
       role->get_string() != "tool")) {
    return tl::unexpected(bad_request(
        "a message's role must be system, developer, user, assistant or tool", "messages"));
  }
  auto content = content_of(mo);
  if (!content) return tl::unexpected(content.error());
  jinja::Dict message;
  // OpenAI's newer name for the system prompt: templates know "system".
  const std::string_view role_name = role->get_string();
  message.set("role", std::string(role_name == "developer" ? "system" : role_name));
  message.set("content", std::move(*content));
  if (const auto* calls = mo.if_contains("tool_calls"); calls != nullptr && !calls->is_null()) {
    auto converted = tool_calls_of(*calls);
    if (!converted) return tl::unexpected(converted.error());
    message.set("tool_calls", std::move(*converted));
  }
  for (const char* key : {"tool_call_id", "name"}) {
    const auto* v = mo.if_contains(key);
    if (v == nullptr || v->is_null()) continue;
    if (!v->is_string()) {
      return tl::unexpected(
          bad_request("a message's '" + std::string(key) + "' must be a string", "messages"));
    }
    message.set(key, std::string(v->get_string()));
  }
  // Anything else the client sent (reasoning_content, ...) reaches the template as it came.
  for (const auto& [key, value] : mo) {
    if (message.find(key) == nullptr) message.set(std::string(key), template_value(value));
  }
  return jinja::Value(std::move(message));
}

}  // namespace

jinja::Value template_value(const json::value& v) {
  switch (v.kind()) {
    case json::kind::null:
      return nullptr;
    case json::kind::bool_:
      return v.get_bool();
    case json::kind::int64:
      return v.get_int64();
    case json::kind::uint64:
      return v.get_uint64() <= static_cast<std::uint64_t>(INT64_MAX)
                 ? jinja::Value(static_cast<std::int64_t>(v.get_uint64()))
                 : jinja::Value(static_cast<double>(v.get_uint64()));
    case json::kind::double_:
      return v.get_double();
    case json::kind::string:
      return std::string(v.get_string());
    case json::kind::array: {
      jinja::List items;
      for (const auto& item : v.get_array()) items.push_back(template_value(item));
      return items;
    }
    case json::kind::object: {
      jinja::Dict d;
      for (const auto& [key, value] : v.get_object())
        d.set(std::string(key), template_value(value));
      return d;
    }
  }
  return nullptr;
}

tl::expected<text::ChatInput, ApiError> parse_chat_input(const json::object& body) {
  text::ChatInput input;
  const auto* messages = body.if_contains("messages");
  if (messages == nullptr || !messages->is_array() || messages->as_array().empty()) {
    return tl::unexpected(bad_request("'messages' must be a non-empty array", "messages"));
  }
  for (const auto& m : messages->as_array()) {
    auto message = message_of(m);
    if (!message) return tl::unexpected(message.error());
    input.messages.push_back(std::move(*message));
  }
  if (const auto* tools = body.if_contains("tools"); tools != nullptr && !tools->is_null()) {
    if (!tools->is_array()) return tl::unexpected(bad_request("'tools' must be an array", "tools"));
    input.tools = template_value(*tools);
  }
  if (const auto* kwargs = body.if_contains("chat_template_kwargs");
      kwargs != nullptr && !kwargs->is_null()) {
    if (!kwargs->is_object()) {
      return tl::unexpected(
          bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs"));
    }
    input.kwargs = template_value(*kwargs).as_dict();
  }
  auto flag = [&body](const char* name) -> tl::expected<std::optional<bool>, ApiError> {
    const auto* v = body.if_contains(name);
    if (v == nullptr || v->is_null()) return std::nullopt;
    if (!v->is_bool()) {
      return tl::unexpected(bad_request("'" + std::string(name) + "' must be a boolean", name));
    }
    return v->get_bool();
  };
  // vLLM's extensions: add_generation_prompt (true by default), continue_final_message.
  auto add_prompt = flag("add_generation_prompt");
  if (!add_prompt) return tl::unexpected(add_prompt.error());
  auto continue_final = flag("continue_final_message");
  if (!continue_final) return tl::unexpected(continue_final.error());
  input.continue_final_message = continue_final->value_or(false);
  // Continuing the final message opens no new turn: leaving add_generation_prompt out
  // means false then, as vLLM's clients send it; true beside it is a contradiction.
  input.add_generation_prompt = add_prompt->value_or(!input.continue_final_message);
  if (input.continue_final_message && input.add_generation_prompt) {
    return tl::unexpected(
        bad_request("'continue_final_message' and 'add_generation_prompt' cannot both be true",
                    "continue_final_message"));
  }
  if (const auto* documents = body.if_contains("documents");
      documents != nullptr && !documents->is_null()) {
    if (!documents->is_array()) {
      return tl::unexpected(bad_request("'documents' must be an array of objects", "documents"));
    }
    for (const auto& document : documents->as_array()) {
      if (!document.is_object()) {
        return tl::unexpected(bad_request("'documents' must be an array of objects", "documents"));
      }
    }
    input.documents = template_value(*documents);
  }
  // OpenAI's reasoning_effort reaches the template as a variable (gpt-oss's and others'
  // templates read it); chat_template_kwargs' own, when both are given, wins.
  if (const auto* effort = body.if_contains("reasoning_effort");
      effort != nullptr && !effort->is_null()) {
    const bool known = effort->is_string() &&
                       (effort->get_string() == "minimal" || effort->get_string() == "low" ||
                        effort->get_string() == "medium" || effort->get_string() == "high");
    if (!known) {
      return tl::unexpected(bad_request("'reasoning_effort' must be minimal, low, medium or high",
                                        "reasoning_effort"));
    }
    if (input.kwargs.find("reasoning_effort") == nullptr) {
      input.kwargs.set("reasoning_effort", std::string(effort->get_string()));
    }
  }
  return input;
}

}  // namespace troupe::net
