"""The coverage view of the case library (``conformance list --coverage``): the cases that send each
input class and observe each MUST sentence of conformance/spec/coverage.py, the sentences one case
observes on purpose (with the reason), and every gap."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Mapping, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from conformance.report.model import EXIT_FAIL, EXIT_OK
from conformance.spec.coverage import INPUT_CLASSES, OBSERVED_BY, SEEN_ONCE_BECAUSE, sentences
from conformance.spec.registry import Case, matches


def coverage_gaps(cases: Sequence[Case]) -> tuple[dict[str, list[str]], dict[str, list[str]], list[str]]:
    """Who sends each input class, who observes each MUST sentence, and every gap (a class no case
    sends, a sentence no case observes, a table entry that names no case or no sentence, an exception
    that no longer holds)."""
    senders = {c.id: [case.id for case in cases if c.id in case.sends] for c in INPUT_CLASSES}
    texts = sentences()
    observers = {
        sid: sorted({c.id for c in cases for p in OBSERVED_BY.get(sid, ()) if matches(p, c)}) for sid in texts
    }
    gaps = [f"input class {cid}: no case sends it" for cid, who in senders.items() if not who]
    gaps += [
        f"sentence {sid}: no case observes it ({texts[sid][:70]})"
        for sid, who in observers.items()
        if not who
    ]
    gaps += [
        f"OBSERVED_BY names a sentence that does not exist: {sid}" for sid in OBSERVED_BY if sid not in texts
    ]
    gaps += [
        f"OBSERVED_BY[{sid}]: {pattern!r} names no case"
        for sid, patterns in OBSERVED_BY.items()
        for pattern in patterns
        if not any(matches(pattern, c) for c in cases)
    ]
    gaps += stale_exceptions(observers)
    gaps += [
        f"sentence {sid}: only {observers[sid][0]} observes it, and SEEN_ONCE_BECAUSE says not why one case "
        "is enough"
        for sid in seen_once(observers)
    ]
    return senders, observers, gaps


def stale_exceptions(
    observers: dict[str, list[str]], because: Mapping[str, str] = SEEN_ONCE_BECAUSE
) -> list[str]:
    """Exceptions that no longer hold: a sentence that does not exist, or one two cases observe now."""
    stale = [
        f"SEEN_ONCE_BECAUSE names a sentence that does not exist: {sid}"
        for sid in because
        if sid not in observers
    ]
    stale += [
        f"SEEN_ONCE_BECAUSE[{sid}]: {len(observers[sid])} cases observe it, so it needs no exception"
        for sid in because
        if len(observers.get(sid, ())) > 1
    ]
    return stale


def seen_once_because(
    observers: dict[str, list[str]], because: Mapping[str, str] = SEEN_ONCE_BECAUSE
) -> dict[str, str]:
    """The sentences one case observes on purpose, each with why a second case would only repeat it."""
    return {sid: reason for sid, reason in because.items() if len(observers.get(sid, ())) == 1}


def seen_once(observers: dict[str, list[str]], because: Mapping[str, str] = SEEN_ONCE_BECAUSE) -> list[str]:
    """MUST sentences only one case observes and no exception explains: one timing change away from a
    fault that escapes, so each is a gap until a second case sees the fault another way."""
    return [sid for sid, who in observers.items() if len(who) == 1 and sid not in because]


def exceptions_table(observers: dict[str, list[str]], excepted: dict[str, str]) -> Table:
    table = Table(
        "sentence",
        "observed by",
        "why one case is enough",
        title=f"{len(excepted)} MUST sentences seen by one case on purpose",
        title_justify="left",
    )
    for sid, reason in excepted.items():
        table.add_row(sid, escape(", ".join(observers[sid])), escape(reason))
    return table


def list_coverage(args: argparse.Namespace, cases: Iterable[Case]) -> int:
    # the contract's sentences are lmrpc.v1's: the OpenAI profile's cases check its reading, not them
    senders, observers, gaps = coverage_gaps([c for c in cases if "lmrpc" in c.protocols])
    once, excepted = seen_once(observers), seen_once_because(observers)
    if args.json:
        report = {"input_classes": senders, "must_sentences": observers, "gaps": gaps}
        print(json.dumps({**report, "seen_once": once, "seen_once_because": excepted}, indent=2))
        return EXIT_FAIL if gaps else EXIT_OK
    console = Console()
    classes = Table(
        "input class", "what", "sent by", title=f"{len(senders)} input classes", title_justify="left"
    )
    for item in INPUT_CLASSES:
        who = senders[item.id]
        classes.add_row(escape(item.id), escape(item.text), escape(", ".join(who)) if who else "[red]none")
    console.print(classes)
    texts = sentences()
    table = Table(
        "sentence", "observed by", "text", title=f"{len(texts)} MUST sentences", title_justify="left"
    )
    for sid, who in observers.items():
        table.add_row(sid, escape(", ".join(who)) if who else "[red]none", escape(texts[sid][:90]))
    console.print(table)
    console.print(exceptions_table(observers, excepted))
    if once:
        console.print(
            f"[yellow]{len(once)} of {len(texts)} MUST sentences are seen by one case only, "
            "with no reason why one is enough:[/] " + ", ".join(once)
        )
    for gap in gaps:
        console.print(f"[red]gap[/] {escape(gap)}")
    console.print(
        f"{len(gaps)} gaps" if gaps else "[green]every input class is sent and every MUST sentence observed"
    )
    return EXIT_FAIL if gaps else EXIT_OK
