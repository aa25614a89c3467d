"""SGLang's native Generate responses read as lmrpc.v1 events: ``meta_info`` decoded, cumulative or
incremental ids told apart, each break of SRT-1..3 noted as a finding (the protocol's rules are in
the package's docstring)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from conformance.drivers.normalize import Normalizer
from lmrpc._gen.sglang.runtime import v1 as rt
from lmrpc.v1 import (
    GenerateResponse,
)

if TYPE_CHECKING:
    pass


META_NUMBERS = ("prompt_tokens", "completion_tokens", "cached_tokens")
REASONS = ("stop", "length", "abort")


def as_count(value: object) -> int | None:
    """A count as the server meant it: an integer, or digits in a string (SRT-2 reports the type)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


# ── the normalised views of one native response ─────────────────────────
@dataclass(frozen=True, slots=True)
class _Top:
    values: list[float]
    token_ids: list[int]


@dataclass(frozen=True, slots=True)
class _Logprobs:
    token_logprobs: list[float]
    token_ids: list[int]
    top_logprobs: list[_Top]


@dataclass(frozen=True, slots=True)
class _View:
    """One output's new ids (a chunk) or its whole output (a complete), with the counts of meta_info."""

    token_ids: list[int]
    output_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    index: int
    output_logprobs: _Logprobs | None
    finish_reason: str = ""
    matched_token_id: int | None = None
    matched_stop_str: str | None = None


def _logprobs(meta: dict[str, Any], start: int) -> _Logprobs | None:
    """The output's logprob tuples ``[logprob, token_id, text]`` from ``start`` on."""
    tuples = meta.get("output_token_logprobs")
    if not isinstance(tuples, list):
        return None
    tops = meta.get("output_top_logprobs")
    tops = tops if isinstance(tops, list) else []
    rows = [t for t in tuples[start:] if isinstance(t, list) and len(t) >= 2]
    top_rows = []
    for i in range(start, start + len(rows)):
        candidates = tops[i] if i < len(tops) and isinstance(tops[i], list) else []
        good = [c for c in candidates if isinstance(c, list) and len(c) >= 2]
        top_rows.append(_Top([float(c[0]) for c in good], [int(c[1]) for c in good]))
    return _Logprobs([float(t[0]) for t in rows], [int(t[1]) for t in rows], top_rows)


@dataclass
class _OutputState:
    ids: list[int] = field(default_factory=list)
    finishes: int = 0
    rid: str | None = None
    # declared incremental: the logprob lists of every response so far (SGLang slices them as it
    # slices the ids), so the output's lists read as a cumulative stream's do
    token_logprobs: list[Any] = field(default_factory=list)
    top_logprobs: list[Any] = field(default_factory=list)

    def logprob_lists(self, meta: dict[str, Any], incremental: bool) -> dict[str, Any]:
        """``meta``'s logprob lists as the whole output's so far."""
        if not incremental or not isinstance(meta.get("output_token_logprobs"), list):
            return meta
        tops = meta.get("output_top_logprobs")
        self.token_logprobs += meta["output_token_logprobs"]
        self.top_logprobs += tops if isinstance(tops, list) else [[] for _ in meta["output_token_logprobs"]]
        return {"output_token_logprobs": self.token_logprobs, "output_top_logprobs": self.top_logprobs}


@dataclass
class RuntimeReader:
    """Reads one Generate call's native responses into lmrpc.v1 events, checking SRT-1..3."""

    normalizer: Normalizer
    incremental: bool  # the server declared incremental_streaming_output
    sent_rid: str
    _outputs: dict[int, _OutputState] = field(default_factory=dict)
    _rid: str | None = None

    def note(self, clause: str, what: str, want: object, got: object) -> None:
        self.normalizer.note(clause, what, want, got)

    def meta(self, native: rt.GenerateResponse) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for key, text in native.meta_info.items():
            try:
                values[key] = json.loads(text)
            except ValueError:
                self.note("SRT-2", f"meta_info[{key!r}]", "JSON text", text[:60])
                values[key] = text
        for key in ("id", *META_NUMBERS, "finish_reason"):
            if key not in values:
                self.note("SRT-2", f"meta_info[{key!r}]", "present on every response", "missing")
        if "id" in values and not isinstance(values["id"], str):
            self.note("SRT-2", "meta_info['id']", "a JSON string", native.meta_info["id"][:60])
        for key in META_NUMBERS:
            if key in values and (not isinstance(values[key], int) or isinstance(values[key], bool)):
                self.note("SRT-2", f"meta_info[{key!r}]", "a JSON integer", native.meta_info[key][:60])
        reason = values.get("finish_reason")
        if reason is not None and not (isinstance(reason, dict) and reason.get("type") in REASONS):
            self.note("SRT-2", "meta_info['finish_reason']", 'null or {"type": "stop"|"length"|"abort", ...}',
                      native.meta_info.get("finish_reason", "")[:80])  # fmt: skip
            if isinstance(reason, str):  # read as meant, so that one fault is reported once
                values["finish_reason"] = {"type": reason}
        return values

    def read(self, native: rt.GenerateResponse) -> list[GenerateResponse]:
        meta = self.meta(native)
        rid = meta.get("id") if isinstance(meta.get("id"), str) else None
        self._check_rid(rid)
        request_id = self.sent_rid or rid or ""
        index = meta.get("index", 0)
        index = index if isinstance(index, int) and not isinstance(index, bool) else 0
        output = self._outputs.setdefault(index, _OutputState())
        ids = list(native.output_ids)
        prompt, completion, cached = (as_count(meta.get(key)) for key in META_NUMBERS)
        new = self._new_ids(index, output, ids, completion)
        reason = meta.get("finish_reason")
        reason = reason if isinstance(reason, dict) else None
        self._check_finished(index, output, reason, native.finished)
        prompt, completion, cached = prompt or 0, completion or 0, cached or 0
        start = len(output.ids)
        output.ids += new
        lists = output.logprob_lists(meta, self.incremental)
        events: list[GenerateResponse] = []
        if self.normalizer.streaming and (new or reason is None):
            # on the finished response, the output's last ids (if any) become a chunk of their own
            so_far = completion if reason is None else len(output.ids)
            chunk = _View(new, [], prompt, so_far, cached, index, _logprobs(lists, start))
            events += self.normalizer.chunk(request_id, chunk)
        if reason is not None:
            matched = reason.get("matched")
            complete = _View(
                [],
                list(output.ids),
                prompt,
                completion,
                cached,
                index,
                _logprobs(lists, 0),
                finish_reason=str(reason.get("type", "")),
                matched_token_id=matched
                if isinstance(matched, int) and not isinstance(matched, bool)
                else None,
                matched_stop_str=matched if isinstance(matched, str) else None,
            )
            events += self.normalizer.complete(request_id, complete)
        return events

    def _check_rid(self, rid: str | None) -> None:
        if rid is None:
            return
        if self.sent_rid and rid != self.sent_rid:
            self.note("SRT-2", "meta_info['id']", f"the rid sent ({self.sent_rid!r})", rid)
        elif self._rid is not None and rid != self._rid:
            self.note("SRT-2", "meta_info['id']", f"the same id on every response ({self._rid!r})", rid)
        self._rid = self._rid or rid

    def _new_ids(self, index: int, output: _OutputState, ids: list[int], completion: int | None) -> list[int]:
        """The ids new in this response. Where meta_info's count tells a whole output from a delta
        (after the first response), it decides; elsewhere the server's declaration does, and a
        response that does not extend the output cannot be cumulative. What the server sent against
        what it declared is an SRT-1 finding."""
        if not self.normalizer.streaming:
            return ids
        seen = output.ids
        extends = ids[: len(seen)] == seen
        as_whole = extends and len(ids) == completion
        as_delta = len(seen) + len(ids) == completion
        cumulative = as_whole if as_whole != as_delta else extends and not self.incremental
        if cumulative == self.incremental:
            declared = "incremental (only new ids)" if self.incremental else "cumulative (all ids so far)"
            self.note("SRT-1", f"response of output {index}: output_ids",
                      f"{declared}, as GetServerInfo declares; the output has {len(seen)} ids before it",
                      f"{len(ids)} ids {ids[:8]}, completion_tokens {completion}")  # fmt: skip
        return ids[len(seen) :] if cumulative else ids

    def _check_finished(
        self, index: int, output: _OutputState, reason: dict[str, Any] | None, finished: bool
    ) -> None:
        if output.finishes and (reason is not None or not finished):
            self.note("SRT-3", f"output {index}", "no response after its finished one", "another response")
        if reason is not None:
            output.finishes += 1
        if finished and reason is None:
            self.note("SRT-3", f"response of output {index}", "finished = true only with a finish_reason",
                      "finished = true, finish_reason null")  # fmt: skip
        if reason is not None and not finished:
            self.note("SRT-3", f"response of output {index}", "finished = true with its finish_reason",
                      f"finish_reason {reason.get('type')!r}, finished = false")  # fmt: skip
