"""Stop strings (STOP-1, STOP-2, STOP-6): learn a reproducible output first, then stop it at a string
known to occur and check exactly where and how it ends."""

from __future__ import annotations

from conformance.cases._helpers import ok
from conformance.cases._learned import (
    DETERMINISTIC,
    MULTIBYTE_PROMPT,
    learn,
    pick_stop_before_split,
    pick_stop_string,
    pick_straddling_stop,
    pin,
    prompted,
    rerun,
    sendable,
    stop_of,
    token_starts,
)
from conformance.harness.context import Ctx
from conformance.spec.registry import case
from conformance.stream.record import OutputView
from conformance.validators.base import first_stop_match
from conformance.vocabulary import CaseSkipped
from lmrpc.v1 import FinishReason


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


@case("STOP-2", requires=("stop_strings", DETERMINISTIC))
async def earliest_stop_string(ctx: Ctx) -> None:
    """The output ends at the earliest occurrence of any stop string; the text before it has none."""
    learned = await learn(ctx)
    early, p = pick_stop_string(learned.text)
    tail = learned.text[-2:]
    late = tail if tail.strip() and sendable(tail) and learned.text.find(tail) > p else early
    _, view = await rerun(ctx, stop_strings=[late, early], ignore_eos=True)
    stop = stop_of(view)
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


@case(
    "STOP-2",
    tag="before-multibyte",
    requires=("stop_strings", "tokenize", DETERMINISTIC),
    sends=("generate.stop_strings=1",),
)
async def stop_string_before_a_split_character(ctx: Ctx) -> None:
    """A stop string completed by a token whose text ends inside a character is found once a later
    token ends that character: the output's text is the text before its first occurrence."""
    learned = await learn(ctx, MULTIBYTE_PROMPT)
    stop, start = await pick_stop_before_split(ctx, learned)
    _, view = await rerun(ctx, MULTIBYTE_PROMPT, stop_strings=[stop], ignore_eos=True)
    ctx.check.equal(
        f"text of an output stopped by {stop!r} (completed by a token that ends inside a character)",
        learned.text[:start],
        view.text,
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
    match = stop_of(view)
    ctx.check.equal(
        f"StopMatch.stop_string with stop_strings={strings}", stop, match.stop_string if match else None
    )
    ctx.check.equal("text before the match", learned.text[:start], view.text)


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


async def _cut_inside_a_token(ctx: Ctx) -> tuple[OutputView, list[int], int, str]:
    """The learned output, its tokens' text starts, a token k of 3 or more characters and the stop string
    made of its first two (first found at the token's start)."""
    learned = await learn(ctx)
    starts = await token_starts(ctx, learned.token_ids)
    text = learned.text
    for k in range(1, len(starts)):
        end = starts[k + 1] if k + 1 < len(starts) else len(text)
        piece = text[starts[k] : end]
        stop = piece[:2]
        if len(piece) >= 3 and stop.strip() and sendable(piece) and text.find(stop) == starts[k]:
            return learned, starts, k, stop
    raise CaseSkipped(f"no token of the learned output {text!r} holds 3 or more characters to cut inside")


@case("STOP-6", tag="inside-token", requires=("stop_strings", "tokenize", DETERMINISTIC))
async def stop_inside_token(ctx: Ctx) -> None:
    """A stop string that ends inside a token's text: the rest of that token's text is never sent; the
    token is (include_stop_in_output set: the text ends exactly with the stop string)."""
    learned, starts, k, stop = await _cut_inside_a_token(ctx)
    _, view = await rerun(ctx, stop_strings=[stop], ignore_eos=True, include_stop=True)
    ctx.check.equal(
        f"text of an output stopped by {stop!r} inside token {k}", learned.text[: starts[k] + 2], view.text
    )
    ctx.check.equal("its token ids (the whole token included)", learned.token_ids[: k + 1], view.token_ids)


@case("STOP-6", tag="inside-token-excluded", requires=("stop_strings", "tokenize", DETERMINISTIC))
async def stop_inside_token_excluded(ctx: Ctx) -> None:
    """A stop string that starts a token's text and ends inside it, not included: the text ends where the
    token's text starts, and the token is still delivered and counted in completion_tokens."""
    learned, starts, k, stop = await _cut_inside_a_token(ctx)
    _, view = await rerun(ctx, stop_strings=[stop], ignore_eos=True)
    ctx.check.equal(
        f"text of an output stopped by {stop!r} inside token {k}", learned.text[: starts[k]], view.text
    )
    ctx.check.equal("its token ids (the whole token included)", learned.token_ids[: k + 1], view.token_ids)
    finish = view.finish
    ctx.check.equal(
        "OutputFinished.completion_tokens (the cut token counted)",
        k + 1,
        finish.completion_tokens if finish else None,
    )


async def _cut_inside_a_character(
    ctx: Ctx, prompt: str, *, after_a_character: bool = False
) -> tuple[int, str]:
    """k and the text of the first k learned tokens, where the k-th token ends inside a character (the text
    ends with one U+FFFD and holds no other; ``after_a_character``: after a whole visible character)."""
    learned = await learn(ctx, prompt)
    if "\ufffd" in learned.text:
        raise CaseSkipped("the learned output holds U+FFFD of its own (not UTF-8)")
    ids = learned.token_ids
    for k in range(1, len(ids)):
        text = await ctx.detokenize(ids[:k])
        if text.endswith("\ufffd") and "\ufffd" not in text.rstrip("\ufffd"):
            if not after_a_character or (len(text) >= 2 and text[-2].strip()):
                return k, text
    raise CaseSkipped("no token of the learned output ends inside a character")


CUT_CHARACTERS = (
    "🙂🚀🎉 日本語"  # a model that echoes its prompt sends multi-byte characters split across tokens
)


@case(
    "STOP-2",
    tag="incomplete-end",
    requires=("stop_strings", "tokenize", DETERMINISTIC),
    sends=("scenario.stop-string-fffd-at-end",),
)
async def no_stop_in_the_final_fffd(ctx: Ctx) -> None:
    """An output cut by max_tokens inside a character ends its text with U+FFFD (STREAM-4); that U+FFFD
    exists only once the output has ended, so the stop string "\ufffd" does not match it."""
    k, text = await _cut_inside_a_character(ctx, CUT_CHARACTERS)
    req = pin(ctx, prompted(ctx, CUT_CHARACTERS, max_tokens=k, stop_strings=["\ufffd"], ignore_eos=True))
    view = ok(ctx, await ctx.generate(req)).outputs()[0]
    ctx.check.equal(
        f"finish of an output cut inside a character by max_tokens={k}, with stop string U+FFFD",
        FinishReason.LENGTH,
        view.finish.reason if view.finish else None,
    )
    ctx.check.equal("its text (ending with the U+FFFD of the cut character)", text, view.text)


@case(
    "STOP-2",
    tag="incomplete-end-suffix",
    requires=("stop_strings", "tokenize", DETERMINISTIC),
    sends=("scenario.stop-string-fffd-at-end",),
)
async def no_stop_across_the_final_fffd(ctx: Ctx) -> None:
    """A stop string made of the last whole character and the U+FFFD that the cut adds does not match the
    end of an output cut inside a character either: the output ends LENGTH and its U+FFFD is sent."""
    k, text = await _cut_inside_a_character(ctx, CUT_CHARACTERS, after_a_character=True)
    stop = text[-2:]
    req = pin(ctx, prompted(ctx, CUT_CHARACTERS, max_tokens=k, stop_strings=[stop], ignore_eos=True))
    view = ok(ctx, await ctx.generate(req)).outputs()[0]
    ctx.check.equal(
        f"(finish, text) of an output cut inside a character by max_tokens={k}, with stop string {stop!r}",
        ("LENGTH", text),
        (view.finish.reason.name if view.finish else None, view.text),
    )
