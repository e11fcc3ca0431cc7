#include "net/responses_api.hpp"

#include <algorithm>
#include <boost/json.hpp>
#include <iterator>

#include "text/unicode.hpp"

namespace troupe::net {

namespace json = boost::json;

namespace {

// What a Responses body may carry: OpenAI's fields that mean something without a store,
// and vLLM's sampling extras, which go to the chat request as they came.
constexpr std::string_view kResponsesFields[] = {"model",
                                                 "input",
                                                 "instructions",
                                                 "max_output_tokens",
                                                 "temperature",
                                                 "top_p",
                                                 "stream",
                                                 "tools",
                                                 "tool_choice",
                                                 "parallel_tool_calls",
                                                 "text",
                                                 "store",
                                                 "metadata",
                                                 "user",
                                                 "previous_response_id",
                                                 "reasoning",
                                                 "truncation",
                                                 "include",
                                                 "service_tier",
                                                 "background"};
constexpr std::string_view kPassedThrough[] = {"top_k",
                                               "min_p",
                                               "seed",
                                               "stop",
                                               "presence_penalty",
                                               "frequency_penalty",
                                               "repetition_penalty",
                                               "ignore_eos",
                                               "min_tokens",
                                               "chat_template_kwargs",
                                               "priority",
                                               "logit_bias",
                                               "skip_special_tokens",
                                               "include_stop_str_in_output",
                                               "stream_options"};

template <class List>
bool among(std::string_view key, const List& list) {
  return std::find(std::begin(list), std::end(list), key) != std::end(list);
}

tl::unexpected<ApiError> refuse(std::string message, std::string param) {
  return tl::unexpected(bad_request(std::move(message), std::move(param)));
}

// A message item's content: a text, or input_text/output_text parts (as chat's text parts).
tl::expected<json::value, ApiError> message_content(const json::value& content) {
  if (content.is_string()) return content;
  if (!content.is_array()) {
    return refuse("a message's 'content' must be a string or an array of parts", "input");
  }
  json::array parts;
  for (const auto& part : content.as_array()) {
    const auto* type = part.is_object() ? part.as_object().if_contains("type") : nullptr;
    const auto* text = part.is_object() ? part.as_object().if_contains("text") : nullptr;
    const std::string_view kind =
        type != nullptr && type->is_string() ? std::string_view(type->get_string()) : "";
    if ((kind == "input_text" || kind == "output_text") && text != nullptr && text->is_string()) {
      parts.emplace_back(json::object{{"type", "text"}, {"text", *text}});
      continue;
    }
    return refuse("content part type '" + std::string(kind) +
                      "' is not supported here: only input_text and output_text",
                  "input");
  }
  return json::value(std::move(parts));
}

// `input` (with `instructions` first, as a system message) as chat messages.
tl::expected<json::array, ApiError> chat_messages(const json::object& o) {
  json::array messages;
  if (const auto* instructions = o.if_contains("instructions");
      instructions != nullptr && !instructions->is_null()) {
    if (!instructions->is_string())
      return refuse("'instructions' must be a string", "instructions");
    messages.emplace_back(json::object{{"role", "system"}, {"content", *instructions}});
  }
  const auto* input = o.if_contains("input");
  if (input == nullptr || input->is_null()) return refuse("'input' is required", "input");
  if (input->is_string()) {
    messages.emplace_back(json::object{{"role", "user"}, {"content", *input}});
    return messages;
  }
  if (!input->is_array()) return refuse("'input' must be a string or an array of items", "input");
  for (const auto& value : input->as_array()) {
    if (!value.is_object()) return refuse("each 'input' item must be an object", "input");
    const json::object& item = value.as_object();
    const auto* type_value = item.if_contains("type");
    const std::string type = type_value != nullptr && type_value->is_string()
                                 ? std::string(type_value->get_string())
                                 : (item.contains("role") ? "message" : "");
    if (type == "message") {
      const auto* role = item.if_contains("role");
      const auto* content = item.if_contains("content");
      if (role == nullptr || !role->is_string() || content == nullptr) {
        return refuse("a message item needs 'role' and 'content'", "input");
      }
      auto text = message_content(*content);
      if (!text) return tl::unexpected(text.error());
      messages.emplace_back(json::object{{"role", *role}, {"content", std::move(*text)}});
    } else if (type == "function_call") {
      const auto* call_id = item.if_contains("call_id");
      const auto* name = item.if_contains("name");
      const auto* arguments = item.if_contains("arguments");
      if (call_id == nullptr || !call_id->is_string() || name == nullptr || !name->is_string() ||
          arguments == nullptr || !arguments->is_string()) {
        return refuse("a function_call item needs 'call_id', 'name' and 'arguments' (strings)",
                      "input");
      }
      json::object call{{"id", *call_id},
                        {"type", "function"},
                        {"function", json::object{{"name", *name}, {"arguments", *arguments}}}};
      // Calls in a row are one assistant turn.
      json::object* last = messages.empty() ? nullptr : messages.back().if_object();
      if (last != nullptr && last->contains("tool_calls")) {
        last->at("tool_calls").as_array().emplace_back(std::move(call));
      } else {
        messages.emplace_back(json::object{
            {"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::array{call}}});
      }
    } else if (type == "function_call_output") {
      const auto* call_id = item.if_contains("call_id");
      const auto* output = item.if_contains("output");
      if (call_id == nullptr || !call_id->is_string() || output == nullptr) {
        return refuse("a function_call_output item needs 'call_id' and 'output'", "input");
      }
      auto text = message_content(*output);
      if (!text) return tl::unexpected(text.error());
      messages.emplace_back(
          json::object{{"role", "tool"}, {"tool_call_id", *call_id}, {"content", *text}});
    } else if (type == "reasoning") {
      // A model's earlier thinking: the templates leave it out of the prompt.
    } else {
      return refuse("input item type '" + type +
                        "' is not supported here (message, function_call, "
                        "function_call_output and reasoning are; item_reference needs a store)",
                    "input");
    }
  }
  if (messages.empty()) return refuse("'input' holds no message", "input");
  return messages;
}

// Responses' function tools ({"type": "function", "name", "parameters"}) as chat's.
tl::expected<json::array, ApiError> chat_tools(const json::value& tools) {
  if (!tools.is_array()) return refuse("'tools' must be an array", "tools");
  json::array out;
  for (const auto& tool : tools.as_array()) {
    const auto* type = tool.is_object() ? tool.as_object().if_contains("type") : nullptr;
    if (type == nullptr || !type->is_string() || type->get_string() != "function") {
      const std::string kind =
          type != nullptr && type->is_string() ? std::string(type->get_string()) : "?";
      return refuse("tool type '" + kind + "' is not supported here: only function tools", "tools");
    }
    json::object function;
    for (const auto& [key, value] : tool.as_object()) {
      if (key == "name" || key == "description" || key == "parameters") function[key] = value;
    }
    out.emplace_back(json::object{{"type", "function"}, {"function", std::move(function)}});
  }
  return out;
}

// A chat request's error as the Responses field it came from.
ApiError renamed(ApiError error) {
  static const std::pair<std::string_view, std::string_view> kNames[] = {
      {"max_tokens", "max_output_tokens"}, {"messages", "input"}, {"response_format", "text"}};
  for (const auto& [chat, responses] : kNames) {
    if (error.param != chat) continue;
    error.param = std::string(responses);
    const std::string quoted = "'" + std::string(chat) + "'";
    for (auto at = error.message.find(quoted); at != std::string::npos;
         at = error.message.find(quoted, at)) {
      error.message.replace(at, quoted.size(), "'" + std::string(responses) + "'");
    }
  }
  return error;
}

}  // namespace

tl::expected<CompletionRequest, ApiError> parse_responses_request(std::string_view body,
                                                                  const ApiContext& context) {
  json::error_code ec;
  json::value parsed = json::parse(body, ec);
  if (ec) return refuse("the body is not valid JSON: " + ec.message(), "");
  if (!parsed.is_object()) return refuse("the body must be a JSON object", "");
  const json::object& o = parsed.as_object();
  for (const auto& [key, value] : o) {
    if (!among(key, kResponsesFields) && !among(key, kPassedThrough) && !value.is_null()) {
      return refuse("Unrecognized request argument supplied: " + std::string(key) + " (responses)",
                    std::string(key));
    }
  }
  // Nothing is kept: no earlier response to follow, nothing to run in the background.
  if (const auto* previous = o.if_contains("previous_response_id");
      previous != nullptr && !previous->is_null()) {
    const std::string id = previous->is_string() ? std::string(previous->get_string()) : "";
    return tl::unexpected(ApiError{404,
                                   "Response with id '" + id +
                                       "' not found: this server stores no responses; send the "
                                       "whole conversation as 'input'",
                                   "NotFoundError", "previous_response_id"});
  }
  if (const auto* background = o.if_contains("background");
      background != nullptr &&
      !(background->is_null() || (background->is_bool() && !background->get_bool()))) {
    return refuse("'background' needs a store of responses, which this server does not keep",
                  "background");
  }
  if (const auto* include = o.if_contains("include");
      include != nullptr && !include->is_null() &&
      !(include->is_array() && include->as_array().empty())) {
    return refuse("'include' is not supported here (no extra output is kept)", "include");
  }

  json::object chat;
  auto messages = chat_messages(o);
  if (!messages) return tl::unexpected(messages.error());
  chat["messages"] = std::move(*messages);
  for (const std::string_view key :
       {"model", "temperature", "top_p", "stream", "tool_choice", "parallel_tool_calls"}) {
    if (const auto* v = o.if_contains(key); v != nullptr && !v->is_null()) chat[key] = *v;
  }
  for (const std::string_view key : kPassedThrough) {
    if (const auto* v = o.if_contains(key); v != nullptr && !v->is_null()) chat[key] = *v;
  }
  if (const auto* v = o.if_contains("max_output_tokens"); v != nullptr && !v->is_null()) {
    chat["max_tokens"] = *v;
  }
  if (const auto* tools = o.if_contains("tools"); tools != nullptr && !tools->is_null()) {
    auto converted = chat_tools(*tools);
    if (!converted) return tl::unexpected(converted.error());
    chat["tools"] = std::move(*converted);
  }
  // {"type": "function", "name": ...}: chat's {"type": "function", "function": {"name"}}.
  if (const auto* choice = o.if_contains("tool_choice"); choice != nullptr && choice->is_object()) {
    const auto* name = choice->as_object().if_contains("name");
    if (name == nullptr || !name->is_string()) {
      return refuse(
          "'tool_choice' must be none, auto, required or {\"type\": \"function\", "
          "\"name\": ...}",
          "tool_choice");
    }
    chat["tool_choice"] =
        json::object{{"type", "function"}, {"function", json::object{{"name", *name}}}};
  }
  // text.format: text, json_object, or json_schema (name, schema, strict at its top).
  if (const auto* text = o.if_contains("text"); text != nullptr && !text->is_null()) {
    const auto* format = text->is_object() ? text->as_object().if_contains("format") : nullptr;
    const auto* type = format != nullptr && format->is_object()
                           ? format->as_object().if_contains("type")
                           : nullptr;
    const std::string kind = type != nullptr && type->is_string() ? std::string(type->get_string())
                                                                  : (format ? "?" : "text");
    if (kind == "json_object") {
      chat["response_format"] = json::object{{"type", "json_object"}};
    } else if (kind == "json_schema") {
      json::object schema;
      for (const auto& [key, value] : format->as_object()) {
        if (key != "type") schema[key] = value;
      }
      chat["response_format"] =
          json::object{{"type", "json_schema"}, {"json_schema", std::move(schema)}};
    } else if (kind != "text") {
      return refuse("'text.format' must be of type text, json_object or json_schema", "text");
    }
  }
  if (const auto* reasoning = o.if_contains("reasoning");
      reasoning != nullptr && reasoning->is_object()) {
    if (const auto* effort = reasoning->as_object().if_contains("effort");
        effort != nullptr && !effort->is_null()) {
      chat["reasoning_effort"] = *effort;
    }
  }
  auto request = parse_chat_request(json::serialize(chat), context);
  if (!request) return tl::unexpected(renamed(request.error()));

  // The response object repeats these.
  auto field = [&o](std::string_view key, json::value otherwise) {
    const auto* v = o.if_contains(key);
    return v != nullptr && !v->is_null() ? *v : otherwise;
  };
  json::object echo{
      {"instructions", field("instructions", nullptr)},
      {"max_output_tokens", field("max_output_tokens", nullptr)},
      {"temperature", field("temperature", 1.0)},
      {"top_p", field("top_p", 1.0)},
      {"tools", field("tools", json::array{})},
      {"tool_choice", field("tool_choice", "auto")},
      {"parallel_tool_calls", field("parallel_tool_calls", true)},
      {"text", field("text", json::object{{"format", json::object{{"type", "text"}}}})},
      {"reasoning", field("reasoning", nullptr)},
      {"truncation", field("truncation", "disabled")},
      {"metadata", field("metadata", json::object{})},
      {"user", field("user", nullptr)},
  };
  request->responses_fields = json::serialize(echo);
  return request;
}

namespace {

json::object reasoning_item(const std::string& id, const std::string& text, bool done) {
  return json::object{
      {"type", "reasoning"},
      {"id", id},
      {"summary", json::array{}},
      {"content", done ? json::value(json::array{json::object{{"type", "reasoning_text"},
                                                              {"text", text::to_valid_utf8(text)}}})
                       : json::value(json::array{})},
      {"status", done ? "completed" : "in_progress"}};
}

json::object text_part(const std::string& text) {
  return json::object{{"type", "output_text"},
                      {"text", text::to_valid_utf8(text)},
                      {"annotations", json::array{}},
                      {"logprobs", json::array{}}};
}

json::object message_item(const std::string& id, const std::string& text, bool done) {
  return json::object{
      {"type", "message"},
      {"id", id},
      {"status", done ? "completed" : "in_progress"},
      {"role", "assistant"},
      {"content", done ? json::value(json::array{text_part(text)}) : json::value(json::array{})}};
}

json::object call_item(const std::string& id, const ToolCall& call, bool done) {
  return json::object{{"type", "function_call"},
                      {"id", id},
                      {"call_id", call.id},
                      {"name", call.name},
                      {"arguments", done ? text::to_valid_utf8(call.arguments) : std::string()},
                      {"status", done ? "completed" : "in_progress"}};
}

// An item id of the response's: its kind's prefix and the response's own number.
std::string item_id(std::string_view prefix, const std::string& response_id) {
  const auto underscore = response_id.find('_');
  return std::string(prefix) + "_" +
         (underscore == std::string::npos ? response_id : response_id.substr(underscore + 1));
}

ResponseItemIds item_ids(const std::string& response_id, std::size_t num_calls) {
  ResponseItemIds ids{item_id("rs", response_id), item_id("msg", response_id), {}};
  for (std::size_t i = 0; i < num_calls; ++i) {
    ids.function_calls.push_back(item_id("fc", response_id) + "_" + std::to_string(i));
  }
  return ids;
}

// The output of a whole choice: its thinking, its answer (also when there is nothing
// else), its calls.
json::array output_items(const ChoiceText& read, const ResponseItemIds& ids) {
  json::array output;
  if (!read.reasoning.empty())
    output.emplace_back(reasoning_item(ids.reasoning, read.reasoning, true));
  if (!read.content.empty() || (read.calls.empty() && read.reasoning.empty())) {
    output.emplace_back(message_item(ids.message, read.content, true));
  }
  for (std::size_t i = 0; i < read.calls.size() && i < ids.function_calls.size(); ++i) {
    output.emplace_back(call_item(ids.function_calls[i], read.calls[i], true));
  }
  return output;
}

std::string_view response_status(const TokenEvent& end) {
  switch (end.finish_reason) {
    case FinishReason::length:
      return "incomplete";
    case FinishReason::abort:
    case FinishReason::timeout:
      return "cancelled";
    case FinishReason::error:
      return "failed";
    default:
      return "completed";
  }
}

json::object response_json(const ApiContext& context, const std::string& id, std::int64_t created,
                           const CompletionRequest& request, std::string_view status,
                           json::array output, const TokenEvent* end) {
  json::object o{{"id", id},
                 {"object", "response"},
                 {"created_at", created},
                 {"status", status},
                 {"model", answer_model(context, request)},
                 {"output", std::move(output)},
                 {"error", nullptr},
                 {"incomplete_details", nullptr},
                 {"previous_response_id", nullptr},
                 {"store", false}};
  json::error_code ec;
  const json::value echo = json::parse(request.responses_fields, ec);
  if (!ec && echo.is_object()) {
    for (const auto& [key, value] : echo.as_object()) o[key] = value;
  }
  if (end != nullptr) {
    if (end->finish_reason == FinishReason::length) {
      o["incomplete_details"] = json::object{{"reason", "max_output_tokens"}};
    }
    if (end->finish_reason == FinishReason::error) {
      o["error"] =
          json::object{{"code", "server_error"}, {"message", text::to_valid_utf8(end->error)}};
    }
    o["usage"] = json::object{
        {"input_tokens", end->num_prompt_tokens},
        {"input_tokens_details", json::object{{"cached_tokens", end->num_cached_tokens}}},
        {"output_tokens", end->num_generated_tokens},
        {"total_tokens", end->num_prompt_tokens + end->num_generated_tokens}};
  } else {
    o["usage"] = nullptr;
  }
  return o;
}

}  // namespace

std::string responses_response(const ApiContext& context, const std::string& id,
                               std::int64_t created, const CompletionRequest& request,
                               const CompletionOutput& output) {
  const ChoiceText read = read_choice_text(request, output.text);
  const ResponseItemIds ids = item_ids(id, read.calls.size());
  return json::serialize(response_json(context, id, created, request, response_status(output.end),
                                       output_items(read, ids), &output.end));
}

ResponsesStream::ResponsesStream(const ApiContext& context, std::string id, std::int64_t created,
                                 const CompletionRequest& request)
    : context_(context),
      id_(std::move(id)),
      created_(created),
      request_(request),
      reads_(request),
      ids_(item_ids(id_, 0)) {}

std::string ResponsesStream::event(std::string_view type, json::object fields) {
  json::object o{{"type", type}};
  for (auto& [key, value] : fields) o[key] = std::move(value);
  o["sequence_number"] = sequence_++;
  return "event: " + std::string(type) + "\ndata: " + json::serialize(o) + "\n\n";
}

json::object ResponsesStream::response_object(std::string_view status,
                                              const TokenEvent* end) const {
  // Until the end, the output is what the events have said so far: nothing at the start.
  return response_json(context_, id_, created_, request_, status,
                       end != nullptr ? output_items(so_far_, ids_) : json::array{}, end);
}

std::string ResponsesStream::start() {
  std::string out =
      event("response.created", {{"response", response_object("in_progress", nullptr)}});
  out += event("response.in_progress", {{"response", response_object("in_progress", nullptr)}});
  return out;
}

std::string ResponsesStream::close_item() {
  std::string out;
  if (open_ == Open::reasoning) {
    out +=
        event("response.reasoning_text.done", {{"item_id", ids_.reasoning},
                                               {"output_index", output_index_},
                                               {"content_index", 0},
                                               {"text", text::to_valid_utf8(so_far_.reasoning)}});
    out += event("response.output_item.done",
                 {{"output_index", output_index_},
                  {"item", reasoning_item(ids_.reasoning, so_far_.reasoning, true)}});
  } else if (open_ == Open::message) {
    const json::object part = text_part(so_far_.content);
    out += event("response.output_text.done", {{"item_id", ids_.message},
                                               {"output_index", output_index_},
                                               {"content_index", 0},
                                               {"text", part.at("text")},
                                               {"logprobs", json::array{}}});
    out += event("response.content_part.done", {{"item_id", ids_.message},
                                                {"output_index", output_index_},
                                                {"content_index", 0},
                                                {"part", part}});
    out += event("response.output_item.done",
                 {{"output_index", output_index_},
                  {"item", message_item(ids_.message, so_far_.content, true)}});
  }
  // A call's item is done at the response's end, when its arguments are all there.
  if (open_ != Open::function_call) open_ = Open::none;
  return out;
}

std::string ResponsesStream::take(const TokenEvent& event_in) {
  ChoiceText shown = reads_.take(event_in.text, event_in.finished);
  std::string out;
  if (!shown.reasoning.empty()) {
    if (open_ != Open::reasoning) {
      out += close_item();
      open_ = Open::reasoning;
      ++output_index_;
      out += event(
          "response.output_item.added",
          {{"output_index", output_index_}, {"item", reasoning_item(ids_.reasoning, "", false)}});
    }
    so_far_.reasoning += shown.reasoning;
    out +=
        event("response.reasoning_text.delta", {{"item_id", ids_.reasoning},
                                                {"output_index", output_index_},
                                                {"content_index", 0},
                                                {"delta", text::to_valid_utf8(shown.reasoning)}});
  }
  if (!shown.content.empty()) {
    if (open_ != Open::message) {
      out += close_item();
      open_ = Open::message;
      ++output_index_;
      out += event("response.output_item.added", {{"output_index", output_index_},
                                                  {"item", message_item(ids_.message, "", false)}});
      out += event("response.content_part.added", {{"item_id", ids_.message},
                                                   {"output_index", output_index_},
                                                   {"content_index", 0},
                                                   {"part", text_part("")}});
    }
    so_far_.content += shown.content;
    out += event("response.output_text.delta", {{"item_id", ids_.message},
                                                {"output_index", output_index_},
                                                {"content_index", 0},
                                                {"delta", text::to_valid_utf8(shown.content)},
                                                {"logprobs", json::array{}}});
  }
  for (const ToolCallDelta& delta : shown.deltas) {
    if (!delta.id.empty() && delta.index == so_far_.calls.size()) {
      out += close_item();
      open_ = Open::function_call;
      ++output_index_;
      so_far_.calls.push_back(ToolCall{delta.id, delta.name, ""});
      ids_.function_calls.push_back(item_id("fc", id_) + "_" + std::to_string(delta.index));
      call_output_index_.push_back(output_index_);
      out += event("response.output_item.added",
                   {{"output_index", output_index_},
                    {"item", call_item(ids_.function_calls.back(), so_far_.calls.back(), false)}});
    }
    if (delta.index >= so_far_.calls.size() || delta.arguments.empty()) continue;
    so_far_.calls[delta.index].arguments += delta.arguments;
    out += event("response.function_call_arguments.delta",
                 {{"item_id", ids_.function_calls[delta.index]},
                  {"output_index", call_output_index_[delta.index]},
                  {"delta", text::to_valid_utf8(delta.arguments)}});
  }
  if (!event_in.finished) return out;
  open_ = open_ == Open::function_call ? Open::none : open_;
  out += close_item();
  for (std::size_t i = 0; i < so_far_.calls.size(); ++i) {
    out += event("response.function_call_arguments.done",
                 {{"item_id", ids_.function_calls[i]},
                  {"output_index", call_output_index_[i]},
                  {"arguments", text::to_valid_utf8(so_far_.calls[i].arguments)}});
    out += event("response.output_item.done",
                 {{"output_index", call_output_index_[i]},
                  {"item", call_item(ids_.function_calls[i], so_far_.calls[i], true)}});
  }
  const std::string_view status = response_status(event_in);
  const std::string type = status == "completed"    ? "response.completed"
                           : status == "incomplete" ? "response.incomplete"
                           : status == "failed"     ? "response.failed"
                                                    : "response.cancelled";
  out += event(type, {{"response", response_object(status, &event_in)}});
  return out;
}

}  // namespace troupe::net
