// The structured-output fields of a request, as the one grammar (GBNF text) its output
// must match: OpenAI's response_format (json_object, json_schema), vLLM's
// structured_outputs (json, regex, choice, grammar, json_object) and its older guided_json,
// guided_regex, guided_choice and guided_grammar, and llama.cpp's json_schema and grammar.
// At most one may be given. The grammar is compiled here, so that one that cannot be is
// a 400 naming the field and where in it, before the request reaches a worker; then the
// server makes its first token mask (first_mask_refusal) on a thread of its own.
#pragma once

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>
#include <string>

#include "net/api_error.hpp"

namespace troupe::grammar {
class TokenMasker;
}

namespace troupe::net {

// The GBNF the body's constraint compiles to; empty when it asks for none. `param`, if
// given, is set to the field it came from.
tl::expected<std::string, ApiError> output_grammar(const boost::json::object& body,
                                                   std::string* param = nullptr);

// The GBNF of one JSON schema, compiled to check it (tool calls' too); errors name `param`.
tl::expected<std::string, ApiError> schema_grammar(const boost::json::value& schema,
                                                   const std::string& param);

// Why `gbnf` (which output_grammar or schema_grammar made) cannot be followed from its
// start: its first token mask over `masker`'s vocabulary needs more than the work budget
// every mask has (grammar::kMaskWorkBudget), so a worker would fail it at once. Empty when
// it can. Costs up to that budget (about a second of a core); the verdict is kept by the
// text, so a constraint sent again costs a lookup.
std::string first_mask_refusal(const std::string& gbnf, const grammar::TokenMasker& masker);

}  // namespace troupe::net
