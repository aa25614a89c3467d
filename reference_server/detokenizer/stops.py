"""Stop-string matching over streamed text, with holdback.

Text that could still turn into a stop string is held back until it cannot, so an excluded stop
string is never streamed, not even a prefix of it. The match that ends first wins (on a tie,
the longer one); this makes the result independent of how the text was split into pieces.
"""

from __future__ import annotations

from typing import NamedTuple


class StopScan(NamedTuple):
    text: str  # safe to emit now
    matched: str | None  # the stop string that ended the output, if any


class StopStringMatcher:
    def __init__(self, stop_strings: tuple[str, ...], *, include_stop: bool) -> None:
        self._stops = tuple(s for s in stop_strings if s)
        self._include = include_stop
        self._pending = ""

    def feed(self, text: str, *, can_stop: bool = True) -> StopScan:
        buffer = self._pending + text
        if can_stop:
            match = self._first_match(buffer)
            if match is not None:
                start, stop = match
                self._pending = ""
                return StopScan(buffer[:start] + (stop if self._include else ""), stop)
        hold = self._holdback(buffer)
        self._pending = buffer[len(buffer) - hold :]
        return StopScan(buffer[: len(buffer) - hold], None)

    def flush(self) -> str:
        text, self._pending = self._pending, ""
        return text

    def _first_match(self, buffer: str) -> tuple[int, str] | None:
        best: tuple[int, int, str] | None = None  # (end, -length, stop)
        for stop in self._stops:
            start = buffer.find(stop)
            if start >= 0:
                key = (start + len(stop), -len(stop), stop)
                if best is None or key < best:
                    best = key
        if best is None:
            return None
        end, neg_length, stop = best
        return end + neg_length, stop

    def _holdback(self, buffer: str) -> int:
        """Length of the longest suffix of buffer that is a proper prefix of a stop string."""
        longest = 0
        for stop in self._stops:
            for length in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:length]):
                    longest = length
                    break
        return longest
