"""Bad requests: every one is a 4xx with an OpenAI error object, never a 2xx, a 5xx or an event
stream (SAMPLE-5, ERR-1, REQ-1, REQ-5, REQ-6, MALFORMED-1); the error names the field (ERR-3);
the server serves on afterwards (ERR-5)."""

from __future__ import annotations

from typing import Any

from conformance.cases.openai._common import answered, expect_refused, make, names_field, openai_case, support
from conformance.drivers.openai.exchange import Api, Exchange, OpenAIRequest
from conformance.drivers.openai.support import base_probe
from conformance.harness.context import Ctx
from conformance.spec.registry import Variant

# Values outside OpenAI's documented ranges (its API reference for chat and completions).
OUT_OF_RANGE: tuple[tuple[str, Any], ...] = (
    ("temperature", -1),
    ("top_p", 1.5),
    ("top_p", -0.5),
    ("n", 0),
    ("max_tokens", -1),
    ("presence_penalty", 3),
    ("frequency_penalty", -3),
    ("top_logprobs", 21),
    ("top_logprobs", -1),
)


def _invalid(api: Api, field: str, value: Any) -> dict[str, Any]:
    changes: dict[str, Any] = {field: value}
    if field == "top_logprobs":
        if api != "chat":
            return {}
        changes["logprobs"] = True
    return changes


async def send_unbounded(ctx: Ctx, request: OpenAIRequest) -> Exchange:
    """Send a request that, accepted, could run to the end of the context window: streamed, and left
    after its first event, so a server that takes it answers 200 at once and is not kept busy."""
    if support(ctx).has(request.api, "stream"):
        return await ctx.http.send(request.with_body(stream=True), disconnect_after=1)
    return await ctx.http.send(request)


@openai_case(
    "SAMPLE-5", variants=[Variant({"field": f, "value": v}, tag=f"{f}={v}") for f, v in OUT_OF_RANGE]
)
async def out_of_range(ctx: Ctx) -> None:
    """A value outside OpenAI's range is a 4xx with an error object, on every endpoint the server
    serves (top_logprobs: chat only)."""
    field, value = str(ctx.params["field"]), ctx.params["value"]
    for api in support(ctx).apis():
        changes = _invalid(api, field, value)
        if changes:
            request = base_probe(api).with_body(**changes)
            unbounded = field == "max_tokens"
            exchange = await (send_unbounded(ctx, request) if unbounded else ctx.http.send(request))
            expect_refused(ctx, exchange, f"{api} {field}={value}")


@openai_case("ERR-1", tag="stream")
async def refused_before_streaming(ctx: Ctx) -> None:
    """A bad request that asks to stream is refused like any other: a 4xx with an error object,
    not an event stream that carries the error."""
    for api in support(ctx).apis():
        exchange = await ctx.http.send(base_probe(api).with_body(stream=True, temperature=-1))
        expect_refused(ctx, exchange, f"{api} stream with temperature=-1")


@openai_case("ERR-3")
async def error_names_field(ctx: Ctx) -> None:
    """The error of a bad request names the offending field, in ``param`` or its message."""
    api = support(ctx).apis()[0]
    for field, value in (("temperature", -1), ("top_p", 1.5), ("n", 0)):
        exchange = await ctx.http.send(base_probe(api).with_body(**{field: value}))
        if expect_refused(ctx, exchange, f"{api} {field}={value}"):
            ctx.check.that(
                names_field(exchange, field),
                f"the error of {field}={value}",
                f"param or message naming {field!r}",
                exchange.error_object(),
            )


@openai_case("ERR-5")
async def serves_after_bad_requests(ctx: Ctx) -> None:
    """After bad requests of every kind, the next valid request is answered."""
    for api in support(ctx).apis():
        await ctx.http.request(
            "POST", base_probe(api).path, content=b'{"model": ', headers={"content-type": "application/json"}
        )
        await ctx.http.send(base_probe(api).with_body(temperature=-1, stream=True))
        await ctx.http.send(base_probe(api).with_body(n=0))
        await answered(ctx, base_probe(api), f"{api} after bad requests")


@openai_case(
    "REQ-1",
    variants=[Variant({"what": "empty"}, tag="empty-input"), Variant({"what": "none"}, tag="no-input")],
)
async def input_required(ctx: Ctx) -> None:
    """``messages: []``, or a body without ``messages`` / ``prompt``, is a 4xx with an error object."""
    for api in support(ctx).apis():
        key = "messages" if api == "chat" else "prompt"
        body = dict(base_probe(api).body)
        if ctx.params["what"] == "empty":
            if api != "chat":
                continue  # an empty completions prompt is a valid request in OpenAI's API
            body[key] = []
        else:
            del body[key]
        exchange = await ctx.http.request(
            "POST", base_probe(api).path, json_body={"model": ctx.http.model, **body}
        )
        expect_refused(ctx, exchange, f"{api} with {key}={body.get(key, '(absent)')}")


@openai_case("REQ-5")
async def token_id_beyond_vocabulary(ctx: Ctx) -> None:
    """A completions prompt of token ids with an id no vocabulary has is a 4xx."""
    support(ctx).need("completions", "token_prompt")
    exchange = await ctx.http.send(make("completions", max_tokens=4).with_body(prompt=[1, 2**31 - 1]))
    expect_refused(ctx, exchange, "completions prompt [1, 2147483647]")


@openai_case("REQ-6")
async def max_tokens_beyond_any_window(ctx: Ctx) -> None:
    """A max_tokens that no context window holds is a 4xx, as OpenAI answers it, not a request the
    server quietly shortens."""
    for api in support(ctx).apis():
        exchange = await send_unbounded(ctx, base_probe(api).with_body(max_tokens=10**9))
        expect_refused(ctx, exchange, f"{api} max_tokens=1000000000")


@openai_case(
    "MALFORMED-1",
    variants=[
        Variant({"what": "not-json"}, tag="not-json"),
        Variant({"what": "wrong-type"}, tag="wrong-type"),
    ],
)
async def malformed_body(ctx: Ctx) -> None:
    """A body that is not JSON, or a field of the wrong JSON type, is a 4xx with an error object."""
    for api in support(ctx).apis():
        probe = base_probe(api)
        if ctx.params["what"] == "not-json":
            exchange = await ctx.http.request(
                "POST",
                probe.path,
                content=b'{"model": "m", "max_tokens": 4,',
                headers={"content-type": "application/json"},
            )
            expect_refused(ctx, exchange, f"{api} with a truncated JSON body")
            continue
        for field, value in (
            ("temperature", "hot"),
            ("max_tokens", "four"),
            ("messages" if api == "chat" else "n", "x"),
        ):
            exchange = await ctx.http.send(probe.with_body(**{field: value}))
            expect_refused(ctx, exchange, f"{api} {field}={value!r}")
