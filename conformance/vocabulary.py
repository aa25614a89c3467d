"""The harness's vocabulary, which every folder of it speaks and which imports none of them: what a
target is (``TargetInfo``, what the server says about itself), what a case sends (``Call``, one RPC
of its transcript) and what it produces (a ``Verdict``, every ``Mismatch`` as want/got, a ``Repro``),
and the exceptions a case body ends with (failed with its mismatches, skipped, or a stream that
hung)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import betterproto2

from lmrpc import __version__
from lmrpc.v1 import Capabilities, EmbeddingModelInfo, ModelInfo, ServerInfo

HARNESS_VERSION = __version__  # a baseline records it; CHANGELOG.md lists the cases each adds or changes
GREEDY_N = "greedy n>1"  # several outputs at temperature 0 (TargetInfo.refusals)
REPORT_SCHEMA = "lmrpc-conformance/1"


class Verdict(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    SKIP = "SKIP"  # a capability the case requires is absent, or the case does not apply
    NOT_RUN = "NOT-RUN"  # deselected by level, or the target went down before the case ran
    XFAIL = "XFAIL"  # failed, and the baseline lists it as a known failure
    ERROR = "ERROR"  # the harness itself broke (a bug or an infrastructure problem), not the target

    @property
    def is_failure(self) -> bool:
        return self in (Verdict.FAIL, Verdict.ERROR)


@dataclass(frozen=True, slots=True)
class Mismatch:
    """One way the target differed from the contract: what was checked, the value wanted, the value got;
    ``subject`` names the request it was seen on, where a case judges many (a pooled clause)."""

    what: str
    want: str
    got: str
    subject: str = ""

    def render(self) -> str:
        where = f"{self.subject}: " if self.subject else ""
        return f"{where}{self.what}: want {self.want}, got {self.got}"

    @property
    def fingerprint(self) -> str:
        """What differs, without the values of this run: ``what`` and ``want`` with numbers, quoted
        text, lists and request ids blanked. The same fault gives the same fingerprint run after run,
        and a baseline entry names the fingerprints it excuses."""
        return f"{shape(self.what)} — want {shape(self.want)}"[:200]


_REQUEST_ID = re.compile(r"\bcf-[0-9a-f]{6}-\d+-[\w.:/-]*")
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
_COLLECTION = re.compile(r"\[[^\[\]]*\]|\{[^{}]*\}")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def shape(text: str) -> str:
    """``text`` with the values of one run blanked (see ``Mismatch.fingerprint``)."""
    text = _REQUEST_ID.sub("<id>", text)
    text = _QUOTED.sub("'…'", text)
    for _ in range(3):  # nested lists, innermost first
        text = _COLLECTION.sub(lambda m: m.group(0)[0] + "…" + m.group(0)[-1], text)
    return " ".join(_NUMBER.sub("#", text).split())


def show(value: Any) -> str:
    """A short, stable rendering of a value for want/got lines."""
    text = repr(value)
    return text if len(text) <= 400 else text[:380] + f"... ({len(text)} chars)"


def mismatch(what: str, want: object, got: object) -> Mismatch:
    """A Mismatch from any values: strings are taken as written, anything else as a short repr."""
    return Mismatch(
        what, want if isinstance(want, str) else show(want), got if isinstance(got, str) else show(got)
    )


@dataclass(slots=True)
class Repro:
    """How to reproduce a failure: the shrunk example or step list, and a stand-alone script."""

    kind: str = "transcript"  # "example" (shrunk hypothesis input), "steps" (state machine), "transcript"
    example: str = ""  # the shrunk input or the step list, as hypothesis printed it
    script: str = ""  # a stand-alone Python program replaying the calls with the lmrpc SDK
    seed: int | None = None
    blob: str = ""  # hypothesis @reproduce_failure blob, when there is one
    script_path: str = ""  # where the script was written, when it was

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "example": self.example,
            "script": self.script,
            "script_path": self.script_path,
            "seed": self.seed,
            "blob": self.blob,
        }


@dataclass(slots=True)
class CaseResult:
    case_id: str
    clause: str
    level: str
    verdict: Verdict
    duration_s: float = 0.0
    reason: str = ""  # one line: why it failed, skipped or was not run
    mismatches: list[Mismatch] = field(default_factory=list)
    repro: Repro | None = None
    notes: list[str] = field(default_factory=list)
    baseline_reason: str = ""  # for XFAIL: the baseline entry's reason
    sent: list[str] = field(default_factory=list)  # input classes the case's calls belonged to

    def findings(self) -> dict[str, int]:
        """Each distinct fingerprint of a failure, with how many mismatches showed it (in first-seen
        order); a failure without mismatches is its reason's shape."""
        if self.verdict not in (Verdict.FAIL, Verdict.XFAIL):
            return {}
        counts: dict[str, int] = {}
        for m in self.mismatches:
            counts[m.fingerprint] = counts.get(m.fingerprint, 0) + 1
        return counts or {shape(self.reason) or "failed": 1}

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.case_id,
            "clause": self.clause,
            "level": self.level,
            "verdict": self.verdict.value,
            "duration_s": round(self.duration_s, 4),
            "reason": self.reason,
            "mismatches": [
                {
                    "what": m.what,
                    "want": m.want,
                    "got": m.got,
                    "subject": m.subject,
                    "fingerprint": m.fingerprint,
                }
                for m in self.mismatches
            ],
            "findings": [{"fingerprint": f, "count": n} for f, n in self.findings().items()],
            "repro": self.repro.to_json() if self.repro else None,
            "notes": self.notes,
            "baseline_reason": self.baseline_reason,
            "sent": self.sent,
        }


class CaseFailed(Exception):
    """The target broke the case's clause; carries every mismatch found."""

    def __init__(self, mismatches: Iterable[Mismatch]) -> None:
        self.mismatches = list(mismatches)
        super().__init__("; ".join(m.render() for m in self.mismatches) or "case failed")


class CaseSkipped(Exception):
    """The case does not apply to this target (a capability is absent, or a precondition cannot be met)."""


class RpcTimedOut(Exception):
    """A unary call of a case got no answer within its deadline (not the case's own budget)."""

    def __init__(self, method: str, timeout_s: float) -> None:
        self.method, self.timeout_s = method, timeout_s
        super().__init__(f"{method} did not answer within its deadline of {timeout_s:.1f}s")


class StreamHung(Exception):
    """A stream neither ended nor progressed within its budget (a property search stops on it)."""


@dataclass(slots=True)
class TargetInfo:
    """What the server advertises about itself."""

    server: ServerInfo
    model: ModelInfo
    embedding: EmbeddingModelInfo | None
    kv_tokens_total: int = 0  # from GetLoad at connect time; 0 when the server does not say
    # the prefix cache keeps whole blocks of this many tokens (vLLM: GetServerInfo.block_size); 0: not said
    cache_block_tokens: int = 0
    # options the server refuses by design where its protocol lets it (learned before the cases,
    # harness/refusals.py): the option -> the server's answer. Cases that need one skip, quoting it;
    # generated requests leave it out.
    refusals: dict[str, str] = field(default_factory=dict)

    @property
    def caps(self) -> Capabilities:
        return self.server.capabilities or Capabilities()

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    @property
    def max_context(self) -> int:
        return self.model.max_context_tokens

    @property
    def eos_ids(self) -> list[int]:
        return list(self.model.eos_token_ids)

    def has(self, requirement: str) -> bool:
        """Evaluate one requirement: ``tokenize``, ``!stop_strings`` (absent), ``max_outputs>=4``, ``a|b``."""
        if "|" in requirement:
            return any(self.has(part) for part in requirement.split("|"))
        if requirement.startswith("!"):
            return not self.has(requirement[1:])
        name, _, minimum = requirement.partition(">=")
        value = getattr(self.caps, name)
        return bool(value) if not minimum else int(value) >= int(minimum)


@dataclass(slots=True)
class Call:
    """One RPC of the transcript. ``t_s`` is relative to the case start."""

    t_s: float
    service: str  # "control" | "inference"
    method: str  # the stub's method name, e.g. "abort", "generate"
    request: betterproto2.Message
    deadline_s: float | None = None
    cancel_after: int | None = None  # Generate: the client cancelled after this many messages
    outcome: str = ""
