"""A JSON Schema's objects closed to the properties they name, as the server's grammars read it.

A schema that names an object's properties but says nothing of others allows any others (JSON
Schema's ``additionalProperties`` defaults to ``true``), and llguidance, which follows the
standard, lets a model write them: the 135M default model asked for a forced tool call through
smg (an array of ``{"name": ..., "parameters": ...}`` with no ``additionalProperties``; four
seeds, n = 2, tests/fleet's request) wrote keys of its own (``"query"``, ``"metadata"``,
``"action"``, ``"outcome"``) after its arguments in 4 of 8 outputs, and 6 of 8 ran to
``max_tokens``; closed, 8 of 8 made their call. xgrammar, before llguidance, closed such objects
itself (its strict mode; OpenAI's strict structured outputs require it of a schema, and vLLM's
guidance backend offers it as ``disable_additional_properties``), and so does this: where the
schema does not say otherwise, an object that names properties (``properties``,
``patternProperties``) takes only those, and an array with ``prefixItems`` only those items.
Every document the closed schema allows, the schema allows (CONSTRAIN-1 judges the output).

That holds only where one schema object alone describes an instance. One whose instance another
schema also describes (a branch of an ``allOf`` of two or more, a branch of an ``anyOf`` or
``oneOf`` beside named properties, the target of a ``$ref`` that has such company, or a schema
with any of those beside its own properties) is left open, since closing each part would refuse
what their union allows.
"""

from __future__ import annotations

import copy
from typing import Any
from urllib.parse import unquote

# where a keyword's value is a schema for another instance (a value inside this one)
INNER_MAPS = ("properties", "patternProperties", "$defs", "definitions")
INNER_ONE = ("additionalProperties", "items", "additionalItems")
INNER_LISTS = ("prefixItems", "items")
# where a keyword's value is a schema for this same instance
SAME_LISTS = ("allOf", "anyOf", "oneOf")
OPENING = ("additionalProperties", "unevaluatedProperties")


def closed(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``schema`` with its objects and prefixItems arrays closed where it is safe (the
    schema itself where a ``$ref`` with company is not a JSON Pointer: which part it means is
    not worked out here, so nothing is closed)."""
    shared_refs: set[str] = set()
    while True:  # the targets of $refs with company, and what those refer to in turn
        found = set(shared_refs)
        _walk(schema, "#", shared=False, shared_refs=found, close=False)
        if found == shared_refs:
            break
        shared_refs = found
    if any(ref != "#" and not ref.startswith("#/") for ref in shared_refs):
        return schema
    result = copy.deepcopy(schema)
    _walk(result, "#", shared=False, shared_refs=shared_refs, close=True)
    return result


def _walk(node: Any, pointer: str, *, shared: bool, shared_refs: set[str], close: bool) -> None:
    if not isinstance(node, dict):
        return
    shared = shared or pointer in shared_refs
    names = "properties" in node or "patternProperties" in node
    company = any(key in node for key in (*SAME_LISTS, "$ref"))
    if isinstance(node.get("$ref"), str) and (shared or names or len(node.keys() & set(SAME_LISTS)) > 0):
        shared_refs.add(unquote(node["$ref"]))
    if close and not shared and not company:
        if names and not any(key in node for key in OPENING):
            node["additionalProperties"] = False
        if (
            isinstance(node.get("prefixItems"), list)
            and "items" not in node
            and "unevaluatedItems" not in node
        ):
            node["items"] = False
    for key, value in list(node.items()):
        here = f"{pointer}/{_escape(key)}"
        if key in INNER_MAPS and isinstance(value, dict):
            for name, child in value.items():
                _walk(child, f"{here}/{_escape(name)}", shared=False, shared_refs=shared_refs, close=close)
        elif key in INNER_LISTS and isinstance(value, list):
            for i, child in enumerate(value):
                _walk(child, f"{here}/{i}", shared=False, shared_refs=shared_refs, close=close)
        elif key in INNER_ONE:
            _walk(value, here, shared=False, shared_refs=shared_refs, close=close)
        elif key in SAME_LISTS and isinstance(value, list):
            together = shared or names or (key == "allOf" and len(value) > 1)
            for i, child in enumerate(value):
                _walk(child, f"{here}/{i}", shared=together, shared_refs=shared_refs, close=close)


def _escape(key: str) -> str:
    """A JSON Pointer's reference token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")
