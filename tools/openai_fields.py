"""Write conformance/spec/openai_fields.json: every field of the OpenAI API that the openai protocol
speaks (the requests of chat completions and completions, each response object by its ``object``
name, the models list and the error object), read from the official ``openai`` client's types, which
OpenAI generates from its OpenAPI specification. ``conformance coverage`` reads the file, so the
harness carries the schema without depending on the client.

    python -m tools.openai_fields          # rewrite the file
    python -m tools.openai_fields --check  # exit 1 when the file differs (tests/unit/test_fields.py)
"""

from __future__ import annotations

import argparse
import json
import sys
import types
import typing
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import openai
import typing_extensions
from openai.types import Completion, Model
from openai.types import completion_create_params as completions
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat import completion_create_params as chat
from openai.types.shared import ErrorObject
from pydantic import BaseModel

OUT = Path(__file__).resolve().parents[1] / "conformance" / "spec" / "openai_fields.json"
MAX_DEPTH = 7  # the deepest path the API has: messages.content.input_audio.data is 4


def _arguments(annotation: Any) -> Iterator[Any]:
    """The types a field may hold: unions, optionals, lists and annotations unwrapped."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for argument in typing.get_args(annotation):
            yield from _arguments(argument)
    elif origin in (typing.Annotated, typing.Required, typing.NotRequired, typing_extensions.Required):
        yield from _arguments(typing.get_args(annotation)[0])
    elif origin in (list, tuple, typing.Sequence, Iterable, typing.Iterable, set) or (
        origin is not None and getattr(origin, "__name__", "") in ("Iterable", "Sequence", "List")
    ):
        for argument in typing.get_args(annotation):
            yield from _arguments(argument)
    else:
        yield annotation


def _members(kind: Any) -> dict[str, Any]:
    """A TypedDict's or a pydantic model's fields and their types; {} for a leaf."""
    if typing_extensions.is_typeddict(kind):
        return dict(typing_extensions.get_type_hints(kind))
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return {name: info.annotation for name, info in kind.model_fields.items()}
    return {}


def paths(kind: Any, prefix: str = "", seen: tuple[Any, ...] = ()) -> set[str]:
    found: set[str] = set()
    if len(seen) >= MAX_DEPTH:
        return found
    fields = _members(kind)
    for name, annotation in fields.items():
        path = f"{prefix}{name}"
        found.add(path)
        for member in _arguments(annotation):
            if member in seen or not _members(member):
                continue
            found |= paths(member, f"{path}.", (*seen, kind))
    return found


def universe() -> dict[str, list[str]]:
    groups = {
        "chat/completions request": paths(chat.CompletionCreateParamsStreaming),
        "completions request": paths(completions.CompletionCreateParamsStreaming),
        "chat.completion": paths(ChatCompletion),
        "chat.completion.chunk": paths(ChatCompletionChunk),
        "text_completion": paths(Completion),
        "list": {"object", "data"} | {f"data.{p}" for p in paths(Model)},
        "error": {"error"} | {f"error.{p}" for p in paths(ErrorObject)},
    }
    return {group: sorted(found) for group, found in groups.items()}


def render() -> str:
    document = {"source": f"openai {openai.__version__} (the official Python client's types)", **universe()}
    return json.dumps(document, indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT} is stale: run python -m tools.openai_fields", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
