"""The stream pool: one batch of generated requests, run concurrently once per run, that every
stream clause (STREAM-*, FINISH-*, USAGE-*, N-*, ...) validates.

Validating a shared pool costs no RPCs per clause; only a clause that finds a violation searches
again (with shrinking) for a minimal failing request. The pool also runs its requests concurrently,
which is what STREAM-6 (no cross-talk) needs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace

from hypothesis import Phase

from conformance.harness.context import Ctx
from conformance.harness.facts import gather_facts
from conformance.harness.requests import sampled_for
from conformance.harness.session import Session
from conformance.report.repro import script
from conformance.search.property import keep_repro, profile, run_property, search
from conformance.search.strategies import valid_requests
from conformance.stream.record import StreamRecord
from conformance.validators import validate
from conformance.validators.base import Facts
from conformance.vocabulary import Call, CaseFailed, Mismatch, Repro, TargetInfo
from lmrpc.v1 import (
    ChatInput,
    ChatMessage,
    GenerateRequest,
    ResponseOptions,
    SamplingParams,
    StoppingCriteria,
)

CONCURRENCY = 8


@dataclass(slots=True)
class PoolEntry:
    record: StreamRecord
    facts: Facts
    sent: frozenset[str] = frozenset()  # the input classes of the whole pool


def copy_request(request: GenerateRequest) -> GenerateRequest:
    return GenerateRequest.parse(bytes(request))


def sentinels(info: TargetInfo, max_tokens: int) -> list[GenerateRequest]:
    """Requests the pool always contains, so every option the target advertises is exercised."""
    return [
        request
        for requirement, requests in SENTINELS
        if requirement is None or info.has(requirement)
        for request in requests(info, max_tokens)
    ]


def _always(info: TargetInfo, max_tokens: int) -> list[GenerateRequest]:
    """Plain text, n > 1, ignore_eos, min_tokens, and the text or the ids left out."""
    n = min(info.caps.max_outputs, 4)
    return [
        GenerateRequest(
            text="Hello",
            sampling=SamplingParams(temperature=sampled_for(n), n=n),
            stopping=StoppingCriteria(max_tokens=max_tokens),
        ),
        GenerateRequest(
            text="Once upon a time",
            stopping=StoppingCriteria(max_tokens=max_tokens, ignore_eos=True),
            response=ResponseOptions(return_prompt_token_ids=True),
        ),
        GenerateRequest(
            text="日本語で答えてください。🙂",
            sampling=SamplingParams(temperature=1.0, n=min(n, 2)),
            stopping=StoppingCriteria(max_tokens=max_tokens, min_tokens=max_tokens // 2),
        ),
        GenerateRequest(
            text="The capital of France is",
            response=ResponseOptions(return_text=False),
            stopping=StoppingCriteria(max_tokens=max_tokens),
        ),
        GenerateRequest(
            text="1, 2, 3,",
            response=ResponseOptions(return_token_ids=False),
            stopping=StoppingCriteria(max_tokens=max_tokens),
        ),
    ]


def _final_only(info: TargetInfo, max_tokens: int) -> list[GenerateRequest]:
    """One answer at the end (STREAM-3)."""
    n = min(info.caps.max_outputs, 4)
    return [
        GenerateRequest(
            text="Hello",
            sampling=SamplingParams(n=n, temperature=sampled_for(n)),
            stopping=StoppingCriteria(max_tokens=max_tokens, ignore_eos=True),
            response=ResponseOptions(final_only=True),
        ),
    ]


def _logprobs(info: TargetInfo, max_tokens: int) -> list[GenerateRequest]:
    """Logprobs with top-k alternatives, with and without the ids, and in one answer at the end,
    whose count a protocol may carry only there (STREAM-7)."""
    n = min(info.caps.max_outputs, 4)
    at_the_end = [
        GenerateRequest(
            text="The capital of France is",
            sampling=SamplingParams(temperature=0.0),
            stopping=StoppingCriteria(max_tokens=max_tokens),
            response=ResponseOptions(return_logprobs=True, top_logprobs=1, final_only=True),
        )
    ]
    return [
        *(at_the_end if info.has("final_only") else []),
        GenerateRequest(
            text="def add(a, b):",
            sampling=SamplingParams(temperature=0.8, n=min(n, 2)),
            stopping=StoppingCriteria(max_tokens=max_tokens),
            response=ResponseOptions(return_logprobs=True, top_logprobs=info.caps.max_top_logprobs),
        ),
        # one logprob per token must hold when the ids are not sent too (STREAM-7)
        GenerateRequest(
            text="Once upon a time",
            sampling=SamplingParams(temperature=1.0),
            stopping=StoppingCriteria(max_tokens=max_tokens),
            response=ResponseOptions(
                return_logprobs=True,
                top_logprobs=min(info.caps.max_top_logprobs, 2),
                return_token_ids=False,
            ),
        ),
    ]


def _stop_strings(info: TargetInfo, max_tokens: int) -> list[GenerateRequest]:
    """Stop strings, kept and dropped (STOP-1, STOP-2, STOP-5)."""
    out: list[GenerateRequest] = []
    for include in (False, True):
        out.append(
            GenerateRequest(
                text="Once upon a time",
                sampling=SamplingParams(temperature=0.0),
                stopping=StoppingCriteria(
                    max_tokens=max_tokens, stop_strings=[" ", "e"], include_stop_in_output=include
                ),
            )
        )
        out.append(  # longer stop strings, a later entry matching, min_tokens (STOP-1, STOP-2, STOP-5)
            GenerateRequest(
                text="Once upon a time",
                sampling=SamplingParams(temperature=0.0),
                stopping=StoppingCriteria(
                    max_tokens=max_tokens,
                    min_tokens=2,
                    stop_strings=["\u2603\u2603", " upon", ", ", " the"][: info.caps.max_stop_strings],
                    include_stop_in_output=include,
                ),
            )
        )
    return out


def _stop_token_ids(info: TargetInfo, max_tokens: int) -> list[GenerateRequest]:
    """A stop token that is also EOS (FINISH-5)."""
    return [
        GenerateRequest(
            text="Hello",
            stopping=StoppingCriteria(max_tokens=max_tokens, stop_token_ids=info.eos_ids[:1]),
            response=ResponseOptions(skip_special_tokens=False),
        ),
    ]


def _chat_input(info: TargetInfo, max_tokens: int) -> list[GenerateRequest]:
    """Chat messages, with and without the generation prompt."""
    return [
        GenerateRequest(
            chat=ChatInput(messages=[ChatMessage(role="user", content="Say hi.")]),
            stopping=StoppingCriteria(max_tokens=max_tokens),
            response=ResponseOptions(return_prompt_token_ids=True),
        ),
        GenerateRequest(
            chat=ChatInput(
                messages=[ChatMessage(role="user", content="Say hi.")], add_generation_prompt=False
            ),
            stopping=StoppingCriteria(max_tokens=max_tokens),
            response=ResponseOptions(return_prompt_token_ids=True),
        ),
    ]


def _seeded_sampling(info: TargetInfo, max_tokens: int) -> list[GenerateRequest]:
    """A seeded sample (SAMPLE-3)."""
    return [
        GenerateRequest(
            text="Hello",
            sampling=SamplingParams(temperature=1.0, seed=1234),
            stopping=StoppingCriteria(max_tokens=max_tokens),
        ),
    ]


#: (the capability each needs, or None for every target; what it adds), in pool order
SENTINELS: tuple[tuple[str | None, Callable[[TargetInfo, int], list[GenerateRequest]]], ...] = (
    (None, _always),
    ("final_only", _final_only),
    ("logprobs", _logprobs),
    ("stop_strings", _stop_strings),
    ("stop_token_ids", _stop_token_ids),
    ("chat_input", _chat_input),
    ("seeded_sampling", _seeded_sampling),
)


def drawn_requests(session: Session, count: int) -> list[GenerateRequest]:
    """``count`` requests drawn by hypothesis (derandomized under the CI profile: the same every run)."""
    drawn: list[GenerateRequest] = []
    strategy = valid_requests(session.info, max_tokens=session.tuning.max_tokens)
    config = profile(session.profile, count, phases=[Phase.generate])
    run_property(strategy, lambda r: drawn.append(copy_request(r)), config, session.seed)
    return drawn


async def build_pool(session: Session) -> list[PoolEntry]:
    ctx = Ctx(session, "pool", {})
    requests = sentinels(session.info, session.tuning.max_tokens)
    requests += await asyncio.to_thread(drawn_requests, session, session.tuning.pool_size)
    for request in requests:
        request.request_id = ctx.uid()
    ids = [r.request_id for r in requests]
    gate = asyncio.Semaphore(CONCURRENCY)

    async def run(request: GenerateRequest) -> PoolEntry:
        async with gate:
            record = await ctx.generate(request, hung_ok=True)
        return PoolEntry(
            record, await gather_facts(ctx, record, others=[i for i in ids if i != request.request_id])
        )

    try:
        entries = list(await asyncio.gather(*(run(r) for r in requests)))
    finally:
        await ctx.close()
    sent = frozenset(ctx.sent)
    return [PoolEntry(e.record, e.facts, sent) for e in entries]


async def check_on_pool(ctx: Ctx, clause: str) -> None:
    """Validate ``clause`` on every pooled stream; on a violation, search for a minimal failing request."""
    entries: list[PoolEntry] = await ctx.session.shared("pool", lambda: build_pool(ctx.session))
    if entries:
        ctx.sent |= entries[0].sent
    failures = [(e, found) for e in entries if (found := validate(e.record, e.facts, [clause]))]
    ctx.note(f"{len(entries)} pooled streams validated, {len(failures)} violate {clause}")
    if not failures:
        return
    # every violating request is reported, each finding under its request; the search adds a minimal one
    pooled = [
        replace(m, subject=e.record.request_id or "a pooled request") for e, found in failures for m in found
    ]
    entry = failures[0][0]

    async def body(request: GenerateRequest) -> list[Mismatch]:
        request = copy_request(request)
        request.request_id = ctx.uid()
        record = await ctx.generate(request)  # raises StreamHung: the search stops at the first hang
        return validate(record, await gather_facts(ctx, record), [clause])

    # Search the generated space afresh rather than starting from the pooled request: hypothesis orders
    # examples shortlex, so a fixed value would always count as "smaller" than any generated one.
    outcome = await search(ctx, valid_requests(ctx.info, max_tokens=ctx.tuning.max_tokens), body)
    if not outcome.passed:
        keep_repro(ctx, outcome)
        raise CaseFailed([*pooled, *(replace(m, subject="the shrunk example") for m in outcome.mismatches)])
    ctx.note("a fresh search did not reproduce the violation (intermittent?); reporting the pooled streams")
    ctx.repro = Repro(
        kind="example",
        example=repr(entry.record.request),
        script=script(
            ctx.case_id,
            str(ctx.session.target.endpoint),
            [Call(0.0, "inference", "generate", entry.record.request)],
            ctx.session.target.driver.protocol,
        ),
    )
    raise CaseFailed(pooled)
