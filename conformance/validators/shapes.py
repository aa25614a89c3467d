"""Whether a text has the shape a constraint asks for (CONSTRAIN-1, and the OpenAI profile's
structured output and tool arguments): the whole text when the output ended complete, a prefix of
one when it was cut short.

Each shape is judged by an independent recognizer, never by the grammar engine a server may share:
JSON by the standard library and ``jsonschema``, a regular expression by the ``regex`` module (whose
partial matching answers "can this still become a match"), a choice by string comparison. A case
that sends an EBNF grammar also names a regular expression for the same language, and is judged by it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jsonschema
import regex

__all__ = ["Shape", "json_prefix_problem", "shape_problem"]

JSON_WHITESPACE = " \t\n\r"
REPLACEMENT = "\ufffd"  # what a decoder makes of a character's first bytes alone


@dataclass(frozen=True, slots=True)
class Shape:
    """What a text must be. ``kind`` is one of json_schema, json_object, regex, ebnf, choice;
    ``schema`` is the parsed schema (json_schema), ``pattern`` the regex (regex, and ebnf's
    equivalent), ``choices`` the strings (choice)."""

    kind: str
    schema: Any = None
    pattern: str = ""
    choices: tuple[str, ...] = ()

    @staticmethod
    def json_schema(schema: dict[str, Any]) -> Shape:
        return Shape("json_schema", schema=schema)

    @staticmethod
    def json_object() -> Shape:
        return Shape("json_object", schema={"type": "object"})

    @staticmethod
    def regex(pattern: str) -> Shape:
        return Shape("regex", pattern=pattern)

    @staticmethod
    def ebnf(equivalent_regex: str) -> Shape:
        return Shape("ebnf", pattern=equivalent_regex)

    @staticmethod
    def choice(*choices: str) -> Shape:
        return Shape("choice", choices=tuple(choices))


def shape_problem(shape: Shape, text: str, *, complete: bool) -> str | None:
    """What is wrong with ``text`` for ``shape``, or None. ``complete``: the output ended because the
    text was done (its EOS), so the whole text must have the shape; otherwise a prefix of one will do,
    up to a trailing U+FFFD: the first bytes of a character the cut split decode as one."""
    if not complete:
        text = text.rstrip(REPLACEMENT)
    if shape.kind in ("json_schema", "json_object"):
        return _json_problem(shape.schema, text, complete)
    if shape.kind in ("regex", "ebnf"):
        if regex.fullmatch(shape.pattern, text, partial=not complete) is None:
            what = "matches" if complete else "is a prefix of a text that matches"
            return f"not a text that {what} /{shape.pattern}/"
        return None
    if shape.kind == "choice":
        ok = text in shape.choices if complete else any(c.startswith(text) for c in shape.choices)
        return None if ok else f"not {'one' if complete else 'a prefix of one'} of {list(shape.choices)}"
    raise ValueError(f"unknown shape kind {shape.kind!r}")


def _json_problem(schema: Any, text: str, complete: bool) -> str | None:
    if not complete:
        return json_prefix_problem(text, top_level_object=schema.get("type") == "object")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"not JSON: {exc}"
    try:
        jsonschema.validate(document, schema)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "the document"
        return f"not valid against the schema at {where}: {exc.message}"
    return None


def json_prefix_problem(text: str, *, top_level_object: bool = False) -> str | None:
    """None when ``text`` can still be completed into one JSON document (syntax only), else why not.
    ``top_level_object``: the document must be an object."""
    stack: list[str] = []  # "{" or "[" for each open container
    expect = "value"  # value | key | colon | comma_or_end | value_or_end | key_or_end | done
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in JSON_WHITESPACE:
            i += 1
            continue
        at = f"at character {i} ({text[max(0, i - 12) : i + 1]!r})"
        if expect == "done":
            return f"text after the end of the document {at}"
        if expect in ("value", "value_or_end"):
            if expect == "value_or_end" and ch == "]":
                stack.pop()
                expect = _after_value(stack)
                i += 1
                continue
            if top_level_object and not stack and ch != "{":
                return f"the document is not an object {at}"
            if ch in "{[":
                stack.append(ch)
                expect = "key_or_end" if ch == "{" else "value_or_end"
                i += 1
                continue
            end, problem = _scalar(text, i)
            if problem:
                return f"{problem} {at}"
            if end == n:
                return None  # a scalar still being written
            i = end
            expect = _after_value(stack)
            continue
        if expect in ("key", "key_or_end"):
            if expect == "key_or_end" and ch == "}":
                stack.pop()
                expect = _after_value(stack)
                i += 1
                continue
            if ch != '"':
                return f"expected a key {at}"
            end, problem = _scalar(text, i)
            if problem:
                return f"{problem} {at}"
            if end == n:
                return None
            i, expect = end, "colon"
            continue
        if expect == "colon":
            if ch != ":":
                return f"expected ':' {at}"
            i, expect = i + 1, "value"
            continue
        # comma_or_end
        closer = "}" if stack[-1] == "{" else "]"
        if ch == ",":
            i, expect = i + 1, ("key" if stack[-1] == "{" else "value")
        elif ch == closer:
            stack.pop()
            i, expect = i + 1, _after_value(stack)
        else:
            return f"expected ',' or {closer!r} {at}"
    return None


def _after_value(stack: list[str]) -> str:
    return "comma_or_end" if stack else "done"


_LITERALS = ("true", "false", "null")
_NUMBER = regex.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


def _scalar(text: str, start: int) -> tuple[int, str | None]:
    """The end of the string, number or literal at ``start`` (len(text) when it runs to the end and
    can still be completed), or a problem."""
    ch = text[start]
    if ch == '"':
        i = start + 1
        while i < len(text):
            c = text[i]
            if c == "\\":
                if i + 1 < len(text) and text[i + 1] not in '"\\/bfnrtu':
                    return i, "a bad escape"
                i += 2
                continue
            if c == '"':
                return i + 1, None
            if ord(c) < 0x20:
                return i, "a control character inside a string"
            i += 1
        return len(text), None
    if ch == "-" or ch.isdigit():
        match = _NUMBER.match(text, start, partial=True)
        if match is None:
            return start, "a bad number"
        end = match.end()
        return (len(text), None) if match.partial else (end, None)
    for literal in _LITERALS:
        rest = text[start : start + len(literal)]
        if literal.startswith(rest):
            return (start + len(literal), None) if len(rest) == len(literal) else (len(text), None)
    return start, "not the start of a JSON value"
