"""The JSON Schema keywords a grammar cannot enforce (CONSTRAIN-4), found before compiling.

xgrammar compiles these without complaint and then ignores them: the output would follow a
looser schema than the one asked for. Measured on xgrammar 0.2.8 by compiling a schema per
keyword and asking whether a string that breaks the keyword is accepted. Everything else it
enforces or is an annotation (``title``, ``description``, an unknown ``format``, ``contentEncoding``):
``type``, ``enum``, ``const``, ``properties``, ``required``, ``additionalProperties``,
``patternProperties``, ``propertyNames``, ``unevaluatedProperties``, ``min/maxProperties``,
``items``, ``prefixItems``, ``unevaluatedItems``, ``min/maxItems``, ``anyOf``, ``oneOf``, a local
``$ref``, the numeric bounds, ``multipleOf``, ``min/maxLength``, ``pattern`` and the common formats.
"""

from __future__ import annotations

from typing import Any

UNENFORCED = frozenset(
    {
        "not",
        "if",
        "then",
        "else",
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "$dynamicRef",
        "$recursiveRef",
    }
)
# where a keyword's value holds subschemas: by name, in a list, or one
SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions"})
SCHEMA_LISTS = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})
SCHEMA_ONE = frozenset(
    {
        "items",
        "additionalItems",
        "additionalProperties",
        "propertyNames",
        "unevaluatedProperties",
        "unevaluatedItems",
    }
)


def unenforced_keyword(schema: Any, path: str = "") -> str | None:
    """``"'not' at /properties/x"`` for the first keyword ``schema`` uses that cannot be enforced,
    or None. Property names and data (``enum``, ``const``, ``default``) are never read as keywords."""
    if not isinstance(schema, dict):
        return None
    for key, value in schema.items():
        here = f"{path}/{key}"
        if key in UNENFORCED:
            return f"{key!r} at {path or '/'}"
        if key == "$ref" and isinstance(value, str) and not value.startswith("#"):
            return f"'$ref' to another document ({value!r}) at {path or '/'}"
        if key == "allOf" and isinstance(value, list) and len(value) > 1:
            return f"'allOf' of {len(value)} schemas at {path or '/'}"
        found = _in_subschemas(key, value, here)
        if found is not None:
            return found
    return None


def _in_subschemas(key: str, value: Any, path: str) -> str | None:
    if key in SCHEMA_MAPS and isinstance(value, dict):
        children = [(f"{path}/{name}", child) for name, child in value.items()]
    elif key in SCHEMA_LISTS and isinstance(value, list):
        children = [(f"{path}/{i}", child) for i, child in enumerate(value)]
    elif key in SCHEMA_ONE:
        children = [(path, value)]
    else:
        return None
    for where, child in children:
        found = unenforced_keyword(child, where)
        if found is not None:
            return found
    return None
