// jinja2's filters (`value | name(args)`) that chat templates use, with Hugging Face's
// tojson (json.dumps, not jinja2's HTML-safe one). Errors are thrown as jinja::Failure.
#pragma once

#include <string_view>

#include "text/jinja/value.hpp"

namespace troupe::text::jinja {

Value apply_filter(std::string_view name, const Value& input, const CallArgs& args);

}  // namespace troupe::text::jinja
