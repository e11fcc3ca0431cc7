// The chat part of a /v1/chat/completions body as a chat template's input: the
// messages as the client sent them (checked), the request's tools and its
// chat_template_kwargs (vLLM's extension).
#pragma once

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include "net/openai_api.hpp"
#include "text/chat_template.hpp"

namespace troupe::net {

// Messages keep role, content (a string, text parts joined, or none), tool_calls (a
// function's "arguments" given as a JSON string become the object it holds, as vLLM
// passes them), tool_call_id and name, checked; any other key goes through as it
// came. Roles: system, developer (OpenAI's newer name, given to the template as system),
// user, assistant, tool; content parts of type text are joined one a line (vLLM's way),
// any other type is refused naming it. Also read: documents, continue_final_message (with
// add_generation_prompt false, its default then) and reasoning_effort (a template
// variable, unless chat_template_kwargs has its own).
tl::expected<text::ChatInput, ApiError> parse_chat_input(const boost::json::object& body);

// A JSON value as a template value (objects keep their key order).
text::jinja::Value template_value(const boost::json::value& json);

}  // namespace troupe::net
