"""The answer pool: one batch of requests (fixed sentinels plus hypothesis draws over what the server
supports), sent once per run at the server's parallelism, that every answer clause validates
(validators/openai.py). Only a clause that finds a violation sends more: a hypothesis search for a
minimal failing request, whose calls become the repro."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from hypothesis import Phase

from conformance.cases.openai._common import make, openai_case, support
from conformance.cases.openai.stops import MULTIBYTE_PROMPT
from conformance.drivers.openai.calls import HttpCall
from conformance.drivers.openai.exchange import OpenAIRequest
from conformance.drivers.openai.support import Support
from conformance.harness.context import Ctx
from conformance.harness.session import Session
from conformance.report.http_repro import http_script
from conformance.search.openai import openai_requests
from conformance.search.property import profile, run_property, search
from conformance.validators.openai import CLAUSES, Answer, judge
from conformance.vocabulary import CaseFailed, Mismatch, Repro

POOL = "openai-pool"
ENDS_ON_ITS_OWN = 64  # tokens: a short greedy answer ends before this


def sentinels(found: Support, max_tokens: int) -> list[OpenAIRequest]:
    """Requests the pool always holds, so every supported option is seen at least once."""
    out = []
    for api in found.apis():
        n = 2 if found.has(api, "n") else None
        greedy_n = 2 if found.has(api, "greedy_n") else None  # several greedy choices: refused by some
        logprobs: dict[str, Any] = {}
        if found.has(api, "logprobs"):
            logprobs = {"logprobs": True, "top_logprobs": 2} if api == "chat" else {"logprobs": 2}
        out.append(make(api, max_tokens=max_tokens, temperature=0, n=greedy_n, **logprobs))
        out.append(make(api, "Once upon a time", max_tokens=max_tokens, temperature=1.0, n=n, **logprobs))
        if logprobs:  # one choice with room to end on its own: its usage is checked against its entries
            out.append(
                make(api, "Say hi.", max_tokens=max(ENDS_ON_ITS_OWN, max_tokens), temperature=0, **logprobs)
            )
        if found.has(api, "stream"):
            usage = {"stream_options": {"include_usage": True}} if found.has(api, "include_usage") else {}
            out.append(
                make(api, max_tokens=max_tokens, temperature=0, n=greedy_n, stream=True, **usage, **logprobs)
            )
            out.append(
                make(api, max_tokens=max_tokens, temperature=1.0, n=n, stream=True, **usage, **logprobs)
            )
            out.append(make(api, "日本語で答えてください。🙂", max_tokens=max_tokens, stream=True, **usage))
        if found.has(api, "stop"):
            out.append(make(api, "Once upon a time", max_tokens=max_tokens, temperature=0, stop=[" ", "e"]))
            stream = {"stream": True} if found.has(api, "stream") else {}
            out.append(
                make(api, MULTIBYTE_PROMPT, max_tokens=max_tokens, temperature=0, stop=[" "], **stream)
            )
            if found.has(api, "stream"):
                out.append(
                    make(
                        api,
                        "Once upon a time",
                        max_tokens=max_tokens,
                        temperature=0,
                        stop=[" the", ", "],
                        stream=True,
                    )
                )
    return out


def drawn(session: Session, count: int) -> list[OpenAIRequest]:
    """``count`` requests drawn by hypothesis (derandomized under the CI profile: the same every run)."""
    found: list[OpenAIRequest] = []
    strategy = openai_requests(session.http.support, session.tuning.max_tokens)
    run_property(
        strategy, found.append, profile(session.profile, count, phases=[Phase.generate]), session.seed
    )
    return found


async def build_pool(session: Session) -> list[Answer]:
    ctx = Ctx(session, "openai-pool", {})
    requests = sentinels(session.http.support, session.tuning.max_tokens)
    requests += await asyncio.to_thread(drawn, session, session.tuning.pool_size)
    gate = asyncio.Semaphore(session.http.parallel)

    async def one(request: OpenAIRequest) -> Answer:
        async with gate:
            return Answer.of(await ctx.http.send(request))

    try:
        return list(await asyncio.gather(*(one(r) for r in requests)))
    finally:
        await ctx.close()


def request_repro(ctx: Ctx, requests: list[OpenAIRequest], mismatches: list[Mismatch], example: str) -> Repro:
    endpoint = ctx.http.target.endpoint
    calls = [HttpCall(0.0, "POST", endpoint.url(r.path), ctx.http.target.client.body_of(r)) for r in requests]
    return Repro(
        kind="example",
        example=example,
        seed=ctx.session.seed,
        script=http_script(ctx.case_id, endpoint.base_url, endpoint.root_url, calls, mismatches),
    )


async def check_pool(ctx: Ctx, clause: str) -> None:
    """Validate ``clause`` on every pooled answer; on a violation, search for a minimal failing request."""
    answers: list[Answer] = await ctx.session.shared(POOL, lambda: build_pool(ctx.session))
    failures = [(i, a, found) for i, a in enumerate(answers) if (found := judge(a, [clause]))]
    ctx.note(f"{len(answers)} pooled answers validated, {len(failures)} violate {clause}")
    if not failures:
        return
    # every violating answer is reported, each finding under its request; the search adds a minimal one
    pooled = [
        replace(m, subject=f"pooled request {i} ({a.request.api})") for i, a, found in failures for m in found
    ]

    async def body(request: OpenAIRequest) -> list[Mismatch]:
        return judge(Answer.of(await ctx.http.send(request)), [clause])

    outcome = await search(ctx, openai_requests(support(ctx), ctx.tuning.max_tokens), body)
    if not outcome.passed and isinstance(outcome.last_failing, OpenAIRequest):
        ctx.repro = request_repro(ctx, [outcome.last_failing], outcome.mismatches, outcome.example)
        raise CaseFailed([*pooled, *(replace(m, subject="the shrunk example") for m in outcome.mismatches)])
    _, answer, found = failures[0]
    ctx.note("a fresh search did not reproduce the violation (intermittent?); reporting the pooled answers")
    ctx.repro = request_repro(ctx, [answer.request], found, repr(answer.request))
    raise CaseFailed(pooled)


def _pool_case(clause: str) -> None:
    async def body(ctx: Ctx) -> None:
        await check_pool(ctx, clause)

    body.__doc__ = f"Every answer of the pool (generated requests, sent concurrently) satisfies {clause}."
    body.__module__ = __name__
    openai_case(clause, tag="pool", budget=2.0)(body)


for _clause in CLAUSES:
    _pool_case(_clause)
