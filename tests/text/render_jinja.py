#!/usr/bin/env python3
"""Renders chat templates with Python's jinja2 set up exactly as Hugging Face
transformers sets it up (chat_template_utils._compile_jinja_template), for
tests/text/chat_template_jinja_test.cpp to compare with the C++ interpreter.

    render_jinja.py CASES_JSON OUT_DIR

CASES_JSON is a list of {"template": path, "variables": {...}}. For case i it
writes OUT_DIR/i.txt (the rendered text) or OUT_DIR/i.raised (the message of
a raise_exception) or OUT_DIR/i.error (any other error). strftime_now's clock
is fixed at 2024-07-26 12:00:00. Exit code 77 when jinja2 is missing.
"""
import json
import os
import sys
from datetime import datetime

try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("python3-jinja2 is not installed", file=sys.stderr)
    sys.exit(77)


class Raised(Exception):
    pass


def raise_exception(message):
    raise Raised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(format):
    return datetime(2024, 7, 26, 12, 0, 0).strftime(format)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                       extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    cases_path, out_dir = sys.argv[1], sys.argv[2]
    with open(cases_path, encoding="utf-8") as f:
        cases = json.load(f)
    env = environment()
    for i, case in enumerate(cases):
        with open(case["template"], encoding="utf-8") as f:
            source = f.read()
        base = os.path.join(out_dir, str(i))
        try:
            text = env.from_string(source).render(**case["variables"])
        except Raised as e:
            with open(base + ".raised", "w", encoding="utf-8") as f:
                f.write(str(e))
            continue
        except Exception as e:  # any other failure of the template
            with open(base + ".error", "w", encoding="utf-8") as f:
                f.write(type(e).__name__ + ": " + str(e))
            continue
        with open(base + ".txt", "w", encoding="utf-8", newline="") as f:
            f.write(text)


if __name__ == "__main__":
    main()
