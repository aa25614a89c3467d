"""Stop strings: a choice ends at the first occurrence of any of its stop strings and its text is the
greedy text cut where that occurrence starts (STOP-2), also when it ends where a multi-byte character
starts or starts inside a token (STOP-6), and it ends ``stop`` (FINISH-5). Streamed and not; the
greedy text without stop is the oracle, so these cases need greedy decoding to repeat."""

from __future__ import annotations

from conformance.cases.openai._common import answered, apis, make, openai_case, support
from conformance.drivers.openai.exchange import Api, OpenAIRequest
from conformance.harness.context import Ctx
from conformance.spec.registry import Variant
from conformance.vocabulary import CaseSkipped

STOP_PROMPT = "Once upon a time"
TEXT_TOKENS = 24
NO_MATCH = "\u2603zq\u2603"  # a stop string no output of these prompts contains
# Byte-level vocabularies put a space and the first bytes of the next character in one token, whose
# text is whole only once a later token ends the character: a server that looks for stop strings
# only in the newest token's text misses the space.
MULTIBYTE_PROMPT = "新 新 新 新 新 新 新 新"
MULTIBYTE_PROMPTS = (MULTIBYTE_PROMPT, f"Repeat exactly: {MULTIBYTE_PROMPT}")  # a chat model may not echo


def word_start(text: str) -> str | None:
    """A stop string that starts a word after the first character of ``text`` and first occurs there."""
    for i in range(1, len(text) - 3):
        if text[i] == " " and text[i + 1].isalpha():
            candidate = text[i : i + 4]
            if text.find(candidate) == i:
                return candidate
    return None


def inside_word(text: str) -> str | None:
    """A stop string that starts inside a word (inside a token, for most vocabularies)."""
    for i in range(1, len(text) - 2):
        if text[i - 1].isalpha() and text[i].isalpha() and text[i + 1].isalpha():
            candidate = text[i : i + 2]
            if text.find(candidate) == i:
                return candidate
    return None


def before_multibyte(text: str) -> str | None:
    """A stop string that ends where a multi-byte character starts and first occurs there, after the
    first character of ``text``."""
    for end in range(1, len(text) - 1):
        if text[end].isascii() and not text[end + 1].isascii():
            for start in range(end, 0, -1):
                if text.find(text[start : end + 1]) == start:
                    return text[start : end + 1]
    return None


async def greedy_text(ctx: Ctx, api: Api, prompt: str = STOP_PROMPT) -> str:
    answer = await answered(
        ctx, make(api, prompt, temperature=0, max_tokens=TEXT_TOKENS), "greedy without stop"
    )
    return answer.view.texts().get(0, "")


async def expect_cut(
    ctx: Ctx,
    api: Api,
    stops: list[str],
    text: str,
    *,
    finish_only: bool = False,
    prompt: str = STOP_PROMPT,
) -> None:
    start = min(p for p in (text.find(s) for s in stops) if p >= 0)
    base = make(api, prompt, temperature=0, max_tokens=TEXT_TOKENS, stop=stops)
    variants: list[tuple[str, OpenAIRequest]] = [("", base)]
    if support(ctx).has(api, "stream"):
        variants.append((" streamed", base.with_body(stream=True)))
    for how, request in variants:
        choice = (await answered(ctx, request)).view.choices.get(0)
        got_text, got_finish = (choice.text, choice.finish) if choice else ("(no choice 0)", None)
        what = f"{api}{how} stop={stops} (greedy text {text!r})"
        if not finish_only:
            ctx.check.equal(f"{what}: the text", text[:start], got_text)
        ctx.check.equal(f"{what}: finish_reason", "stop", got_finish)


STOP_VARIANTS = [
    Variant({"kind": "word"}, tag="word"),
    Variant({"kind": "later-entry"}, tag="later-entry"),
    Variant({"kind": "before-multibyte"}, tag="before-multibyte"),
]


@openai_case("STOP-2", variants=STOP_VARIANTS, exclusive=True)
async def first_occurrence(ctx: Ctx) -> None:
    """A choice ends where the first occurrence of a stop string (the only one, a later entry of the
    list, or one that ends where a multi-byte character starts) starts in the greedy text, streamed
    and not."""
    support(ctx).need_determinism()
    kind = ctx.params["kind"]
    prompts = MULTIBYTE_PROMPTS if kind == "before-multibyte" else (STOP_PROMPT,)
    unplaced = []
    for api in apis(ctx, "stop"):
        for prompt in prompts:
            text = await greedy_text(ctx, api, prompt)
            stop = before_multibyte(text) if kind == "before-multibyte" else word_start(text)
            if stop is not None:
                stops = [NO_MATCH, stop] if kind == "later-entry" else [stop]
                await expect_cut(ctx, api, stops, text, prompt=prompt)
                break
        else:
            unplaced.append(f"{api}: {text!r}")
    if len(unplaced) == len(apis(ctx, "stop")):
        raise CaseSkipped(f"no greedy text has a place for a {kind} stop ({'; '.join(unplaced)})")
    if unplaced:
        ctx.note(f"not checked, no place for a {kind} stop: {'; '.join(unplaced)}")


@openai_case("STOP-6", exclusive=True)
async def stop_inside_a_token(ctx: Ctx) -> None:
    """A stop string that starts inside a word cuts the text exactly where it starts: the rest of
    that token's text is dropped."""
    support(ctx).need_determinism()
    for api in apis(ctx, "stop"):
        text = await greedy_text(ctx, api)
        stop = inside_word(text)
        if stop is None:
            raise CaseSkipped(f"the greedy text {text!r} has no word to stop inside")
        await expect_cut(ctx, api, [stop], text)


@openai_case("FINISH-5", exclusive=True)
async def stop_reads_stop(ctx: Ctx) -> None:
    """A choice that ended at a stop string reads finish_reason ``stop``."""
    support(ctx).need_determinism()
    for api in apis(ctx, "stop"):
        text = await greedy_text(ctx, api)
        stop = word_start(text) or inside_word(text)
        if stop is None:
            raise CaseSkipped(f"the greedy text {text!r} has nothing to stop at")
        await expect_cut(ctx, api, [stop], text, finish_only=True)
