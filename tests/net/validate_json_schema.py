#!/usr/bin/env python3
"""Validates a served model's outputs against their JSON schemas (for
tests/net/structured_outputs_test.cpp), with Python's jsonschema as the judge.

    validate_json_schema.py CASES_JSON

CASES_JSON is a list of {"schema": ..., "output": "..."}. Prints one line per case, in
order: "ok", or "invalid: why". Formats (date, time, date-time, uuid, email, ipv4) are
checked: a schema's "format" is an assertion here, not an annotation.
"""
import json
import re
import sys

import jsonschema

# The draft's own format checker: jsonschema.FormatChecker() mixes in every draft's checkers,
# and there "time" is draft 3's (no offset, no fraction), which RFC 3339 times fail.
FORMAT_CHECKER = getattr(jsonschema.Draft202012Validator, "FORMAT_CHECKER", None)
if FORMAT_CHECKER is None:  # jsonschema before 4.13 (Debian 12 has 4.10)
    FORMAT_CHECKER = jsonschema.draft202012_format_checker

# RFC 3339, for where the rfc3339-validator package that jsonschema checks times with is absent.
FULL_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]+)?([zZ]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
if "time" not in FORMAT_CHECKER.checkers:
    FORMAT_CHECKER.checks("time")(
        lambda s: not isinstance(s, str) or re.fullmatch(FULL_TIME, s) is not None)
if "date-time" not in FORMAT_CHECKER.checkers:
    FORMAT_CHECKER.checks("date-time")(
        lambda s: not isinstance(s, str)
        or re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[tT]" + FULL_TIME, s) is not None)


def verdict(schema, output):
    try:
        document = json.loads(output)
    except ValueError as e:
        return "invalid: not JSON: %s" % e
    validator = jsonschema.Draft202012Validator(schema, format_checker=FORMAT_CHECKER)
    errors = list(validator.iter_errors(document))
    if errors:
        return "invalid: %s at %s" % (errors[0].message, list(errors[0].absolute_path))
    return "ok"


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    for case in cases:
        print(verdict(case["schema"], case["output"]))


if __name__ == "__main__":
    main()
