"""Stop conditions (STOP-1..5, FINISH-5, FINISH-6): learn a deterministic output first, then stop it
at a string or token known to occur, and check where and how it ends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conformance.cases._helpers import ok
from conformance.harness.context import Ctx
from conformance.harness.outcome import CaseSkipped
from conformance.harness.requests import request
from conformance.spec.registry import case
from conformance.stream.record import OutputView, StreamRecord
from conformance.validators.base import first_stop_match
from lmrpc.v1 import ChatInput, ChatMessage, FinishReason, GenerateRequest, ResponseOptions, StopMatch

DETERMINISTIC = "deterministic_greedy|seeded_sampling"
PROMPT = "Once upon a time"


def _pin(ctx: Ctx, req: GenerateRequest, seed: int | None = None) -> GenerateRequest:
    """Make ``req`` reproducible: greedy, or seeded (given a seed, or where greedy is not promised)."""
    assert req.sampling is not None
    if seed is None and ctx.info.has("deterministic_greedy"):
        req.sampling.temperature = 0.0
    else:
        req.sampling.temperature, req.sampling.seed = 1.0, 4242 if seed is None else seed
    return req


def _length(ctx: Ctx) -> int:
    return max(2 * ctx.tuning.max_tokens, 16)


Prompt = str | ChatInput


def _prompted(ctx: Ctx, prompt: Prompt, **kw: Any) -> GenerateRequest:
    if isinstance(prompt, str):
        return request(ctx, prompt, **kw)
    req = request(ctx, **kw)
    req.text, req.chat = None, prompt
    return req


async def learn(ctx: Ctx, prompt: Prompt = PROMPT, seed: int | None = None) -> OutputView:
    """Output 0 of a reproducible run with ignore_eos (the reference the stop runs are compared with)."""
    req = _pin(ctx, _prompted(ctx, prompt, max_tokens=_length(ctx), ignore_eos=True), seed)
    return ok(ctx, await ctx.generate(req)).outputs()[0]


async def rerun(
    ctx: Ctx, prompt: Prompt = PROMPT, seed: int | None = None, **kw: Any
) -> tuple[StreamRecord, OutputView]:
    record = ok(
        ctx, await ctx.generate(_pin(ctx, _prompted(ctx, prompt, max_tokens=_length(ctx), **kw), seed))
    )
    return record, record.outputs()[0]


def _sendable(text: str) -> bool:
    """Text that can go into a request: no U+FFFD and no undecodable bytes (surrogate escapes)."""
    return "\ufffd" not in text and not any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def pick_stop_string(text: str) -> tuple[str, int]:
    """A 2-character stop string from the middle of ``text`` and the index of its first occurrence."""
    for start in list(range(len(text) // 2, len(text) - 1)) + list(range(1, len(text) // 2)):
        candidate = text[start : start + 2]
        if candidate.strip() and _sendable(candidate) and text.find(candidate) >= 1:
            return candidate, text.find(candidate)
    raise CaseSkipped(f"no usable stop string in the learned output {text!r}")


def pick_stop_token(ids: list[int], avoid: list[int]) -> tuple[int, int]:
    """A token of ``ids`` and the index of its first occurrence (not the first token, not an EOS)."""
    for k in list(range(len(ids) // 2, len(ids))) + list(range(1, len(ids) // 2)):
        if ids[k] not in avoid and ids.index(ids[k]) == k:
            return ids[k], k
    raise CaseSkipped(f"no usable stop token in the learned output {ids}")


def _stop(view: OutputView) -> StopMatch | None:
    return view.finish.stop if view.finish else None


async def token_starts(ctx: Ctx, ids: list[int]) -> list[int]:
    """The character offset in Detokenize(ids) at which each token's text starts (needs Tokenize)."""
    return [len(await ctx.detokenize(ids[:k])) for k in range(len(ids))]


def pick_straddling_stop(text: str, starts: list[int]) -> tuple[str, int]:
    """A 3-character stop string whose first two characters end one token and whose last starts the next,
    so a server must hold the first two back; and the index of its first occurrence."""
    for boundary in sorted(set(starts[1:]), key=lambda b: abs(b - len(text) // 2)):
        start = boundary - 2
        candidate = text[start : start + 3] if start >= 1 else ""
        if (
            len(candidate) == 3
            and candidate.strip()
            and _sendable(candidate)
            and text.find(candidate) == start
        ):
            return candidate, start
    return pick_stop_string(text)


@case(
    "STOP-1",
    tag="stop-string",
    requires=("stop_strings", "tokenize", DETERMINISTIC),
    sends=("generate.stop_strings=1",),
)
async def stop_string_hidden(ctx: Ctx) -> None:
    """Text that could still become the stop string is held back: the output's text is exactly the text
    before the match, with no part of the stop string (include_stop_in_output unset)."""
    learned = await learn(ctx)
    stop, start = pick_straddling_stop(learned.text, await token_starts(ctx, learned.token_ids))
    _, view = await rerun(ctx, stop_strings=[stop], ignore_eos=True)
    ctx.check.equal(
        f"text of an output stopped by {stop!r} (across a token boundary)", learned.text[:start], view.text
    )


@case(
    "STOP-1",
    tag="include",
    requires=("stop_strings", DETERMINISTIC),
    sends=("generate.include_stop+stop_strings",),
)
async def stop_string_included(ctx: Ctx) -> None:
    """With include_stop_in_output the text ends with the matched stop string."""
    learned = await learn(ctx)
    stop, _ = pick_stop_string(learned.text)
    _, view = await rerun(ctx, stop_strings=[stop], ignore_eos=True, include_stop=True)
    ctx.check.that(
        view.text.endswith(stop),
        f"text of an output stopped by {stop!r} (included)",
        f"ending with {stop!r}",
        view.text,
    )


@case(
    "STOP-1",
    tag="stop-token",
    requires=("stop_token_ids", "tokenize", DETERMINISTIC),
    sends=(
        "generate.skip_special_tokens=false",
        "detokenize.skip_special_tokens=false",
    ),
)
async def stop_token_hidden(ctx: Ctx) -> None:
    """The matched stop token's text is not in the output text; its id is (token ids are never removed)."""
    learned = await learn(ctx)
    token, k = pick_stop_token(learned.token_ids, ctx.info.eos_ids)
    _, view = await rerun(
        ctx, stop_token_ids=[token], ignore_eos=True, response=ResponseOptions(skip_special_tokens=False)
    )
    want = await ctx.detokenize(learned.token_ids[:k], False)
    ctx.check.equal(f"text of an output stopped by token {token}", want, view.text)
    ctx.check.equal("its token ids (the stop token included)", learned.token_ids[: k + 1], view.token_ids)


@case("STOP-2", requires=("stop_strings", DETERMINISTIC))
async def earliest_stop_string(ctx: Ctx) -> None:
    """The output ends at the earliest occurrence of any stop string; the text before it has none."""
    learned = await learn(ctx)
    early, p = pick_stop_string(learned.text)
    tail = learned.text[-2:]
    late = tail if tail.strip() and _sendable(tail) and learned.text.find(tail) > p else early
    _, view = await rerun(ctx, stop_strings=[late, early], ignore_eos=True)
    stop = _stop(view)
    ctx.check.equal("StopMatch.stop_string (the earliest match)", early, stop.stop_string if stop else None)
    ids = view.token_ids
    ctx.check.equal("token ids up to the earliest match", learned.token_ids[: len(ids)], ids)
    ctx.check.that(
        len(ids) < len(learned.token_ids),
        "the output",
        f"stopped before the end at {early!r}",
        f"{len(ids)} of {len(learned.token_ids)} tokens",
    )
    before = view.text.removesuffix(early)
    ctx.check.that(
        early not in before and late not in before,
        "text before the match",
        f"contains neither {early!r} nor {late!r}",
        before,
    )


@case("STOP-3", requires=("stop_token_ids", DETERMINISTIC), sends=("generate.stop_token_ids",))
async def stop_token_ends(ctx: Ctx) -> None:
    """The output ends at the first generated token that is a stop token."""
    learned = await learn(ctx)
    token, k = pick_stop_token(learned.token_ids, ctx.info.eos_ids)
    _, view = await rerun(ctx, stop_token_ids=[token], ignore_eos=True)
    stop = _stop(view)
    ctx.check.equal("token ids of an output with a stop token", learned.token_ids[: k + 1], view.token_ids)
    ctx.check.equal("StopMatch.stop_token_id", token, stop.stop_token_id if stop else None)


@dataclass(frozen=True, slots=True)
class EosRun:
    prompt: Prompt
    seed: int | None  # None: greedy
    learned: OutputView
    position: int  # index of the first EOS token in learned.token_ids


async def _search_eos(ctx: Ctx) -> EosRun | str:
    eos = set(ctx.info.eos_ids)
    prompts: list[Prompt] = ["Say hi.", "Emoji test 🙂🚀", PROMPT]
    if ctx.info.has("chat_input"):  # an instruct model ends its turn with an EOS token soon
        prompts = [
            ChatInput(messages=[ChatMessage("user", "Say hi.")]),
            ChatInput(messages=[ChatMessage("user", "Answer with one word: yes or no?")]),
            *prompts,
        ]
    seeds: list[int | None] = [None] if ctx.info.has("deterministic_greedy") else []
    seeds += list(range(1, 5)) if ctx.info.has("seeded_sampling") else []
    tried = 0
    for seed in seeds:
        for prompt in prompts:
            learned = await learn(ctx, prompt, seed)
            tried += 1
            for k, token in enumerate(learned.token_ids):
                if token in eos:
                    return EosRun(prompt, seed, learned, k)
    return f"no EOS token in {_length(ctx)} tokens of {tried} reproducible runs: cannot exercise it"


async def find_eos(ctx: Ctx) -> EosRun:
    """A prompt whose reproducible output contains an EOS token, and its first position (searched once per
    run, for every case that needs one); else SKIP."""

    async def search() -> EosRun | str:
        own = Ctx(ctx.session, "eos-search", {})
        try:
            return await _search_eos(own)
        finally:
            await own.close()

    found: EosRun | str = await ctx.session.shared("eos", search)
    if isinstance(found, str):
        raise CaseSkipped(found)
    return found


@case("STOP-4", tag="eos", requires=(DETERMINISTIC,))
async def eos_ends(ctx: Ctx) -> None:
    """Without ignore_eos an output ends at the first EOS token, reported as eos_token_id."""
    run = await find_eos(ctx)
    learned, k = run.learned, run.position
    _, view = await rerun(ctx, run.prompt, run.seed, response=ResponseOptions(skip_special_tokens=False))
    stop = _stop(view)
    ctx.check.equal("token ids up to the first EOS", learned.token_ids[: k + 1], view.token_ids)
    ctx.check.equal("StopMatch.eos_token_id", learned.token_ids[k], stop.eos_token_id if stop else None)
    eos_text = await ctx.detokenize([learned.token_ids[k]], False) if ctx.info.has("tokenize") else ""
    if eos_text:
        ctx.check.that(
            eos_text not in view.text,
            "text of an output ended by EOS (STOP-1)",
            f"without {eos_text!r}",
            view.text,
        )


@case("STOP-4", tag="ignore_eos", requires=(DETERMINISTIC,))
async def ignore_eos_continues(ctx: Ctx) -> None:
    """With ignore_eos an EOS token never ends an output."""
    run = await find_eos(ctx)
    learned, k = run.learned, run.position
    ctx.check.that(
        len(learned.token_ids) == _length(ctx)
        and learned.finish is not None
        and learned.finish.reason == FinishReason.LENGTH,
        f"an ignore_eos output with an EOS at position {k}",
        f"LENGTH after {_length(ctx)} tokens",
        f"{learned.finish.reason.name if learned.finish else '-'} after {len(learned.token_ids)}",
    )


@case("FINISH-5", tag="stop-token-is-eos", requires=("stop_token_ids", DETERMINISTIC))
async def stop_token_wins_over_eos(ctx: Ctx) -> None:
    """A token that is both a requested stop token and an EOS token reports stop_token_id."""
    run = await find_eos(ctx)
    token = run.learned.token_ids[run.position]
    _, view = await rerun(ctx, run.prompt, run.seed, stop_token_ids=[token])
    stop = _stop(view)
    ctx.check.that(
        stop is not None and stop.stop_token_id == token,
        "StopMatch of an EOS that is also a stop token",
        f"stop_token_id={token}",
        stop,
    )


@case("STOP-5", requires=("stop_token_ids", DETERMINISTIC), sends=("generate.min_tokens",))
async def min_tokens_first(ctx: Ctx) -> None:
    """No stop condition ends an output before it has min_tokens tokens."""
    learned = await learn(ctx)
    token, k = pick_stop_token(learned.token_ids, ctx.info.eos_ids)
    minimum = min(k + 3, _length(ctx))
    _, view = await rerun(ctx, stop_token_ids=[token], min_tokens=minimum, ignore_eos=True)
    ctx.check.that(
        len(view.token_ids) >= minimum,
        f"tokens of an output with min_tokens={minimum} and a stop token at {k}",
        f">= {minimum}",
        len(view.token_ids),
    )
    ctx.check.that(  # suppressed, not merely ignored: it is never sampled before min_tokens
        token not in view.token_ids[:minimum],
        f"the first {minimum} tokens (min_tokens) of an output with stop token {token}",
        f"without {token}",
        view.token_ids[:minimum],
    )


@case("FINISH-6", tag="ignore_eos", sends=("generate.ignore_eos",))
async def length_after_max_tokens(ctx: Ctx) -> None:
    """With ignore_eos and no stop conditions every output ends LENGTH after exactly max_tokens tokens."""
    n = min(ctx.info.caps.max_outputs, 2)
    record = ok(ctx, await ctx.generate(request(ctx, PROMPT, ignore_eos=True, n=n, temperature=1.0)))
    for view in record.outputs().values():
        finish = view.finish
        ctx.check.that(
            finish is not None
            and finish.reason == FinishReason.LENGTH
            and finish.completion_tokens == ctx.tuning.max_tokens,
            f"output {view.index}",
            f"LENGTH after max_tokens={ctx.tuning.max_tokens}",
            f"{finish.reason.name} after {finish.completion_tokens}" if finish else "no finish",
        )


@case(
    "STOP-2", tag="later-entry", requires=("stop_strings", DETERMINISTIC), sends=("generate.stop_strings>1",)
)
async def later_stop_string(ctx: Ctx) -> None:
    """The stop string that matches may be any entry of the list, the last one included."""
    learned = await learn(ctx)
    stop, start = pick_stop_string(learned.text)
    absent = [f"\u2603{i}\u2603" for i in range(2)]
    strings = [*absent, stop][: max(ctx.info.caps.max_stop_strings, 1)]
    if stop not in strings:
        raise CaseSkipped(
            f"max_stop_strings={ctx.info.caps.max_stop_strings} leaves no room for a later entry"
        )
    _, view = await rerun(ctx, stop_strings=strings, ignore_eos=True)
    match = _stop(view)
    ctx.check.equal(
        f"StopMatch.stop_string with stop_strings={strings}", stop, match.stop_string if match else None
    )
    ctx.check.equal("text before the match", learned.text[:start], view.text)


@case(
    "STOP-5",
    tag="no-max-tokens",
    requires=("stop_token_ids", DETERMINISTIC),
    sends=("generate.min_tokens-without-max_tokens",),
)
async def min_tokens_without_max_tokens(ctx: Ctx) -> None:
    """min_tokens holds also when max_tokens is absent (the default applies to max_tokens only)."""
    learned = await learn(ctx)
    token, k = pick_stop_token(learned.token_ids, ctx.info.eos_ids)
    minimum = k + 3
    req = _pin(ctx, request(ctx, PROMPT, stop_token_ids=[token], min_tokens=minimum, ignore_eos=True))
    assert req.stopping is not None
    req.stopping.max_tokens = None
    view = ok(ctx, await ctx.generate(req, total_s=4 * ctx.budgets.stream_s)).outputs()[0]
    ctx.check.that(
        len(view.token_ids) >= minimum,
        f"tokens of an output with min_tokens={minimum}, no max_tokens, and a stop token at {k}",
        f">= {minimum}",
        len(view.token_ids),
    )


@case("STOP-6", tag="inside-token", requires=("stop_strings", "tokenize", DETERMINISTIC))
async def stop_inside_token(ctx: Ctx) -> None:
    """A stop string that ends inside a token's text: the rest of that token's text is never sent; the
    token is (include_stop_in_output set: the text ends exactly with the stop string)."""
    learned = await learn(ctx)
    starts = await token_starts(ctx, learned.token_ids)
    text = learned.text
    for k in range(1, len(starts)):
        end = starts[k + 1] if k + 1 < len(starts) else len(text)
        piece = text[starts[k] : end]
        stop = piece[:2]
        if len(piece) >= 3 and stop.strip() and _sendable(piece) and text.find(stop) == starts[k]:
            break
    else:
        raise CaseSkipped(f"no token of the learned output {text!r} holds 3 or more characters to cut inside")
    _, view = await rerun(ctx, stop_strings=[stop], ignore_eos=True, include_stop=True)
    ctx.check.equal(
        f"text of an output stopped by {stop!r} inside token {k} ({piece!r})",
        text[: starts[k] + 2],
        view.text,
    )
    ctx.check.equal("its token ids (the whole token included)", learned.token_ids[: k + 1], view.token_ids)


@case(
    "STOP-7",
    tag="stop-token",
    requires=("stop_token_ids", "tokenize", DETERMINISTIC),
    sends=("generate.include_stop+stop_token_ids",),
)
async def stop_token_included(ctx: Ctx) -> None:
    """With include_stop_in_output a stop token's text is in the output text, as Detokenize renders it."""
    learned = await learn(ctx)
    token, k = pick_stop_token(learned.token_ids, ctx.info.eos_ids)
    _, view = await rerun(ctx, stop_token_ids=[token], ignore_eos=True, include_stop=True)
    want = await ctx.detokenize(learned.token_ids[: k + 1])
    ctx.check.equal(f"text of an output stopped by token {token}, included", want, view.text)


@case("STOP-7", tag="eos", requires=("tokenize", DETERMINISTIC), sends=("generate.include_stop+eos",))
async def eos_included(ctx: Ctx) -> None:
    """With include_stop_in_output an EOS token's text is included exactly as skip_special_tokens renders
    it: its text with skip_special_tokens=false, nothing with the default (true)."""
    run = await find_eos(ctx)
    ids = run.learned.token_ids[: run.position + 1]
    for skip in (False, None):
        response = ResponseOptions(skip_special_tokens=skip)
        _, view = await rerun(ctx, run.prompt, run.seed, include_stop=True, response=response)
        want = await ctx.detokenize(ids, skip)
        ctx.check.equal(
            f"text of an output ended by EOS, included, skip_special_tokens={skip}", want, view.text
        )


@case("SAMPLE-8", tag="skip_special_tokens", requires=("tokenize", DETERMINISTIC))
async def skip_special_default(ctx: Ctx) -> None:
    """skip_special_tokens absent means true: an EOS token generated under ignore_eos adds no text."""
    run = await find_eos(ctx)
    _, view = await rerun(ctx, run.prompt, run.seed, ignore_eos=True)
    ctx.check.equal(
        "text of an output with an EOS token inside, skip_special_tokens absent",
        await ctx.detokenize(view.token_ids, True),
        view.text,
    )


@case("FINISH-6", tag="stop-at-max-tokens", requires=("stop_token_ids", DETERMINISTIC))
async def stop_beats_length(ctx: Ctx) -> None:
    """A token that is a stop token and reaches max_tokens ends the output STOP, not LENGTH."""
    learned = await learn(ctx)
    token, k = pick_stop_token(learned.token_ids, ctx.info.eos_ids)
    record = ok(
        ctx,
        await ctx.generate(
            _pin(ctx, request(ctx, PROMPT, max_tokens=k + 1, stop_token_ids=[token], ignore_eos=True))
        ),
    )
    view = record.outputs()[0]
    finish = view.finish
    ctx.check.equal(
        f"(reason, stop_token_id, tokens) when token {token} is the {k + 1}th and max_tokens={k + 1}",
        ("STOP", token, k + 1),
        (finish.reason.name, finish.stop.stop_token_id if finish.stop else None, finish.completion_tokens)
        if finish
        else None,
    )


@case(
    "STOP-2",
    tag="before-min-tokens",
    requires=("stop_strings", "tokenize", DETERMINISTIC),
    sends=("scenario.stop-before-min-tokens",),
)
async def stop_string_before_min_tokens(ctx: Ctx) -> None:
    """A stop-string occurrence completed before the min_tokens-th token is ordinary text: the output
    ends at the first occurrence completed later (or runs to max_tokens)."""
    learned = await learn(ctx)
    stop, start = pick_stop_string(learned.text)
    starts = await token_starts(ctx, learned.token_ids)
    completing = next((k for k, s in enumerate(starts) if s >= start + len(stop)), len(starts)) - 1
    minimum = completing + 2  # the first occurrence is completed by token `completing` (0-based)
    if minimum >= len(learned.token_ids):
        raise CaseSkipped(f"the first {stop!r} is completed by the last learned token; nothing to compare")
    _, view = await rerun(ctx, stop_strings=[stop], min_tokens=minimum, ignore_eos=True)
    before_min = await ctx.detokenize(learned.token_ids[: minimum - 1])
    match = first_stop_match(learned.text, (stop,), len(before_min))
    want = learned.text[: match[0]] if match else learned.text
    ctx.check.equal(
        f"text of an output with stop {stop!r} first completed by token {completing} and min_tokens={minimum}",
        want,
        view.text,
    )
