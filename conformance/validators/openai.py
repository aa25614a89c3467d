"""The OpenAI profile's answer checks: pure functions of one answer (the exchange and its view) to
mismatches, one clause each, run on every answer of the pool (cases/openai/pool.py) and by the cases
that make answers of their own. Each judges only its clause, so one fault fails the clause it breaks.

Token counts come from what the answer itself shows: a choice's ``logprobs`` entries (one per
token), or ``max_tokens`` for a choice that ended ``length`` (FINISH-6 keeps that honest), or the
usage of a one-choice answer.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

from conformance.drivers.openai.exchange import End, Exchange, OpenAIRequest
from conformance.drivers.openai.view import FINISH_REASONS, ChoiceView, CompletionView, TokenEntry, view_of
from conformance.vocabulary import Mismatch, mismatch

LOGPROB_SLACK = 1e-4  # servers round logprobs to a few digits


@dataclass(frozen=True, slots=True)
class Answer:
    exchange: Exchange
    view: CompletionView

    @staticmethod
    def of(exchange: Exchange) -> Answer:
        return Answer(exchange, view_of(exchange))

    @property
    def request(self) -> OpenAIRequest:
        assert self.exchange.request is not None
        return self.exchange.request

    @property
    def ok(self) -> bool:
        """An HTTP 200 answer read to its end (what the structural checks judge)."""
        return self.exchange.status == 200 and self.exchange.end is End.OK


Check = Callable[[Answer], list[Mismatch]]
CHECKS: dict[str, Check] = {}


def check(clause: str) -> Callable[[Check], Check]:
    def register(fn: Check) -> Check:
        CHECKS[clause] = fn
        return fn

    return register


def judge(answer: Answer, clauses: list[str]) -> list[Mismatch]:
    return [m for clause in clauses for m in CHECKS[clause](answer)]


def usage_numbers(usage: object) -> tuple[int, int, int] | None:
    """(prompt, completion, total) when ``usage`` has the three as integers."""
    if not isinstance(usage, dict):
        return None
    values = [usage.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")]
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return values[0], values[1], values[2]  # type: ignore[return-value]
    return None


def choice_tokens(answer: Answer, choice: ChoiceView) -> int | None:
    """How many tokens the choice has, as far as the answer shows it without trusting the count
    being judged: ``max_tokens`` for a choice that ended ``length`` (FINISH-6 keeps that honest),
    the usage of a one-choice answer; else unknown (``logprobs`` entries are STREAM-7's to judge)."""
    request = answer.request
    if choice.finish == "length" and request.max_tokens is not None:
        return request.max_tokens
    numbers = usage_numbers(answer.view.usage)
    if request.n == 1 and numbers is not None:
        return numbers[1]
    return None


def _where(answer: Answer) -> str:
    request = answer.request
    return f"{request.api}{' stream' if answer.view.streamed else ''} n={request.n}"


@check("REQ-2")
def ids_and_objects(answer: Answer) -> list[Mismatch]:
    if not answer.ok:
        return []
    view, request = answer.view, answer.request
    out = []
    ids = set(map(repr, view.ids))
    if len(ids) != 1 or not all(isinstance(i, str) and i for i in view.ids):
        out.append(mismatch(f"{_where(answer)}: the id of every chunk", "one non-empty string", sorted(ids)))
    if request.api == "chat":
        want = "chat.completion.chunk" if view.streamed else "chat.completion"
    else:
        want = "text_completion"
    objects = sorted(set(map(repr, view.objects)))
    if objects != [repr(want)]:
        out.append(mismatch(f"{_where(answer)}: object", repr(want), objects))
    return out


@check("STREAM-1")
def role_first(answer: Answer) -> list[Mismatch]:
    if not answer.ok or answer.request.api != "chat":
        return []
    out = []
    for index, choice in sorted(answer.view.choices.items()):
        roles = choice.roles
        if not roles or roles[0] != (0, "assistant"):
            out.append(
                mismatch(
                    f"{_where(answer)}: choice {index}'s first chunk",
                    "role assistant",
                    roles[:3] or "no role",
                )
            )
            continue
        # a later chunk may repeat the role (TGI sends `assistant` on every chunk), never change it
        others = [(number, role) for number, role in roles[1:] if role != "assistant"]
        if others:
            out.append(
                mismatch(
                    f"{_where(answer)}: choice {index}'s roles after its first chunk",
                    "assistant again or none",
                    others[:5],
                )
            )
    return out


@check("STREAM-3")
def indices_in_range(answer: Answer) -> list[Mismatch]:
    if not answer.ok:
        return []
    n = answer.request.n
    out = [
        mismatch(f"{_where(answer)}: choice index", f"an integer in [0, {n})", bad)
        for bad in answer.view.bad_indices[:3]
    ]
    beyond = sorted(i for i in answer.view.choices if i >= n)
    if beyond:
        out.append(mismatch(f"{_where(answer)}: choice indices", f"in [0, {n})", beyond))
    return out


@check("N-1")
def every_index_once(answer: Answer) -> list[Mismatch]:
    if not answer.ok:
        return []
    n, view = answer.request.n, answer.view
    out = []
    if sorted(view.choices) != list(range(n)):
        out.append(mismatch(f"{_where(answer)}: choice indices", list(range(n)), sorted(view.choices)))
    if not view.streamed and answer.exchange.json() is not None:
        raw = answer.exchange.json().get("choices") if isinstance(answer.exchange.json(), dict) else None
        indices = [c.get("index") for c in raw if isinstance(c, dict)] if isinstance(raw, list) else []
        if len(indices) != len(set(map(repr, indices))):
            out.append(mismatch(f"{_where(answer)}: choices", "each index once", indices))
    return out


@check("FINISH-1")
def one_finish(answer: Answer) -> list[Mismatch]:
    if not answer.ok:
        return []
    out = []
    ended_by_error = bool(answer.view.error_events)  # an error event ends a stream without finishes (ERR-2)
    for index, choice in sorted(answer.view.choices.items()):
        if len(choice.finishes) > 1 or (not choice.finishes and not ended_by_error):
            out.append(
                mismatch(
                    f"{_where(answer)}: choice {index}'s finish_reason values", "exactly one", choice.finishes
                )
            )
        if choice.after_finish:
            out.append(
                mismatch(
                    f"{_where(answer)}: content of choice {index} after its finish",
                    "none",
                    choice.after_finish[:3],
                )
            )
    return out


@check("ERR-1")
def answered_or_refused(answer: Answer) -> list[Mismatch]:
    """A request drawn from what the server supports is answered, or, as a combination it does not
    serve, refused as OpenAI refuses: a 4xx with an error object. Never a 5xx, nor no answer."""
    exchange = answer.exchange
    if exchange.status == 200 and answer.view.error_events:
        return [
            mismatch(
                f"{_where(answer)}: a valid request's stream",
                "answered to its end, with no error event",
                answer.view.error_events[:1],
            )
        ]
    if exchange.status == 200 or (400 <= exchange.status < 500 and exchange.error_object() is not None):
        return []
    got = exchange.summary() + (f": {exchange.text[:200]}" if exchange.text else "")
    return [mismatch(f"{_where(answer)}: the answer", "HTTP 200, or a 4xx with an error object", got)]


@check("FINISH-3")
def done_ends(answer: Answer) -> list[Mismatch]:
    exchange, view = answer.exchange, answer.view
    if exchange.status != 200:
        return []
    if not view.streamed:
        if exchange.end is not End.OK or not isinstance(exchange.json(), dict):
            return [mismatch(f"{_where(answer)}: the body", "one complete JSON object", exchange.summary())]
        return []
    out = []
    if not view.done and not view.error_events:
        out.append(
            mismatch(
                f"{_where(answer)}: the stream's end", "data: [DONE]", f"{exchange.summary()}, no [DONE]"
            )
        )
    if view.events_after_done:
        out.append(mismatch(f"{_where(answer)}: events after [DONE]", 0, view.events_after_done))
    if view.unparsable or view.not_objects:
        out.append(
            mismatch(
                f"{_where(answer)}: event data",
                "JSON objects and [DONE]",
                view.unparsable[:3] or f"{view.not_objects} non-objects",
            )
        )
    return out


@check("ERR-2")
def no_silent_truncation(answer: Answer) -> list[Mismatch]:
    exchange, view = answer.exchange, answer.view
    if exchange.status != 200 or not view.streamed or view.done or view.error_events:
        return []
    return [
        mismatch(
            f"{_where(answer)}: a stream that ended without [DONE]",
            "an error event before its end",
            exchange.summary(),
        )
    ]


@check("FINISH-4")
def known_reasons(answer: Answer) -> list[Mismatch]:
    if not answer.ok:
        return []
    return [
        mismatch(
            f"{_where(answer)}: choice {index}'s finish_reason", "|".join(sorted(FINISH_REASONS)), reason
        )
        for index, choice in sorted(answer.view.choices.items())
        for reason in choice.finishes
        if reason not in FINISH_REASONS
    ]


@check("FINISH-6")
def length_iff_max(answer: Answer) -> list[Mismatch]:
    """Judged where the answer counts its one choice's tokens (usage of n = 1)."""
    request = answer.request
    most, numbers = request.max_tokens, usage_numbers(answer.view.usage)
    choice = answer.view.choices.get(0)
    if not answer.ok or most is None or request.n != 1 or numbers is None or choice is None:
        return []
    count, where = numbers[1], f"{_where(answer)}: completion_tokens"
    if choice.finish == "length" and count != most:
        return [mismatch(f"{where} of a choice that ended length", f"max_tokens = {most}", count)]
    if choice.finish not in (None, "length") and count > most:
        return [mismatch(f"{where} of a choice that ended {choice.finish}", f"<= max_tokens = {most}", count)]
    return []


@check("USAGE-1")
def usage_placed(answer: Answer) -> list[Mismatch]:
    if not answer.ok:
        return []
    view, request = answer.view, answer.request
    if not view.streamed:
        numbers = usage_numbers(view.usage)
        if numbers is None:
            return [
                mismatch(
                    f"{_where(answer)}: usage", "prompt_tokens, completion_tokens, total_tokens", view.usage
                )
            ]
        if numbers[2] != numbers[0] + numbers[1]:
            return [
                mismatch(
                    f"{_where(answer)}: total_tokens",
                    f"prompt + completion = {numbers[0] + numbers[1]}",
                    numbers[2],
                )
            ]
        return []
    if not request.include_usage:
        return []
    if len(view.usages) != 1:
        return [mismatch(f"{_where(answer)}: chunks carrying usage", 1, [u.position for u in view.usages])]
    seen = view.usages[0]
    out = []
    if seen.position != view.chunks - 1:
        out.append(
            mismatch(
                f"{_where(answer)}: the usage chunk",
                f"the last before [DONE] (chunk {view.chunks - 1})",
                f"chunk {seen.position}",
            )
        )
    if seen.choices != []:
        out.append(mismatch(f"{_where(answer)}: choices of the usage chunk", "[]", seen.choices))
    numbers = usage_numbers(seen.usage)
    if numbers is None or numbers[2] != numbers[0] + numbers[1]:
        out.append(
            mismatch(f"{_where(answer)}: usage", "integers with total = prompt + completion", seen.usage)
        )
    return out


@check("USAGE-3")
def completion_is_the_sum(answer: Answer) -> list[Mismatch]:
    numbers = usage_numbers(answer.view.usage)
    if not answer.ok or numbers is None or answer.request.n < 2:
        return []
    counts = [choice_tokens(answer, c) for _, c in sorted(answer.view.choices.items())]
    if len(counts) != answer.request.n or any(c is None for c in counts):
        return []
    total = sum(c for c in counts if c is not None)
    if numbers[1] != total:
        return [
            mismatch(
                f"{_where(answer)}: completion_tokens", f"the sum over choices {counts} = {total}", numbers[1]
            )
        ]
    return []


@check("USAGE-4")
def cached_within_prompt(answer: Answer) -> list[Mismatch]:
    usage, numbers = answer.view.usage, usage_numbers(answer.view.usage)
    if not answer.ok or numbers is None:
        return []
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if cached is None:
        return []
    if not isinstance(cached, int) or not 0 <= cached <= numbers[0]:
        return [
            mismatch(
                f"{_where(answer)}: cached_tokens", f"an integer in [0, prompt_tokens = {numbers[0]}]", cached
            )
        ]
    return []


@check("USAGE-5")
def within_max_tokens(answer: Answer) -> list[Mismatch]:
    request, numbers = answer.request, usage_numbers(answer.view.usage)
    if not answer.ok or request.max_tokens is None:
        return []
    out = []
    for index, choice in sorted(answer.view.choices.items()):
        if request.top_logprobs is not None and len(choice.entries) > request.max_tokens:
            out.append(
                mismatch(
                    f"{_where(answer)}: logprobs entries of choice {index}",
                    f"<= max_tokens = {request.max_tokens}",
                    len(choice.entries),
                )
            )
    if numbers is not None and numbers[1] > request.n * request.max_tokens:
        out.append(
            mismatch(
                f"{_where(answer)}: completion_tokens",
                f"<= n * max_tokens = {request.n * request.max_tokens}",
                numbers[1],
            )
        )
    out += _counts_its_entries(answer)
    return out


def _counts_its_entries(answer: Answer) -> list[Mismatch]:
    """A one-choice answer that did not end ``length`` counts the tokens its logprobs list, and at most
    one more (an end-of-sequence token, which no entry shows): usage is judged for every way a choice
    ends, not only at max_tokens."""
    request, numbers = answer.request, usage_numbers(answer.view.usage)
    choice = answer.view.choices.get(0)
    if request.n != 1 or request.top_logprobs is None or numbers is None or choice is None:
        return []
    if choice.finish in (None, "length") or not choice.entries or request.stops:
        return []  # a stop string's tokens may be left out of the entries (STREAM-7)
    entries = len(choice.entries)
    if entries <= numbers[1] <= entries + 1:
        return []
    return [
        mismatch(
            f"{_where(answer)}: completion_tokens of a choice that ended {choice.finish}",
            f"its {entries} logprobs entries (one more with an end-of-sequence token)",
            numbers[1],
        )
    ]


@check("STOP-1")
def stops_never_shown(answer: Answer) -> list[Mismatch]:
    if not answer.ok:
        return []
    stops = [s for s in answer.request.stops if s]
    return [
        mismatch(f"{_where(answer)}: content of choice {index}", f"no stop string of {stops}", choice.text)
        for index, choice in sorted(answer.view.choices.items())
        if any(stop in choice.text for stop in stops)
    ]


def _entries_fit(entries: int, count: int, finish: str | None, stops: list[str]) -> bool:
    """Logprobs entries against the tokens a choice counts: one each when cut at max_tokens; a stop
    string's tokens may be left out of the entries as they are of the text; and a choice that ended
    on its own may count an end-of-sequence token that no entry shows (as usage does on vLLM)."""
    if finish == "length":
        return entries == count
    if stops:
        return entries <= count
    return count - 1 <= entries <= count


@check("STREAM-7")
def logprob_entries(answer: Answer) -> list[Mismatch]:
    request = answer.request
    k = request.top_logprobs
    if not answer.ok or k is None:
        return []
    out = []
    for index, choice in sorted(answer.view.choices.items()):
        where = f"{_where(answer)}: choice {index}"
        if not choice.entries:
            if choice.text:
                out.append(mismatch(f"{where}: logprobs", "one entry per token", "none"))
            continue
        count = choice_tokens(answer, choice)
        if count is not None and not _entries_fit(len(choice.entries), count, choice.finish, request.stops):
            want = "one" if choice.finish == "length" else "at most one"
            out.append(
                mismatch(
                    f"{where}: logprobs entries (it ended {choice.finish})",
                    f"{want} per token ({count} tokens"
                    f"{'' if choice.finish == 'length' or request.stops else ', one fewer with an end-of-sequence token'})",
                    len(choice.entries),
                )
            )
        # each kind of problem once per choice, at its first entry: one fault never hides another
        seen: set[str] = set()
        for position, entry in enumerate(choice.entries):
            for kind, want, got in _entry_problems(entry, k):
                if kind not in seen:
                    seen.add(kind)
                    out.append(mismatch(f"{where}: logprobs entry {position} ({entry.token!r})", want, got))
    return out


def _entry_problems(entry: TokenEntry, k: int) -> list[tuple[str, str, object]]:
    """(kind, want, got) of each rule one logprobs entry breaks.

    Chat: ``top_logprobs`` are exactly the ``k`` most likely tokens, sorted by logprob (ties in any
    order); the sampled token is among them unless ``k`` tokens at least as likely fill them.
    Legacy completions: a dict (equal strings collapse, so fewer entries may come) of at most ``k``
    entries, or ``k + 1`` when one of them is the sampled token itself (OpenAI: "the API will always
    return the logprob of the sampled token, so there may be up to logprobs+1 elements"; vLLM
    answers logprobs=0 with the sampled token alone). A dict's order means nothing."""
    out: list[tuple[str, str, object]] = []
    logprob, top = entry.logprob, entry.top
    if logprob is None or math.isnan(logprob) or logprob > LOGPROB_SLACK:
        out.append(("logprob", "a logprob <= 0", logprob))
    # the sampled token among the alternatives: by its text, or by its logprob where the text of a
    # token that is no whole character is shown otherwise (llama.cpp lists its bytes as U+FFFD)
    listed = any(
        token == entry.token or (logprob is not None and abs(value - logprob) <= LOGPROB_SLACK)
        for token, value in top
    )
    if entry.top_is_dict:
        if not (min(k, 1) <= len(top) <= k or (len(top) == k + 1 and listed)):
            want = f"at most {k} alternatives, or {k + 1} with the sampled token among them"
            out.append(("count", want, [token for token, _ in top]))
    elif len(top) != k:
        out.append(("count", f"{k} alternatives", len(top)))
    values = [v for _, v in top]
    if any(math.isnan(v) or v > LOGPROB_SLACK for v in values):
        out.append(("values", "alternatives with logprobs <= 0", values))
    if not entry.top_is_dict and values:
        unsorted = any(a < b - LOGPROB_SLACK for a, b in itertools.pairwise(values))
        passed_over = (
            not listed
            and logprob is not None
            and not math.isnan(logprob)
            and logprob > min(values) + LOGPROB_SLACK
        )
        if unsorted or passed_over:
            shown = [(token, round(v, 4)) for token, v in top]
            got = (
                f"{shown}; the sampled token {entry.token!r} has {logprob}{'' if listed else ', not listed'}"
            )
            out.append(("top", f"the {k} most likely tokens, sorted by logprob, highest first", got))
    return out


CLAUSES = tuple(CHECKS)
