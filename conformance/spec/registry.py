"""The case registry: ``@case("STREAM-2", ...)`` binds a coroutine to a clause of docs/contract.md.

A case ID is its clause ID, plus a bracketed permutation when one clause has several cases
(``ABORT-4[n=4]``). Baselines, ``--run``/``--skip`` and reports all speak these IDs.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from conformance.spec.clauses import CLAUSES, Clause, Level
from conformance.spec.coverage import CLASSES
from conformance.spec.protocols import GRPC_PROTOCOLS, PROTOCOLS, family
from lmrpc.v1 import Capabilities

# A case body: ``async def body(ctx: Ctx) -> None``. The spec layer sits below the harness that
# makes the Ctx (conformance/harness/context.py), so it does not name its type.
Body = Callable[..., Awaitable[None]]


class Stage(enum.IntEnum):
    """When a case runs: a case that restarts or ends the server runs alone, after every case that
    needs the server as it was (a run orders its cases by stage, keeping their order within one)."""

    ORDINARY = 0
    RESTARTS = 1  # the server restarts (--restart-hook) and serves again
    ENDS = 2  # the server shuts down (--drain-hook): nothing runs after it


@dataclass(frozen=True, slots=True)
class Case:
    id: str
    clause: Clause
    level: Level
    requires: tuple[str, ...]  # capability requirements, see TargetInfo.has
    body: Body
    params: dict[str, Any] = field(default_factory=dict)
    exclusive: bool = False  # needs a quiet server (load baselines, pause): runs alone
    budget_factor: float = 1.0  # multiplies the per-case budget
    module: str = ""
    sends: tuple[str, ...] = ()  # input classes it sends (spec/coverage.py), checked by the self-test
    protocols: tuple[str, ...] = GRPC_PROTOCOLS  # the protocols whose runs select it
    stage: Stage = Stage.ORDINARY

    @property
    def group(self) -> str:
        return self.clause.section

    @property
    def doc(self) -> str:
        return " ".join((self.body.__doc__ or "").split())


@dataclass(frozen=True, slots=True)
class Variant:
    """One permutation of a case: the params its body reads (``ctx.params``), its tag (by default the
    params as ``k=v``) and the capabilities it needs beyond the case's own."""

    params: Mapping[str, object] = field(default_factory=dict)
    tag: str | None = None
    requires: tuple[str, ...] = ()
    sends: tuple[str, ...] = ()  # input classes this permutation sends (besides the case's)


REGISTRY: dict[str, Case] = {}
CAPABILITIES = frozenset(f.name for f in dataclasses.fields(Capabilities))
_REQUIREMENT = re.compile(r"^!?([a-z_]+)(>=\d+)?$")


def check_requirement(requirement: str) -> str:
    """A requirement names ``Capabilities`` fields: ``tokenize``, ``!stop_strings`` (absent),
    ``max_outputs>=4``, ``a|b`` (either). A misspelt one would skip its case silently, so it is an
    error at registration."""
    for part in requirement.split("|"):
        found = _REQUIREMENT.match(part)
        if found is None or found.group(1) not in CAPABILITIES:
            raise ValueError(f"requirement {requirement!r}: {part!r} names no Capabilities field")
    return requirement


def case(
    clause_id: str,
    *,
    tag: str | None = None,
    variants: Sequence[Variant] | None = None,
    requires: Iterable[str] = (),
    exclusive: bool = False,
    budget: float = 1.0,
    level: Level | None = None,
    sends: Iterable[str] = (),
    protocols: tuple[str, ...] = GRPC_PROTOCOLS,
    stage: Stage = Stage.ORDINARY,
) -> Callable[[Body], Body]:
    """Register a case (or one case per variant)."""
    clause = CLAUSES.get(clause_id)
    if not protocols or set(protocols) - set(PROTOCOLS):
        raise ValueError(f"protocols={protocols!r} must name protocols of {PROTOCOLS}")
    if clause is None:
        raise ValueError(f"clause_id={clause_id!r} is not a clause of docs/contract.md")
    common = tuple(check_requirement(r) for r in requires)
    declared = tuple(sends)
    unknown = [s for s in (*declared, *(s for v in variants or () for s in v.sends)) if s not in CLASSES]
    if unknown:
        raise ValueError(f"sends={unknown} names no input class of conformance/spec/coverage.py")
    for variant in variants or ():
        for requirement in variant.requires:
            check_requirement(requirement)

    def register(body: Body) -> Body:
        for variant in variants or [Variant()]:
            params = dict(variant.params)
            suffix = variant.tag or tag or ",".join(f"{k}={v}" for k, v in params.items())
            case_id = f"{clause_id}[{suffix}]" if suffix else clause_id
            if case_id in REGISTRY:
                raise ValueError(f"case {case_id} is registered twice")
            REGISTRY[case_id] = Case(
                id=case_id,
                clause=clause,
                level=level or clause.level,
                requires=(*common, *variant.requires),
                body=body,
                params=params,
                exclusive=exclusive or stage is not Stage.ORDINARY,
                budget_factor=budget,
                module=body.__module__.rsplit(".", 1)[-1],
                sends=(*declared, *variant.sends),
                protocols=protocols,
                stage=stage,
            )
        return body

    return register


def _glob(pattern: str) -> re.Pattern[str]:
    """``*`` and ``?`` are wildcards; everything else (brackets included) is literal."""
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(f"^{body}$", re.IGNORECASE)


def matches(pattern: str, case: Case) -> bool:
    regex = _glob(pattern)
    return bool(regex.match(case.id)) or ("[" not in pattern and bool(regex.match(case.clause.id)))


def expand_patterns(values: Iterable[str]) -> list[str]:
    """Split comma-separated values and read ``@file`` (one pattern a line, ``#`` comments)."""
    patterns: list[str] = []
    for value in values:
        if value.startswith("@"):
            with open(value[1:], encoding="utf-8") as handle:
                lines = [line.split("#", 1)[0].strip() for line in handle]
            patterns.extend(line for line in lines if line)
        else:
            patterns.extend(p.strip() for p in value.split(",") if p.strip())
    return patterns


def level_selected(case: Case, level: str) -> bool:
    return level == "all" or case.level.value.lower() == level


def select(
    cases: Iterable[Case],
    *,
    level: str,
    run: Sequence[str] = (),
    skip: Sequence[str] = (),
    protocol: str | None = None,
) -> list[Case]:
    """The cases of ``level`` that ``run`` names and ``skip`` does not; with ``protocol``, only those
    registered for it (``auto``: the gRPC protocols')."""
    wanted = None if protocol is None else family(protocol) if protocol == "auto" else (protocol,)
    chosen = []
    for c in cases:
        if wanted is not None and not set(wanted) & set(c.protocols):
            continue
        if not level_selected(c, level):
            continue
        if run and not any(matches(p, c) for p in run):
            continue
        if any(matches(p, c) for p in skip):
            continue
        chosen.append(c)
    return chosen
