"""Learning a reproducible output first, so that stop cases can stop it where a string or token is known
to occur: the learned run, reruns with stop conditions, and picking what to stop at."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conformance.cases._helpers import ok
from conformance.harness.context import Ctx
from conformance.harness.requests import request
from conformance.stream.record import OutputView, StreamRecord
from conformance.vocabulary import CaseSkipped
from lmrpc.v1 import ChatInput, ChatMessage, GenerateRequest, StopMatch

DETERMINISTIC = "deterministic_greedy|seeded_sampling"

PROMPT = "Once upon a time"


def pin(ctx: Ctx, req: GenerateRequest, seed: int | None = None) -> GenerateRequest:
    """Make ``req`` reproducible: greedy, or seeded (given a seed, or where greedy is not promised)."""
    assert req.sampling is not None
    if seed is None and ctx.info.has("deterministic_greedy"):
        req.sampling.temperature = 0.0
    else:
        req.sampling.temperature, req.sampling.seed = 1.0, 4242 if seed is None else seed
    return req


def learned_length(ctx: Ctx) -> int:
    return max(2 * ctx.tuning.max_tokens, 16)


Prompt = str | ChatInput


def prompted(ctx: Ctx, prompt: Prompt, **kw: Any) -> GenerateRequest:
    if isinstance(prompt, str):
        return request(ctx, prompt, **kw)
    req = request(ctx, **kw)
    req.text, req.chat = None, prompt
    return req


async def learn(ctx: Ctx, prompt: Prompt = PROMPT, seed: int | None = None) -> OutputView:
    """Output 0 of a reproducible run with ignore_eos (the reference the stop runs are compared with)."""
    req = pin(ctx, prompted(ctx, prompt, max_tokens=learned_length(ctx), ignore_eos=True), seed)
    return ok(ctx, await ctx.generate(req)).outputs()[0]


async def rerun(
    ctx: Ctx, prompt: Prompt = PROMPT, seed: int | None = None, **kw: Any
) -> tuple[StreamRecord, OutputView]:
    record = ok(
        ctx, await ctx.generate(pin(ctx, prompted(ctx, prompt, max_tokens=learned_length(ctx), **kw), seed))
    )
    return record, record.outputs()[0]


def sendable(text: str) -> bool:
    """Text that can go into a request: no U+FFFD and no undecodable bytes (surrogate escapes)."""
    return "\ufffd" not in text and not any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def pick_stop_string(text: str) -> tuple[str, int]:
    """A 2-character stop string from the middle of ``text`` and the index of its first occurrence."""
    for start in list(range(len(text) // 2, len(text) - 1)) + list(range(1, len(text) // 2)):
        candidate = text[start : start + 2]
        if candidate.strip() and sendable(candidate) and text.find(candidate) >= 1:
            return candidate, text.find(candidate)
    raise CaseSkipped(f"no usable stop string in the learned output {text!r}")


def pick_stop_token(ids: list[int], avoid: list[int]) -> tuple[int, int]:
    """A token of ``ids`` and the index of its first occurrence (not the first token, not an EOS)."""
    for k in list(range(len(ids) // 2, len(ids))) + list(range(1, len(ids) // 2)):
        if ids[k] not in avoid and ids.index(ids[k]) == k:
            return ids[k], k
    raise CaseSkipped(f"no usable stop token in the learned output {ids}")


def stop_of(view: OutputView) -> StopMatch | None:
    return view.finish.stop if view.finish else None


async def token_starts(ctx: Ctx, ids: list[int]) -> list[int]:
    """The character offset in Detokenize(ids) at which each token's text starts (needs Tokenize)."""
    return [len(await ctx.detokenize(ids[:k])) for k in range(len(ids))]


# Byte-level vocabularies put a space and the first bytes of the next character in one token.
MULTIBYTE_PROMPT = "新 新 新 新 新 新 新 新"


def stop_before_multibyte(text: str) -> tuple[str, int] | None:
    """A stop string that ends where a multi-byte character starts and first occurs there (not at 0),
    and that index: in byte-level vocabularies its last character shares a token with the first
    bytes of that character, for servers that match stop strings on text they decode."""
    for end in range(1, len(text) - 1):
        if text[end].isascii() and not text[end + 1].isascii():
            for start in range(end, 0, -1):
                candidate = text[start : end + 1]
                if sendable(candidate) and text.find(candidate) == start:
                    return candidate, start
    return None


async def pick_stop_before_split(ctx: Ctx, learned: OutputView) -> tuple[str, int]:
    """A stop string completed by a token whose text ends inside the next character (in byte-level
    vocabularies, a space and the first bytes of a multi-byte character), and the index of its first
    occurrence: a server that looks for stop strings only in the text a character's last token adds
    misses it."""
    ids, text = learned.token_ids, learned.text
    whole_before = ""
    for k in range(1, len(ids) + 1):
        decoded = await ctx.detokenize(ids[:k])
        whole = decoded.rstrip("\ufffd")
        if decoded != whole and len(whole) > len(whole_before) and whole[-1].isascii():
            end = len(whole) - 1
            for start in range(end, 0, -1):
                candidate = text[start : end + 1]
                if sendable(candidate) and text.find(candidate) == start:
                    return candidate, start
        whole_before = whole
    raise CaseSkipped(f"no token of the learned output {text!r} ends inside a character after a stop string")


def pick_straddling_stop(text: str, starts: list[int]) -> tuple[str, int]:
    """A 3-character stop string whose first two characters end one token and whose last starts the next,
    so a server must hold the first two back; and the index of its first occurrence."""
    for boundary in sorted(set(starts[1:]), key=lambda b: abs(b - len(text) // 2)):
        start = boundary - 2
        candidate = text[start : start + 3] if start >= 1 else ""
        if (
            len(candidate) == 3
            and candidate.strip()
            and sendable(candidate)
            and text.find(candidate) == start
        ):
            return candidate, start
    return pick_stop_string(text)


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
    return f"no EOS token in {learned_length(ctx)} tokens of {tried} reproducible runs: cannot exercise it"


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
