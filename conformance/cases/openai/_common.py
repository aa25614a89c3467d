"""What the OpenAI profile's cases share: registration for the ``openai`` protocol only, request
builders, and the checks every case makes of an answer (accepted; refused as OpenAI refuses)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from conformance.drivers.openai.exchange import Api, Exchange, OpenAIRequest
from conformance.drivers.openai.support import Support
from conformance.harness.context import Ctx
from conformance.search.openai import body_for
from conformance.spec.clauses import Level
from conformance.spec.protocols import HTTP_PROTOCOLS
from conformance.spec.registry import Body, Variant, case
from conformance.validators.openai import Answer
from conformance.vocabulary import CaseFailed, Mismatch

LONG_PROMPT = "Count from one to one hundred in words, separated by commas:"
CHAT_PROMPT = "Write a short story about a lighthouse keeper."


def openai_case(
    clause_id: str,
    *,
    tag: str | None = None,
    variants: Sequence[Variant] | None = None,
    exclusive: bool = False,
    budget: float = 1.0,
    level: Level | None = None,
) -> Callable[[Body], Body]:
    """``@case`` for the ``openai`` protocol: its ID carries ``openai`` first (``USAGE-3[openai]``,
    ``SAMPLE-5[openai,temperature=-1]``), so the OpenAI reading of a clause is never mistaken for
    the gRPC protocols' cases of it."""
    if variants is not None:
        variants = [
            Variant(v.params, f"openai,{v.tag or ','.join(f'{k}={x}' for k, x in v.params.items())}")
            for v in variants
        ]
        tag = None
    else:
        tag = f"openai,{tag}" if tag else "openai"
    return case(
        clause_id,
        tag=tag,
        variants=variants,
        exclusive=exclusive,
        budget=budget,
        level=level,
        protocols=HTTP_PROTOCOLS,
    )


def support(ctx: Ctx) -> Support:
    return ctx.http.support


def make(api: Api, prompt: str | None = None, /, **fields: Any) -> OpenAIRequest:
    """A request of ``api`` with the prompt as its only message (or its prompt)."""
    text = prompt if prompt is not None else (CHAT_PROMPT if api == "chat" else LONG_PROMPT)
    return OpenAIRequest(api, body_for(api, text, **fields))


def apis(ctx: Ctx, *features: str) -> list[Api]:
    """The endpoints the server serves that take every one of ``features``; skips when none does."""
    served = support(ctx).apis()
    found = [api for api in served if all(support(ctx).has(api, f) for f in features)]
    if not found:
        support(ctx).need(served[0] if served else "chat", *features)
    return found


async def answered(ctx: Ctx, request: OpenAIRequest, what: str = "", **kw: Any) -> Answer:
    """Send ``request``; fail the case unless it was answered 200 and read to its end."""
    answer = Answer.of(await ctx.http.send(request, **kw))
    if not answer.ok:
        label = what or f"{request.api}{' stream' if request.stream else ''}"
        detail = answer.exchange.summary()
        if answer.exchange.text:
            detail += f": {answer.exchange.text[:300]}"
        raise CaseFailed([*ctx.check.mismatches, Mismatch(label, "HTTP 200, read to its end", detail)])
    return answer


async def answered_unless_refused(
    ctx: Ctx, request: OpenAIRequest, what: str = "", *, unimplemented: bool = False
) -> Answer | None:
    """Like ``answered``, but None when the server refuses the request as OpenAI refuses (a 4xx
    with an error object): a combination of options it does not serve, which skips, not fails.
    With ``unimplemented``, a 501 with an error object declines it too (an option the server has no
    part for, such as a tool parser)."""
    exchange = await ctx.http.send(request)
    if refused(exchange) is None or (unimplemented and not_implemented(exchange)):
        ctx.note(f"refused, so not judged: {request!r}: {exchange.text[:200]}")
        return None
    answer = Answer.of(exchange)
    if not answer.ok:
        label = what or f"{request.api}{' stream' if request.stream else ''}"
        detail = exchange.summary() + (f": {exchange.text[:300]}" if exchange.text else "")
        raise CaseFailed([*ctx.check.mismatches, Mismatch(label, "HTTP 200, read to its end", detail)])
    return answer


def not_implemented(exchange: Exchange) -> bool:
    """A 501 (not implemented) with an error object: the server has no part for what was asked."""
    return exchange.status == 501 and not exchange.is_event_stream and exchange.error_object() is not None


def refused(exchange: Exchange) -> str | None:
    """None when ``exchange`` is refused as OpenAI refuses a bad request (a 4xx whose body is an
    error object, not an event stream); else what it was instead."""
    if not 400 <= exchange.status < 500:
        return exchange.summary() + (f": {exchange.text[:200]}" if exchange.text else "")
    if exchange.is_event_stream:
        return f"HTTP {exchange.status} with an event stream"
    if exchange.error_object() is None:
        return f"HTTP {exchange.status} without an error object: {exchange.text[:200]!r}"
    return None


def expect_refused(ctx: Ctx, exchange: Exchange, what: str, statuses: Iterable[int] = ()) -> bool:
    """A 4xx with an OpenAI error object (one of ``statuses`` when given)."""
    wanted = tuple(statuses)
    problem = refused(exchange)
    if problem is None and wanted and exchange.status not in wanted:
        problem = f"HTTP {exchange.status}"
    want = f"HTTP {' or '.join(map(str, wanted)) if wanted else '4xx'} with an error object"
    return ctx.check.that(problem is None, what, want, problem)


def names_field(exchange: Exchange, field: str) -> bool:
    error = exchange.error_object() or {}
    param = error.get("param")
    return (
        param == field
        or (isinstance(param, str) and param.endswith(field))
        or field in str(error.get("message"))
    )


def common_prefix(a: str, b: str) -> int:
    """How many leading characters two texts share (texts, not paths: os.path.commonpath compares
    path components, and ruff's RUF071 suggests it for os.path.commonprefix)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
