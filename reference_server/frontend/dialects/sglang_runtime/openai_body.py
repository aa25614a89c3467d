"""Reading an OpenAI JSON request body, and the OpenAI error body.

A body that is not what the OpenAI API accepts (not JSON, a wrong type, a value out of range, a
parameter OpenAI does not know) is the client's error: ``OpenAIError`` with HTTP status 400 and
the parameter's name, the way the OpenAI API and SGLang's HTTP server answer. A parameter that
OpenAI knows and this server cannot honour is UNIMPLEMENTED (``unimplemented``), never ignored.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

from grpclib import GRPCError, Status

BAD_REQUEST = 400
NOT_FOUND = 404


class OpenAIError(Exception):
    """A request the OpenAI API would refuse with ``status_code``."""

    def __init__(self, message: str, param: str | None = None, status_code: int = BAD_REQUEST) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status_code = status_code

    def body(self) -> bytes:
        error = {
            "message": self.message,
            "type": "invalid_request_error",
            "param": self.param,
            "code": self.status_code,
        }
        return json.dumps({"error": error}).encode()

    def as_grpc(self) -> GRPCError:
        """For the streaming RPCs, whose chunks have no status code: NOT_FOUND for a 404 (a model
        not served), else INVALID_ARGUMENT."""
        status = Status.NOT_FOUND if self.status_code == NOT_FOUND else Status.INVALID_ARGUMENT
        return GRPCError(status, self.message)


def parse_object(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OpenAIError(f"json_body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise OpenAIError(f"json_body must be a JSON object, not {type(value).__name__}")
    return value


class Body:
    """Typed reads of one request body's parameters; each refusal names the parameter."""

    def __init__(self, values: dict[str, Any], known: Iterable[str]) -> None:
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise OpenAIError(f"Unrecognized request argument supplied: {unknown[0]}", unknown[0])
        self.values = values

    def present(self, name: str) -> bool:
        return self.values.get(name) is not None

    def boolean(self, name: str, default: bool) -> bool:
        value = self.values.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise OpenAIError(f"{name} must be a boolean", name)
        return value

    def integer(self, name: str, *, low: int, high: int | None = None) -> int | None:
        value = self.values.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise OpenAIError(f"{name} must be an integer", name)
        if value < low or (high is not None and value > high):
            bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
            raise OpenAIError(f"{name}={value} must be {bound}", name)
        return value

    def number(self, name: str) -> float | None:
        """A finite number; its range is lmrpc.v1's to check."""
        value = self.values.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise OpenAIError(f"{name} must be a finite number", name)
        return float(value)

    def string(self, name: str) -> str | None:
        value = self.values.get(name)
        if value is None:
            return None
        if not isinstance(value, str):
            raise OpenAIError(f"{name} must be a string", name)
        return value

    def strings(self, name: str) -> list[str]:
        """A string or a list of strings (``stop``)."""
        value = self.values.get(name)
        if value is None:
            return []
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        raise OpenAIError(f"{name} must be a string or a list of strings", name)

    def token_ids(self, name: str) -> list[int]:
        value = self.values.get(name)
        if value is None:
            return []
        if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            for i, token_id in enumerate(value):
                if token_id < 0:
                    raise OpenAIError(f"{name}[{i}]={token_id} must be >= 0", name)
            return list(value)
        raise OpenAIError(f"{name} must be a list of token ids", name)

    def mapping(self, name: str) -> dict[str, Any]:
        value = self.values.get(name)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise OpenAIError(f"{name} must be an object", name)
        return value


DEFAULT_MODEL = "default"  # SGLang's DEFAULT_MODEL_NAME: a body without ``model`` names this


def requested_model(body: Body, served: str) -> str:
    """``model`` as SGLang 0.5.23 reads it (``serving_base.py``, ``_parse_model_parameter``): any
    name is served by the one model, and the answer repeats the name asked for (``"default"``
    when there is none). Only ``base:adapter`` means something more, a LoRA adapter (the served
    name itself may contain ``:``): this server has none, so that is UNIMPLEMENTED naming it."""
    name = body.string("model")
    if name is None:
        return DEFAULT_MODEL
    if ":" in name and name != served:
        prefix = f"{served}:"
        adapter = name[len(prefix) :] if name.startswith(prefix) else name.split(":", 1)[1]
        if adapter.strip():
            raise unimplemented(
                f"model={name!r}", f"no LoRA adapters (SGLang reads {adapter.strip()!r} as one)"
            )
    return name


def unimplemented(param: str, why: str) -> GRPCError:
    return GRPCError(Status.UNIMPLEMENTED, f"{param} is not supported by this server: {why}")
