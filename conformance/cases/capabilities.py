"""Capabilities and limits (CAP-1, CAP-2, CAP-5) and tokenization (TOK-1, TOK-2)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from grpclib.const import Status
from hypothesis import strategies as st

from conformance.cases._helpers import (
    NO_SUCH_PATH,
    abort_all,
    accepted,
    expect_rejected,
    ok,
    outputs_tokens,
    status_of,
)
from conformance.harness.context import Ctx, RpcOutcome
from conformance.harness.load import idle_load
from conformance.harness.requests import long_request, request
from conformance.search.property import raise_outcome, search
from conformance.search.strategies import PROMPTS, prompt_texts
from conformance.spec.registry import case
from conformance.stream.record import End
from conformance.validators import validate
from conformance.validators.base import Facts
from conformance.vocabulary import CaseSkipped, Mismatch, TargetInfo
from lmrpc.v1 import (
    AbortRequest,
    AbortStatus,
    ChatInput,
    ChatMessage,
    Constraint,
    EmbedRequest,
    FlushCacheRequest,
    GenerateRequest,
    ListModelsRequest,
    RequestIds,
    ResponseOptions,
    SamplingParams,
    ScoreRequest,
    StoppingCriteria,
    StopProfileRequest,
    TokenIds,
    TokenizeRequest,
    UpdateWeightsRequest,
)

Mutate = Callable[[GenerateRequest], None]
T = TypeVar("T")


def _input(**member: object) -> Mutate:
    def mutate(request: GenerateRequest) -> None:
        request.text = None  # betterproto2 does not clear the other oneof members by itself
        for name, value in member.items():
            setattr(request, name, value)

    return mutate


UNSUPPORTED_OPTION: dict[str, tuple[str, Mutate]] = {
    "text_input": ("text input", lambda r: None),
    "token_ids_input": ("token_ids input", _input(token_ids=TokenIds(ids=[1, 2, 3]))),
    "chat_input": ("chat input", _input(chat=ChatInput(messages=[ChatMessage("user", "Hi")]))),
    "max_outputs>=2": ("n=2", lambda r: setattr(r, "sampling", SamplingParams(n=2))),
    "truncation_sampling": ("top_k=5", lambda r: setattr(r, "sampling", SamplingParams(top_k=5))),
    "penalties": (
        "presence_penalty=0.5",
        lambda r: setattr(r, "sampling", SamplingParams(presence_penalty=0.5)),
    ),
    "seeded_sampling": ("seed=1", lambda r: setattr(r, "sampling", SamplingParams(seed=1))),
    "stop_strings": (
        "stop_strings=['x']",
        lambda r: r.stopping.stop_strings.append("x") if r.stopping else None,
    ),
    "stop_token_ids": (
        "stop_token_ids=[1]",
        lambda r: r.stopping.stop_token_ids.append(1) if r.stopping else None,
    ),
    "logprobs": ("return_logprobs", lambda r: setattr(r, "response", ResponseOptions(return_logprobs=True))),
    "final_only": ("final_only", lambda r: setattr(r, "response", ResponseOptions(final_only=True))),
    "special_token_parsing": (
        "parse_special_tokens=true",
        lambda r: setattr(r, "parse_special_tokens", True),
    ),
    "constrained_decoding": (
        "a regex constraint",
        lambda r: setattr(r, "constraint", Constraint(regex="[a-z]+")),
    ),
}


def _unsupported_option_case(capability: str, label: str, mutate: Mutate) -> None:
    @case("CAP-1", tag=capability.split(">=")[0], requires=(f"!{capability}",))
    async def unimplemented(ctx: Ctx) -> None:
        req = GenerateRequest(request_id=ctx.uid(), text="Hello", stopping=StoppingCriteria(max_tokens=2))
        mutate(req)
        expect_rejected(
            ctx,
            await ctx.answer(req),
            (Status.UNIMPLEMENTED,),
            f"Generate with {label} ({capability} not advertised)",
        )

    unimplemented.__doc__ = f"With {capability} not advertised, a request using {label} is UNIMPLEMENTED."


for _cap, (_label, _mutate) in UNSUPPORTED_OPTION.items():
    _unsupported_option_case(_cap, _label, _mutate)


def _unsupported_rpc_case(
    capability: str, method: str, send: Callable[[Ctx], Awaitable[RpcOutcome[Any]]]
) -> None:
    @case("CAP-1", tag=capability, requires=(f"!{capability}",))
    async def unimplemented(ctx: Ctx) -> None:
        outcome = await send(ctx)
        ctx.check.equal(f"{method} with {capability} not advertised", Status.UNIMPLEMENTED.name, outcome.code)

    unimplemented.__doc__ = f"With {capability} not advertised, {method} is UNIMPLEMENTED."


_unsupported_rpc_case(
    "embed", "Embed", lambda ctx: ctx.call_status(ctx.inference.embed, EmbedRequest(texts=["Hello"]))
)
_unsupported_rpc_case(
    "tokenize", "Tokenize", lambda ctx: ctx.call_status(ctx.control.tokenize, TokenizeRequest(text="Hello"))
)
_unsupported_rpc_case(
    "admin", "FlushCache", lambda ctx: ctx.call_status(ctx.control.flush_cache, FlushCacheRequest())
)
# Revision 3's RPCs: a server of an earlier revision does not have them either (UNIMPLEMENTED).
_unsupported_rpc_case(
    "list_models", "ListModels", lambda ctx: ctx.call_status(ctx.control.list_models, ListModelsRequest())
)
_unsupported_rpc_case(
    "score",
    "Score",
    lambda ctx: ctx.call_status(ctx.inference.score, ScoreRequest(query="Hello", items=["Hello"])),
)
_unsupported_rpc_case(  # a stop, which changes nothing if the server records after all
    "profiler", "StopProfile", lambda ctx: ctx.call_status(ctx.control.stop_profile, StopProfileRequest())
)
_unsupported_rpc_case(
    "weight_updates",
    "UpdateWeights",
    lambda ctx: ctx.call_status(ctx.control.update_weights, UpdateWeightsRequest(model_path=NO_SUCH_PATH)),
)


@case("CAP-2", tag="max_outputs")
async def max_outputs_honoured(ctx: Ctx) -> None:
    """n = max_outputs is accepted and yields that many outputs."""
    n = ctx.info.caps.max_outputs
    record = ok(ctx, await ctx.generate(request(ctx, n=n, max_tokens=2)))
    ctx.check.equal(f"outputs of an n={n} request", list(range(n)), list(record.outputs()))


@case("CAP-2", tag="max_top_logprobs", requires=("logprobs", "max_top_logprobs>=1"))
async def max_top_logprobs_honoured(ctx: Ctx) -> None:
    """top_logprobs = max_top_logprobs is accepted and every token carries that many candidates."""
    top = ctx.info.caps.max_top_logprobs
    record = ok(
        ctx,
        await ctx.generate(
            request(ctx, max_tokens=3, response=ResponseOptions(return_logprobs=True, top_logprobs=top))
        ),
    )
    sizes = [len(lp.top) for v in record.outputs().values() for lp in v.logprobs]
    ctx.check.that(
        bool(sizes) and all(s == top for s in sizes), "TokenLogprob.top sizes", f"all {top}", sizes
    )


@case("CAP-2", tag="max_stop_strings", requires=("stop_strings", "max_stop_strings>=1"))
async def max_stop_strings_honoured(ctx: Ctx) -> None:
    """max_stop_strings stop strings are accepted."""
    strings = [f"\u2603{i}\u2603" for i in range(ctx.info.caps.max_stop_strings)]
    record = await ctx.generate(request(ctx, max_tokens=2, stop_strings=strings))
    ctx.check.that(
        record.ended_ok and record.error is None,
        f"Generate with {len(strings)} stop strings",
        "accepted, status OK",
        status_of(record),
    )


@case(
    "TOK-1",
    tag="text",
    requires=("tokenize",),
    sends=(
        "generate.text",
        "generate.return_prompt_token_ids",
    ),
)
async def tokenize_matches_generate(ctx: Ctx) -> None:
    """Tokenize returns exactly the prompt ids Generate uses (PromptInfo.prompt_token_ids)."""
    for text in PROMPTS[:6]:
        record = ok(
            ctx,
            await ctx.generate(
                request(ctx, text, max_tokens=1, response=ResponseOptions(return_prompt_token_ids=True))
            ),
        )
        ctx.check.equal(
            f"prompt ids of {text!r}: Tokenize vs Generate",
            await ctx.tokenize(text),
            list(record.prompt_info.prompt_token_ids) if record.prompt_info else None,
        )


@case(
    "TOK-1",
    tag="chat",
    requires=("tokenize", "chat_input"),
    sends=(
        "generate.chat",
        "tokenize.chat",
    ),
)
async def tokenize_chat_matches_generate(ctx: Ctx) -> None:
    """Tokenize(chat) returns exactly the prompt ids Generate(chat) uses."""
    chat = ChatInput(messages=[ChatMessage("system", "Be brief."), ChatMessage("user", "Hello!")])
    record = ok(
        ctx,
        await ctx.generate(
            GenerateRequest(
                request_id=ctx.uid(),
                chat=chat,
                stopping=StoppingCriteria(max_tokens=1),
                response=ResponseOptions(return_prompt_token_ids=True),
            )
        ),
    )
    tokenized = list((await ctx.call(ctx.control.tokenize, TokenizeRequest(chat=chat))).token_ids)
    ctx.check.equal(
        "chat prompt ids: Tokenize vs Generate",
        tokenized,
        list(record.prompt_info.prompt_token_ids) if record.prompt_info else None,
    )


@case("TOK-2", requires=("tokenize",), sends=("tokenize.text",))
async def round_trip(ctx: Ctx) -> None:
    """Detokenize(Tokenize(text)) gives the text back."""

    async def body(text: str) -> list[Mismatch]:
        ids = await ctx.tokenize(text)
        back = await ctx.detokenize(ids)
        return [] if back == text else [Mismatch(f"Detokenize(Tokenize({text!r}))", repr(text), repr(back))]

    raise_outcome(ctx, await search(ctx, prompt_texts(), body, examples=ctx.tuning.examples * 4))


PENALTIES = {"frequency_penalty": 2.0, "presence_penalty": 2.0, "repetition_penalty": 10.0}  # SAMPLE-5 limits


@case(
    "CAP-2",
    tag="penalties",
    requires=("penalties", "deterministic_greedy"),
    sends=(
        "generate.frequency_penalty",
        "generate.presence_penalty",
        "generate.repetition_penalty",
    ),
)
async def penalties_take_effect(ctx: Ctx) -> None:
    """Each penalty, at its strongest, changes the greedy continuation of a repetitive prompt."""
    prompt = "the the the the the the the the the the the the"
    plain = ok(ctx, await ctx.generate(request(ctx, prompt, temperature=0.0, ignore_eos=True)))
    for name, value in PENALTIES.items():
        req = request(ctx, prompt, ignore_eos=True)
        req.sampling = SamplingParams(temperature=0.0, **{name: value})  # type: ignore[arg-type]
        penalized = ok(ctx, await ctx.generate(req), f"a greedy request with {name}")
        ctx.check.that(
            outputs_tokens(penalized) != outputs_tokens(plain),
            f"greedy tokens with {name} at its limit",
            "different from the unpenalized ones",
            outputs_tokens(penalized),
        )


@case("CAP-5", tag="max_stop_string_bytes", requires=("stop_strings",))
async def stop_string_limit(ctx: Ctx) -> None:
    """A stop string of exactly limits.max_stop_string_bytes bytes is accepted; one byte more is
    INVALID_ARGUMENT."""
    limits = ctx.info.server.limits
    limit = limits.max_stop_string_bytes if limits else 0
    if not limit:
        raise CaseSkipped("the server reports no stop-string length limit")
    fits = "\u00e9" * (limit // 2) + "x" * (limit % 2)  # two-byte characters: bytes, not characters, count
    accepted = await ctx.generate(request(ctx, max_tokens=1, stop_strings=[fits]))
    ctx.check.that(
        accepted.ended_ok and accepted.error is None,
        f"a stop string of {len(fits.encode())} bytes (the limit)",
        "accepted, status OK",
        status_of(accepted),
    )
    expect_rejected(
        ctx,
        await ctx.answer(request(ctx, max_tokens=1, stop_strings=[fits + "x"])),
        (Status.INVALID_ARGUMENT,),
        f"a stop string of {limit + 1} bytes",
    )


UNLIMITED_STOP_STRING_BYTES = 4096  # 16 times the usual limit: what "no limit" must at least accept
UNLIMITED_ABORT_IDS = 8192  # twice the usual limit


def _zero_limit_or_skip(ctx: Ctx, name: str) -> None:
    """SKIP unless ServerInfo.limits reports ``name`` as 0 (none)."""
    limits = ctx.info.server.limits
    if limits is None:
        raise CaseSkipped("the server reports no ServerInfo.limits (contract revision 1)")
    value = int(getattr(limits, name))
    if value != 0:
        raise CaseSkipped(f"limits.{name}={value}: a limit, not none")


@case("CAP-5", tag="no-stop-string-limit", requires=("stop_strings",))
async def zero_stop_string_limit_is_none(ctx: Ctx) -> None:
    """limits.max_stop_string_bytes = 0 is no limit: a stop string of 4 KiB is accepted."""
    _zero_limit_or_skip(ctx, "max_stop_string_bytes")
    long_stop = "\u00e9" * (UNLIMITED_STOP_STRING_BYTES // 2)
    record = await ctx.generate(request(ctx, max_tokens=1, stop_strings=[long_stop]))
    ctx.check.that(
        record.ended_ok and record.error is None,
        f"a stop string of {UNLIMITED_STOP_STRING_BYTES} bytes with limits.max_stop_string_bytes = 0",
        "accepted, status OK",
        status_of(record),
    )


@case("CAP-5", tag="no-abort-ids-limit")
async def zero_abort_ids_limit_is_none(ctx: Ctx) -> None:
    """limits.max_abort_request_ids = 0 is no limit: an Abort naming 8192 unknown ids answers one
    NOT_IN_FLIGHT each."""
    _zero_limit_or_skip(ctx, "max_abort_request_ids")
    prefix = ctx.uid("no-limit")
    ids = [f"{prefix}-{i}" for i in range(UNLIMITED_ABORT_IDS)]
    outcome = await ctx.call_status(ctx.control.abort, AbortRequest(request_ids=RequestIds(ids=ids)))
    answered = outcome.response.outcomes if outcome.response is not None else []
    ctx.check.that(
        outcome.status is None
        and len(answered) == UNLIMITED_ABORT_IDS
        and all(o.status == AbortStatus.NOT_IN_FLIGHT for o in answered),
        f"an Abort naming {UNLIMITED_ABORT_IDS} unknown ids with limits.max_abort_request_ids = 0",
        f"OK, {UNLIMITED_ABORT_IDS} NOT_IN_FLIGHT outcomes",
        f"{outcome.code}, {len(answered)} outcomes: {outcome.message}",
    )


ABORT_IDS_TRIED = 100_000  # a server with a larger limit: too large an Abort to send for one case


@case("CAP-5", tag="max_abort_request_ids")
async def abort_ids_limit(ctx: Ctx) -> None:
    """An Abort naming exactly limits.max_abort_request_ids ids (none in flight) answers one
    NOT_IN_FLIGHT per id; one id more is INVALID_ARGUMENT."""
    limits = ctx.info.server.limits
    limit = limits.max_abort_request_ids if limits else 0
    if not limit or limit > ABORT_IDS_TRIED:
        raise CaseSkipped(
            f"limits.max_abort_request_ids={limit}: none, or more than {ABORT_IDS_TRIED} to send"
        )
    prefix = ctx.uid("abort-limit")
    ids = [f"{prefix}-{i}" for i in range(limit + 1)]
    at_limit = await ctx.call_status(ctx.control.abort, AbortRequest(request_ids=RequestIds(ids=ids[:limit])))
    outcomes = at_limit.response.outcomes if at_limit.response is not None else []
    ctx.check.that(
        at_limit.status is None
        and len(outcomes) == limit
        and all(o.status == AbortStatus.NOT_IN_FLIGHT for o in outcomes),
        f"an Abort naming {limit} unknown ids (the limit)",
        f"OK, {limit} NOT_IN_FLIGHT outcomes",
        f"{at_limit.code}, {len(outcomes)} outcomes",
    )
    over = await ctx.call_status(ctx.control.abort, AbortRequest(request_ids=RequestIds(ids=ids)))
    ctx.check.equal(f"an Abort naming {limit + 1} ids", Status.INVALID_ARGUMENT.name, over.code)


WAITING_LIMIT_TRIED = 64  # a server with a larger limit: too many streams to open for one case


@case("CAP-5", tag="max_waiting_requests", exclusive=True, sends=("scenario.waiting-limit",))
async def waiting_limit(ctx: Ctx) -> None:
    """With limits.max_waiting_requests requests in flight, one more gets RESOURCE_EXHAUSTED and no
    messages; the ones in flight are unaffected."""
    limits = ctx.info.server.limits
    limit = limits.max_waiting_requests if limits else 0
    if not limit or limit > WAITING_LIMIT_TRIED:
        raise CaseSkipped(
            f"limits.max_waiting_requests={limit}: none, or more than {WAITING_LIMIT_TRIED} to open"
        )
    await idle_load(ctx)
    streams = [ctx.open(long_request(ctx)) for _ in range(limit)]
    try:
        for stream in streams:
            await accepted(ctx, stream)
        one_more = await ctx.answer(request(ctx, max_tokens=1))
        expect_rejected(
            ctx, one_more, (Status.RESOURCE_EXHAUSTED,), f"request {limit + 1} with {limit} in flight"
        )
        ctx.check.that(
            all(s.record.end is End.OPEN for s in streams),
            f"the {limit} requests in flight",
            "unaffected (still open)",
            [s.record.end.value for s in streams if s.record.end is not End.OPEN][:4],
        )
    finally:  # all at once: with an Abort(all) that misses some, one release budget, not one each
        await abort_all(ctx)
        await asyncio.gather(*(stream.finish(ctx.budgets.release_s) for stream in streams))


# ── every advertised feature at its edge, in combination ───────────────────────
@dataclass(frozen=True, slots=True)
class Edges:
    """Advertised features a request uses, each at the edge of its advertised limit."""

    n: int | None = None  # max_outputs
    top_logprobs: int | None = None  # max_top_logprobs, with return_logprobs
    stop_strings: int = 0  # max_stop_strings, the last one max_stop_string_bytes long
    stop_token_ids: tuple[int, ...] = ()
    sampling: tuple[tuple[str, float], ...] = ()  # a truncation or penalty option at its range's end
    seed: int | None = None
    final_only: bool = False
    chat: bool = False

    def used(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name) not in (None, 0, (), False)]


def advertised_edges(info: TargetInfo) -> st.SearchStrategy[Edges]:
    """Subsets of what the server advertises, each feature at the edge of its advertised limit."""
    caps = info.caps

    def maybe(strategy: st.SearchStrategy[T], enabled: bool, off: T) -> st.SearchStrategy[T]:
        return st.one_of(st.just(off), strategy) if enabled else st.just(off)

    extremes = []
    if info.has("truncation_sampling"):
        extremes += [(("top_p", 1.0),), (("top_k", 1.0),), (("min_p", 1.0),)]
    if info.has("penalties"):
        extremes += [
            (("frequency_penalty", 2.0),),
            (("presence_penalty", -2.0),),
            (("repetition_penalty", 10.0),),
        ]
    return st.builds(
        Edges,
        n=maybe(st.just(caps.max_outputs), caps.max_outputs > 1, None),
        top_logprobs=maybe(st.just(caps.max_top_logprobs), info.has("logprobs"), None),
        stop_strings=maybe(st.just(caps.max_stop_strings), info.has("stop_strings"), 0),
        stop_token_ids=maybe(st.just(tuple(info.eos_ids[:1]) or (0,)), info.has("stop_token_ids"), ()),
        sampling=maybe(st.sampled_from(extremes) if extremes else st.just(()), bool(extremes), ()),
        seed=maybe(st.just(2**63 - 1), info.has("seeded_sampling"), None),
        final_only=maybe(st.just(True), info.has("final_only"), False),
        chat=maybe(st.just(True), info.has("chat_input"), False),
    )


def edge_request(ctx: Ctx, edges: Edges) -> GenerateRequest:
    limit = ctx.info.server.limits.max_stop_string_bytes if ctx.info.server.limits else 0
    stops = [f"\u2603{i}\u2603" for i in range(edges.stop_strings)]
    if stops and limit:
        stops[-1] = "\u2603" * (limit // 3) + "#" * (limit % 3)  # exactly the longest one accepted
    sampling = SamplingParams(n=edges.n, seed=edges.seed, temperature=0.7 if edges.seed is not None else None)
    for name, value in edges.sampling:
        setattr(sampling, name, int(value) if name == "top_k" else value)
    req = GenerateRequest(
        request_id=ctx.uid("edges"),
        sampling=sampling,
        stopping=StoppingCriteria(
            max_tokens=3, stop_strings=stops, stop_token_ids=list(edges.stop_token_ids)
        ),
        response=ResponseOptions(
            return_logprobs=edges.top_logprobs is not None,
            top_logprobs=edges.top_logprobs or 0,
            final_only=edges.final_only,
        ),
    )
    if edges.chat:
        req.chat = ChatInput(messages=[ChatMessage("user", "Hello")])
    else:
        req.text = "Hello"
    return req


@case("CAP-2", tag="combined")
async def advertised_edges_together(ctx: Ctx) -> None:
    """Every combination of advertised features, each at its advertised limit (n = max_outputs,
    top_logprobs = max_top_logprobs, max_stop_strings stop strings and the longest one allowed, a
    sampling option at its range's end, ...), is accepted and honoured: what discovery advertises is
    what Generate accepts, also together. Its streams also keep STREAM-7 (one logprob per token, none
    unasked) and USAGE-4 (no more cached tokens than prompt tokens)."""

    async def body(edges: Edges) -> list[Mismatch]:
        record = await ctx.generate(edge_request(ctx, edges))
        what = f"Generate with {edges.used() or 'nothing'} at their limits"
        if not (record.ended_ok and record.error is None):
            return [Mismatch(what, "accepted, status OK", status_of(record))]
        mismatches = []
        indices = list(record.outputs())
        if indices != list(range(edges.n or 1)):
            mismatches.append(Mismatch(f"{what}: outputs", f"indices 0..{(edges.n or 1) - 1}", f"{indices}"))
        if edges.top_logprobs is not None:
            sizes = [len(lp.top) for v in record.outputs().values() for lp in v.logprobs]
            if not sizes or any(size != edges.top_logprobs for size in sizes):
                mismatches.append(
                    Mismatch(f"{what}: TokenLogprob.top sizes", f"all {edges.top_logprobs}", f"{sizes}")
                )
        # one logprob per token, and none unasked (STREAM-7); no more cached than prompt tokens (USAGE-4)
        for found in validate(record, Facts(ctx.info), ("STREAM-7", "USAGE-4")):
            mismatches.append(Mismatch(f"{what}: {found.what}", found.want, found.got))
        return mismatches

    raise_outcome(ctx, await search(ctx, advertised_edges(ctx.info), body))
