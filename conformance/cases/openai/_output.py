"""What the structured-output and tool-call cases share: sending a case's requests one at a time,
learning from the first answer whether the server takes an option at all (refused with a 4xx, or a
501 saying it is not implemented: the case skips, quoting the refusal), and the usage every such
answer still owes.

OpenAI serves every option itself, so it documents no answer for a server that does not: a 4xx
with an error object (how OpenAI refuses a request) and a 501 with one (HTTP's "not implemented";
smg answers so for a worker without constrained decoding) both say plainly that the option is not
served, and skip. A 200 that ignores the option, a 5xx other than 501, a broken answer: judged."""

from __future__ import annotations

from collections.abc import Sequence

from conformance.cases.openai._common import not_implemented, refused
from conformance.drivers.openai.exchange import Exchange, OpenAIRequest
from conformance.harness.context import Ctx
from conformance.validators.openai import Answer, usage_numbers
from conformance.validators.tool_calls import calls_of
from conformance.vocabulary import CaseSkipped


def declined(exchange: Exchange) -> bool:
    """The server says it does not serve what was asked: a 4xx refusal as OpenAI refuses, or a 501
    (not implemented) with an error object."""
    return refused(exchange) is None or not_implemented(exchange)


async def send_all(ctx: Ctx, requests: Sequence[OpenAIRequest]) -> list[Exchange]:
    """Each request's exchange, in order, one after the other: these requests are several times
    longer than the ones the pace was measured on, so a case keeps one in flight, as most do, and a
    queue at the server never reads as a stream that hung."""
    return [await ctx.http.send(request) for request in requests]


async def taken(ctx: Ctx, requests: Sequence[OpenAIRequest], option: str) -> list[Answer]:
    """The answers of ``requests``, whose first asks for ``option`` as plainly as any: when the
    server declines that one (a 4xx with an error object, or a 501: ``declined``) it does not serve
    the option and the case skips; a later request it declines is left out, with a note. Anything
    else (a 200, another 5xx, a broken stream) is an answer for the case to judge."""
    first = await ctx.http.send(requests[0])
    if declined(first):
        raise CaseSkipped(f"the server refuses {option}: HTTP {first.status}: {first.text[:200]}")
    answers = [Answer.of(first)]
    for exchange in await send_all(ctx, requests[1:]):
        if declined(exchange):
            assert exchange.request is not None
            ctx.note(f"refused, so not judged: {exchange.request!r}: {exchange.text[:200]}")
            continue
        answers.append(Answer.of(exchange))
    return answers


def answered_ok(ctx: Ctx, answer: Answer, what: str) -> bool:
    """An HTTP 200 read to its end, or a mismatch saying what came instead."""
    if answer.ok:
        return True
    detail = answer.exchange.summary() + (f": {answer.exchange.text[:300]}" if answer.exchange.text else "")
    ctx.check.add(what, "HTTP 200, read to its end (or a 4xx or 501 declining the option)", detail)
    return False


def check_usage(ctx: Ctx, answer: Answer, what: str) -> None:
    """The usage a body always carries, and a stream where it asked (include_usage): integers with
    total = prompt + completion, the constraint notwithstanding; and completion_tokens counting at
    least one token for each choice that wrote anything, text or a tool call (a call's name and
    arguments are generated tokens, whatever the message's content says)."""
    if answer.view.streamed and not answer.request.include_usage:
        return
    numbers = usage_numbers(answer.view.usage)
    ctx.check.that(
        numbers is not None and numbers[2] == numbers[0] + numbers[1],
        f"{what}: usage",
        "prompt_tokens, completion_tokens and total_tokens = prompt + completion",
        answer.view.usage,
    )
    wrote = [i for i, c in calls_of(answer.exchange).items() if c.called or c.content]
    if numbers is not None and wrote:
        ctx.check.that(
            numbers[1] >= len(wrote),
            f"{what}: completion_tokens",
            f">= {len(wrote)}: a token at least for each choice that wrote a call or text ({wrote})",
            numbers[1],
        )


def where(answer: Answer) -> str:
    request = answer.request
    return f"{request.api}{' stream' if request.stream else ''} n={request.n}"


def cut_text(text: str, complete: bool) -> str:
    """What is judged of a text: all of it when the output ended on its own; when it was cut short
    (at max_tokens) without a trailing U+FFFD, the replacement a server writes for a character whose
    bytes the cut split (a prefix of the document up to there is all a cut owes)."""
    return text if complete else text.rstrip("\ufffd")
