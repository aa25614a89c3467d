"""A thin async client for lmrpc.v1 servers.

    async with LmrpcClient.connect("127.0.0.1:50051") as client:
        result = await client.generate(GenerateRequest(text="Hello", stopping=StoppingCriteria(max_tokens=16)))
        print(result.text, result.usage)

``stream()`` yields the raw GenerateResponse events; ``generate()`` aggregates them into one
``GenerateResult`` per request with one ``OutputResult`` per output index.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from types import TracebackType

import betterproto2
from grpclib.client import Channel
from grpclib.events import SendRequest, listen

from lmrpc.v1 import (
    AbortRequest,
    AbortResponse,
    AllRequests,
    ControlServiceStub,
    DetokenizeRequest,
    EmbedRequest,
    EmbedResponse,
    FinishReason,
    GenerateRequest,
    GenerateResponse,
    GetLoadRequest,
    GetModelInfoRequest,
    GetModelInfoResponse,
    GetServerInfoRequest,
    InferenceServiceStub,
    ListModelsRequest,
    Load,
    OutputFinished,
    PromptInfo,
    RankedDocument,
    RequestError,
    RequestIds,
    RerankRequest,
    ScoreRequest,
    ServedModel,
    ServerInfo,
    StartProfileRequest,
    StopMatch,
    StopProfileRequest,
    TokenDelta,
    TokenizeRequest,
    TokenLogprob,
    UpdateWeightsRequest,
    Usage,
)


class StreamProtocolError(Exception):
    """The server's stream broke the contract in a way the aggregator cannot paper over."""


@dataclass
class OutputResult:
    """Everything one output of a request produced."""

    index: int
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    stop: StopMatch | None = None
    completion_tokens: int | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class GenerateResult:
    """The aggregate of one Generate stream."""

    request_id: str = ""
    prompt: PromptInfo | None = None
    outputs: list[OutputResult] = field(default_factory=list)
    usage: Usage | None = None
    error: RequestError | None = None

    @property
    def text(self) -> str:
        """Text of output 0 (the only one unless n > 1)."""
        return self.outputs[0].text if self.outputs else ""

    @property
    def token_ids(self) -> list[int]:
        """Token ids of output 0."""
        return self.outputs[0].token_ids if self.outputs else []

    def output(self, index: int) -> OutputResult:
        for out in self.outputs:
            if out.index == index:
                return out
        out = OutputResult(index=index)
        self.outputs.append(out)
        self.outputs.sort(key=lambda o: o.index)
        return out


class StreamAggregator:
    """Folds GenerateResponse events into a GenerateResult, rejecting contract breaks it cannot fold."""

    def __init__(self) -> None:
        self.result = GenerateResult()

    def feed(self, response: GenerateResponse) -> None:
        result = self.result
        if not result.request_id:
            result.request_id = response.request_id
        elif response.request_id != result.request_id:
            raise StreamProtocolError(
                f"request_id changed mid-stream: {result.request_id!r} -> {response.request_id!r}"
            )
        kind, event = betterproto2.which_one_of(response, "event")
        if kind == "prompt_info":
            assert isinstance(event, PromptInfo)
            result.prompt = event
        elif kind == "delta":
            assert isinstance(event, TokenDelta)
            out = result.output(_index(event.output_index))
            if out.finished:
                raise StreamProtocolError(f"delta for output {out.index} after its finish")
            out.token_ids.extend(event.token_ids)
            out.text += event.text
            out.logprobs.extend(event.logprobs)
        elif kind == "finished":
            assert isinstance(event, OutputFinished)
            out = result.output(_index(event.output_index))
            if out.finished:
                raise StreamProtocolError(f"second finish for output {out.index}")
            out.finish_reason = event.reason
            out.stop = event.stop
            out.completion_tokens = event.completion_tokens
        elif kind == "error":
            assert isinstance(event, RequestError)
            result.error = event
        if response.usage is not None:
            result.usage = response.usage


def _index(output_index: int | None) -> int:
    if output_index is None:
        raise StreamProtocolError("output_index missing (it must be present, also for output 0)")
    return output_index


def tls_context(
    ca_file: str | None = None, *, cert_file: str | None = None, key_file: str | None = None
) -> ssl.SSLContext:
    """A client TLS context for gRPC: trusts ``ca_file`` (else the system store), offers ALPN h2,
    and presents ``cert_file``/``key_file`` when the server requires mutual TLS."""
    context = ssl.create_default_context(cafile=ca_file)
    if cert_file:
        context.load_cert_chain(cert_file, key_file)
    context.set_alpn_protocols(["h2"])
    return context


def bearer_token(channel: Channel, token: str) -> None:
    """Send ``authorization: Bearer TOKEN`` metadata on every call made through ``channel``."""
    if not token or any(c.isspace() for c in token):
        raise ValueError("a bearer token must be non-empty and contain no whitespace")

    async def add_token(event: SendRequest) -> None:
        event.metadata["authorization"] = f"Bearer {token}"

    listen(channel, SendRequest, add_token)


def parse_target(target: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too; an empty host is 127.0.0.1) as (host, port)."""
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"target={target!r} must be host:port with a port in [1, 65535]")
    return host.strip("[]") or "127.0.0.1", int(port)


class LmrpcClient:
    """Async client for one server. Use as an async context manager, or call ``close()``."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.inference = InferenceServiceStub(channel)
        self.control = ControlServiceStub(channel)

    @classmethod
    def connect(
        cls, target: str, *, tls: ssl.SSLContext | None = None, token: str | None = None
    ) -> LmrpcClient:
        """Open an HTTP/2 channel to ``host:port``: plaintext, or TLS with the given context.

        ``tls_context()`` builds a suitable context from a CA file and an optional client certificate.
        ``token`` is sent as ``authorization: Bearer TOKEN`` on every call, for servers that
        require authentication (``Capabilities.authentication``).
        """
        host, port = parse_target(target)
        channel = Channel(host, port, ssl=tls)
        if token is not None:
            bearer_token(channel, token)
        return cls(channel)

    async def __aenter__(self) -> LmrpcClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    async def stream(
        self, request: GenerateRequest, *, timeout: float | None = None
    ) -> AsyncGenerator[GenerateResponse, None]:
        """Yield the events of one Generate call. Leaving the loop early cancels the call."""
        async with contextlib.aclosing(
            _as_generator(self.inference.generate(request, timeout=timeout))
        ) as events:
            async for response in events:
                yield response

    async def generate(self, request: GenerateRequest, *, timeout: float | None = None) -> GenerateResult:
        """Run one Generate call to completion and aggregate its events."""
        aggregator = StreamAggregator()
        async with contextlib.aclosing(self.stream(request, timeout=timeout)) as events:
            async for response in events:
                aggregator.feed(response)
        return aggregator.result

    async def abort(self, *request_ids: str, everything: bool = False) -> AbortResponse:
        """Abort the given request ids, or every request in flight with ``everything=True``."""
        if everything == bool(request_ids):
            raise ValueError("pass request ids or everything=True, not both or neither")
        if everything:
            return await self.control.abort(AbortRequest(all=AllRequests()))
        return await self.control.abort(AbortRequest(request_ids=RequestIds(ids=list(request_ids))))

    async def server_info(self) -> ServerInfo:
        response = await self.control.get_server_info(GetServerInfoRequest())
        assert response.server is not None
        return response.server

    async def model_info(self) -> GetModelInfoResponse:
        return await self.control.get_model_info(GetModelInfoRequest())

    async def load(self) -> Load:
        response = await self.control.get_load(GetLoadRequest())
        assert response.current is not None
        return response.current

    async def tokenize(self, text: str) -> list[int]:
        return list((await self.control.tokenize(TokenizeRequest(text=text))).token_ids)

    async def detokenize(self, token_ids: list[int], *, skip_special_tokens: bool | None = None) -> str:
        request = DetokenizeRequest(token_ids=token_ids, skip_special_tokens=skip_special_tokens)
        return (await self.control.detokenize(request)).text

    async def embed(self, texts: list[str]) -> EmbedResponse:
        return await self.inference.embed(EmbedRequest(texts=texts))

    # Added in contract revision 3: check the capability first (CAP-4).

    async def models(self) -> list[ServedModel]:
        """The models a request can reach, the generation model first (``Capabilities.list_models``)."""
        return list((await self.control.list_models(ListModelsRequest())).models)

    async def score(self, query: str, items: list[str]) -> list[float]:
        """Each item's relevance to ``query``, in order (``Capabilities.score``)."""
        return list((await self.inference.score(ScoreRequest(query=query, items=items))).scores)

    async def rerank(
        self, query: str, documents: list[str], *, top_n: int | None = None
    ) -> list[RankedDocument]:
        """The documents, best first; ``index`` points into ``documents`` (``Capabilities.score``)."""
        request = RerankRequest(query=query, documents=documents, top_n=top_n)
        return list((await self.inference.rerank(request)).results)

    async def start_profile(self, output_dir: str = "") -> str:
        """Start recording the engine (admin, ``Capabilities.profiler``); returns the trace folder."""
        return (await self.control.start_profile(StartProfileRequest(output_dir=output_dir))).output_dir

    async def stop_profile(self) -> list[str]:
        """End the recording; returns the trace files written (paths on the server's host)."""
        return list((await self.control.stop_profile(StopProfileRequest())).trace_files)

    async def update_weights(self, model_path: str, *, weights_version: str | None = None) -> str:
        """Load new weights of the same model shape (admin, ``Capabilities.weight_updates``);
        returns the new ``ModelInfo.weights_version``."""
        request = UpdateWeightsRequest(model_path=model_path, weights_version=weights_version)
        return (await self.control.update_weights(request)).weights_version


async def _as_generator(events: AsyncIterator[GenerateResponse]) -> AsyncGenerator[GenerateResponse, None]:
    """Wrap the stub's stream so that closing the wrapper closes (resets) the call at once."""
    try:
        async for event in events:
            yield event
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
