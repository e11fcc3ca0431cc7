// JSON schemas (and "any JSON object") as grammars, written as GBNF and parsed by
// parse_gbnf, as llama.cpp's json-schema-to-grammar does.
//
// Supported: type (one or a list), properties with required and additionalProperties
// (false, true or a schema; extra keys come after the declared ones), items, prefixItems,
// minItems/maxItems, enum, const, anyOf/oneOf (oneOf is not made exclusive), allOf of one
// schema, $ref to #/$defs/... or #/definitions/..., minLength/maxLength (not with a pattern
// or with one of the formats below), pattern (over the string's JSON text), format date
// (February to the 28th), time, date-time, uuid, email and ipv4 (other formats are
// annotations), integer minimum/maximum/exclusiveMinimum/exclusiveMaximum, and number
// minimum 0 / exclusiveMinimum 0. Annotations (title, description, default, examples,
// $schema, $id, ...) are ignored; beside $ref, const, enum and the combinators only they (and a
// type beside const or enum) may stand. Anything else that would change which documents are valid
// (not, if/then/else, patternProperties, uniqueItems, multipleOf, other number bounds, ...)
// is refused with an error naming the keyword and where it is.
//
// Required properties come first in the order declared, then the optional ones in theirs:
// a document's keys follow the schema's order. Whitespace between tokens is bounded (a
// space, or a newline and up to 20 spaces or tabs), so a model cannot pad forever.
#pragma once

#include <boost/json/value.hpp>
#include <string>

#include "grammar/grammar.hpp"
#include "troupe/result.hpp"

namespace troupe::grammar {

// The GBNF text for `schema`.
Result<std::string> json_schema_to_gbnf(const boost::json::value& schema);
// The grammar of `schema`.
Result<Grammar> parse_json_schema(const boost::json::value& schema);
// Any JSON object (OpenAI's response_format json_object).
Result<Grammar> json_object_grammar();

}  // namespace troupe::grammar
