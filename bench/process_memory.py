"""The memory a server uses: the proportional set size (PSS) of its process and all its
descendants, so pages shared between its processes (libraries, copy-on-write) count once."""

from __future__ import annotations

from pathlib import Path


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (from /proc/<pid>/task/*/children)."""
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                pending.extend(int(child) for child in (task / "children").read_text().split())
            except OSError:
                continue
    return found


def tree_pss_mb(pid: int) -> float:
    """PSS of ``pid`` and its descendants in MB (processes that exit meanwhile count nothing)."""
    total_kb = 0
    for process in descendants(pid):
        try:
            rollup = Path(f"/proc/{process}/smaps_rollup").read_text()
        except OSError:
            continue
        total_kb += next((int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:")), 0)
    return total_kb / 1024
