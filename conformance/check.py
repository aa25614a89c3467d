"""Collecting mismatches connect-style: a case records every difference, then fails once with all of them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from conformance.results import Mismatch


class CaseFailed(Exception):
    """The target broke the case's clause; carries every mismatch found."""

    def __init__(self, mismatches: Iterable[Mismatch]) -> None:
        self.mismatches = list(mismatches)
        super().__init__("; ".join(m.render() for m in self.mismatches) or "case failed")


class CaseSkipped(Exception):
    """The case does not apply to this target (a capability is absent, or a precondition cannot be met)."""


class TargetDown(Exception):
    """The target stopped answering; the runner checks liveness and may stop the run."""


def show(value: Any) -> str:
    """A short, stable rendering of a value for want/got lines."""
    text = repr(value)
    return text if len(text) <= 400 else text[:380] + f"... ({len(text)} chars)"


class Checker:
    """Accumulates mismatches. ``fail_if_any()`` ends the case when there are some."""

    def __init__(self) -> None:
        self.mismatches: list[Mismatch] = []

    def __bool__(self) -> bool:
        return not self.mismatches

    def add(self, what: str, want: object, got: object) -> None:
        want_s = want if isinstance(want, str) else show(want)
        got_s = got if isinstance(got, str) else show(got)
        self.mismatches.append(Mismatch(what, want_s, got_s))

    def equal(self, what: str, want: object, got: object) -> bool:
        if want == got:
            return True
        self.add(what, show(want), show(got))
        return False

    def that(self, ok: bool, what: str, want: str, got: object) -> bool:
        if not ok:
            self.add(what, want, got if isinstance(got, str) else show(got))
        return ok

    def extend(self, mismatches: Iterable[Mismatch]) -> None:
        self.mismatches.extend(mismatches)

    def fail_if_any(self) -> None:
        if self.mismatches:
            raise CaseFailed(self.mismatches)

    def fail(self, what: str, want: object, got: object) -> None:
        self.add(what, want, got)
        raise CaseFailed(self.mismatches)


class StreamHung(Exception):
    """A stream neither ended nor progressed within its budget (a property search stops on it)."""
