"""What an OpenAI-compatible server says about itself: the models it lists, who it is (the
implementation and version, from whichever endpoint of its own it serves), its tokenizer endpoint
and how many requests it runs at once.

Nothing here is part of OpenAI's API except ``/v1/models``; the rest is each implementation's own:
llama.cpp ``/props`` (``build_info``, ``total_slots``) and ``/tokenize`` (``content``), vLLM
``/version`` and ``/tokenize`` (``prompt``), SGLang ``/get_server_info``, TGI ``/info``, Ollama
``/api/version``, smg ``/v1/tokenize``, llama-cpp-python ``/extras/tokenize`` (``input``). What
none of them answers stays unknown, and the cases that need it say so when they skip.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from conformance.drivers.openai.client import OpenAIClient
from conformance.drivers.openai.exchange import Exchange

IDENTITY_PATHS = ("/props", "/version", "/get_server_info", "/info", "/api/version")
MAX_PARALLEL = 8  # the most concurrent requests a case sends at once
DEFAULT_PARALLEL = 4  # what a server that does not say is taken to run at once, until measured


class DiscoveryError(Exception):
    """The server does not answer ``/models`` as OpenAI's API does."""


@dataclass(frozen=True, slots=True)
class Identity:
    name: str  # the implementation, as far as its own endpoints tell ("" when none does)
    version: str
    source: str  # which endpoint said so
    answers: Mapping[str, Any] = field(default_factory=dict)  # path -> a short excerpt of its JSON


@dataclass(frozen=True, slots=True)
class TokenizerEndpoint:
    """A ``/tokenize`` the server serves, and the body shape it takes."""

    path: str
    root: bool  # at the server root (llama.cpp, vLLM, SGLang) or under the base URL (smg)
    shape: str  # "content" (llama.cpp), "prompt" (vLLM, SGLang, smg) or "input" (llama-cpp-python)

    def body(self, model: str, text: str, add_special: bool) -> dict[str, Any]:
        if self.shape == "content":
            return {"content": text, "add_special": add_special}
        if self.shape == "input":  # no special-token switch: it tokenizes text as given
            return {"model": model, "input": text}
        return {"model": model, "prompt": text, "add_special_tokens": add_special}

    def __str__(self) -> str:
        return f"{'' if self.root else '<base>'}{self.path} ({self.shape})"


async def list_models(client: OpenAIClient, total_s: float) -> tuple[list[str], Exchange]:
    exchange = await client.request("GET", "/models", total_s=total_s)
    body = exchange.json()
    if exchange.status != 200 or not isinstance(body, dict) or not isinstance(body.get("data"), list):
        raise DiscoveryError(f"GET {exchange.url}: want HTTP 200 with a model list, got {exchange.summary()}")
    ids = [m.get("id") for m in body["data"] if isinstance(m, dict)]
    return [i for i in ids if isinstance(i, str) and i], exchange


async def identity(client: OpenAIClient, total_s: float, models: Exchange) -> Identity:
    answers: dict[str, Any] = {}
    for path in IDENTITY_PATHS:
        exchange = await client.request("GET", path, root=True, total_s=total_s)
        body = exchange.json()
        if exchange.status == 200 and isinstance(body, dict):
            answers[path] = _excerpt(body)
    server = models.headers.get("server", "")
    props, version = answers.get("/props", {}), answers.get("/version", {})
    if "build_info" in props:
        return Identity("llama.cpp", str(props["build_info"]), "/props build_info", answers)
    if "/get_server_info" in answers:
        info = answers["/get_server_info"]
        name = str(info.get("server_type") or "SGLang")  # a server speaking SGLang's API may say who it is
        return Identity(name, str(info.get("version", "")), "/get_server_info", answers)
    if "/info" in answers and "model_id" in answers["/info"]:
        info = answers["/info"]
        return Identity("TGI", str(info.get("version", "")), "/info", answers)
    if "/api/version" in answers:
        return Identity("Ollama", str(answers["/api/version"].get("version", "")), "/api/version", answers)
    if "version" in version:
        name = str(version.get("name") or version.get("server") or server or "")
        return Identity(name, str(version["version"]), "/version", answers)
    return Identity(server, "", "the Server header" if server else "nothing", answers)


async def tokenizer_endpoint(client: OpenAIClient, model: str, total_s: float) -> TokenizerEndpoint | None:
    for candidate in (
        TokenizerEndpoint("/tokenize", True, "content"),
        TokenizerEndpoint("/tokenize", True, "prompt"),
        TokenizerEndpoint("/tokenize", False, "prompt"),
        TokenizerEndpoint("/extras/tokenize", True, "input"),
    ):
        if await count_tokens(client, candidate, model, "Hello world", False, total_s) is not None:
            return candidate
    return None


async def count_tokens(
    client: OpenAIClient,
    endpoint: TokenizerEndpoint,
    model: str,
    text: str,
    add_special: bool,
    total_s: float,
) -> int | None:
    """How many tokens the server's own tokenizer makes of ``text``; None when it does not answer."""
    tokens = await tokenize(client, endpoint, model, text, add_special, total_s)
    return None if tokens is None else len(tokens)


async def tokenize(
    client: OpenAIClient,
    endpoint: TokenizerEndpoint,
    model: str,
    text: str,
    add_special: bool,
    total_s: float,
) -> list[int] | None:
    exchange = await client.request(
        "POST",
        endpoint.path,
        root=endpoint.root,
        json_body=endpoint.body(model, text, add_special),
        total_s=total_s,
    )
    body = exchange.json()
    tokens = body.get("tokens") if isinstance(body, dict) else None
    if exchange.status != 200 or not isinstance(tokens, list):
        return None
    ids = [t if isinstance(t, int) else t.get("id") if isinstance(t, dict) else None for t in tokens]
    return [i for i in ids if isinstance(i, int)] if all(isinstance(i, int) for i in ids) else None


def parallel_of(ident: Identity, given: int | None) -> tuple[int, str]:
    """How many requests the server runs at once, and who said so: ``--parallel``, else llama.cpp's
    slot count, else DEFAULT_PARALLEL until the harness measures it (``harness/pace.py``)."""
    if given is not None:
        return min(given, MAX_PARALLEL), "--parallel"
    slots = ident.answers.get("/props", {}).get("total_slots")
    if isinstance(slots, int) and slots > 0:
        return min(slots, MAX_PARALLEL), "the server (/props total_slots)"
    return DEFAULT_PARALLEL, "assumed"


def _excerpt(body: Mapping[str, Any]) -> dict[str, Any]:
    """The short scalar fields of a JSON object (what identifies the server, not its settings)."""
    out: dict[str, Any] = {}
    for key, value in body.items():
        if isinstance(value, str | int | float | bool) and len(str(value)) <= 200:
            out[key] = value
    return out
