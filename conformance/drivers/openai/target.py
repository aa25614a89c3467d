"""An OpenAI-compatible server under test: its endpoint, the model the cases use, who it says it
is, and what it was found to support. ``TargetInfo`` carries the same facts in lmrpc.v1's shape
(``Capabilities`` from the learned support), so the report and ``requires`` read them as for any
protocol."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from conformance.drivers.base import ConnectOptions, Promises
from conformance.drivers.openai.client import OpenAIClient, OpenAIEndpoint
from conformance.drivers.openai.discover import (
    DiscoveryError,
    Identity,
    TokenizerEndpoint,
    identity,
    list_models,
    parallel_of,
    tokenize,
    tokenizer_endpoint,
)
from conformance.drivers.openai.exchange import Exchange, OpenAIRequest
from conformance.drivers.openai.runtime_transport import client_for
from conformance.drivers.openai.support import Support, learn
from conformance.vocabulary import TargetInfo
from lmrpc.v1 import Capabilities, ModelInfo, ServerInfo

PROBE_TEXT = "Hello"


@dataclass(slots=True)
class HttpTarget:
    """An OpenAI-compatible server, connected (``Target``)."""

    protocol: ClassVar[str] = "openai"
    endpoint: OpenAIEndpoint
    info: TargetInfo
    client: OpenAIClient
    models: list[str]
    identity: Identity
    tokenizer: TokenizerEndpoint | None
    support: Support
    parallel: int
    parallel_source: str  # who said how many requests it runs at once (parallel_of)

    @property
    def model(self) -> str:
        return self.client.model

    @property
    def learns_refusals(self) -> bool:
        return False  # what it refuses is learned with the rest of its support (support.py)

    async def alive(self, budget_s: float) -> tuple[bool, str]:
        """Its model list answers."""
        try:
            models, _ = await list_models(self.client, budget_s)
        except Exception as exc:
            return False, f"GET /models: {type(exc).__name__}: {exc}"
        return True, f"serving (GET /models lists {models})"

    def paced(self, parallel: int | None) -> None:
        if parallel is not None and self.parallel_source == "assumed":
            self.parallel, self.parallel_source = parallel, "measured"

    def report_fields(self) -> tuple[dict[str, object], dict[str, object]]:
        identity: dict[str, object] = {"identity": {"source": self.identity.source, **self.identity.answers}}
        settings: dict[str, object] = {
            "support": self.support.to_json(),
            "tokenizer": str(self.tokenizer) if self.tokenizer else None,
            "parallel": self.parallel,
            "parallel_source": self.parallel_source,
        }
        return identity, settings

    @staticmethod
    async def connect(endpoint: OpenAIEndpoint, options: ConnectOptions) -> HttpTarget:
        client = client_for(endpoint, connect_s=options.connect_s)
        try:
            return await asyncio.wait_for(_discover(client, endpoint, options), 8 * options.call_s)
        except BaseException:
            await client.aclose()
            raise

    async def aclose(self) -> None:
        await self.client.aclose()


async def _discover(client: OpenAIClient, endpoint: OpenAIEndpoint, options: ConnectOptions) -> HttpTarget:
    models, listing = await list_models(client, options.connect_s)
    if options.model is not None and options.model not in models:
        raise DiscoveryError(f"--model {options.model!r} is not among the models the server lists: {models}")
    if not models and options.model is None:
        raise DiscoveryError("the server lists no model (GET /models): name one with --model")
    client.model = options.model or models[0]
    who = await identity(client, options.connect_s, listing)
    tokenizer = await tokenizer_endpoint(client, client.model, options.connect_s)
    ids = (
        await tokenize(client, tokenizer, client.model, PROBE_TEXT, False, options.connect_s)
        if tokenizer is not None
        else None
    )

    async def send(request: OpenAIRequest) -> Exchange:
        return await client.send(request, total_s=options.call_s, idle_s=options.idle_s)

    support = await learn(send, token_prompt=ids)
    if options.promises.deterministic_greedy and not support.deterministic:
        support = dataclasses.replace(
            support, deterministic=True, determinism=f"--assume deterministic_greedy ({support.determinism})"
        )
    info = TargetInfo(
        ServerInfo(
            server_name=who.name or "unknown",
            server_version=who.version,
            capabilities=_capabilities(support, tokenizer is not None, options.promises),
        ),
        ModelInfo(model_id=client.model),
        None,
    )
    parallel, source = parallel_of(who, options.parallel)
    return HttpTarget(endpoint, info, client, models, who, tokenizer, support, parallel, source)


def _capabilities(support: Support, tokenize: bool, promises: Promises) -> Capabilities:
    apis = support.apis()
    n = any(support.has(api, "n") for api in apis)
    logprobs = any(support.has(api, "logprobs") for api in apis)
    return Capabilities(
        chat_input=support.has("chat"),
        max_outputs=4 if n else 1,
        logprobs=logprobs,
        max_top_logprobs=5 if logprobs else 0,
        stop_strings=any(support.has(api, "stop") for api in apis),
        max_stop_strings=4,
        seeded_sampling=any(support.has(api, "seed") for api in apis),
        deterministic_greedy=support.deterministic,
        prefix_cache=promises.prefix_cache,
        tokenize=tokenize,
    )
