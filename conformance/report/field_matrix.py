"""``conformance coverage``: the field files of runs merged per protocol, and the matrix printed."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from conformance.spec.fields import Row, protocols

SHOWN_CASES = 3  # per field, then "+N"


def load(files: Iterable[str]) -> dict[str, dict[str, dict[str, set[str]]]]:
    """{protocol: {"sent"|"read": {field: cases}}}, merged over ``files``."""
    merged: dict[str, dict[str, dict[str, set[str]]]] = {}
    for name in files:
        document = json.loads(Path(name).read_text(encoding="utf-8"))
        protocol = document.get("protocol")
        if protocol not in protocols():
            raise ValueError(f"{name}: protocol={protocol!r} is not one of {', '.join(protocols())}")
        into = merged.setdefault(protocol, {"sent": {}, "read": {}})
        for kind in ("sent", "read"):
            for field, cases in document.get(kind, {}).items():
                into[kind].setdefault(field, set()).update(cases)
    return merged


def _who(row: Row) -> str:
    if not row.cases:
        return row.reason or "no case sends or reads it"
    shown = ", ".join(row.cases[:SHOWN_CASES])
    more = f" +{len(row.cases) - SHOWN_CASES}" if len(row.cases) > SHOWN_CASES else ""
    return f"{'sent' if row.side == 'request' else 'read'} by {shown}{more}"


def render(
    tables: Mapping[str, list[Row]], stale: Mapping[str, list[str]], *, every: bool, as_json: bool
) -> str:
    if as_json:
        document = {
            protocol: {
                "fields": [
                    {"field": r.field, "status": r.status, "cases": list(r.cases), "reason": r.reason}
                    for r in rows
                ],
                "stale_reasons": stale.get(protocol, []),
            }
            for protocol, rows in tables.items()
        }
        return json.dumps(document, indent=1) + "\n"
    lines: list[str] = []
    for protocol, rows in tables.items():
        counts = {s: sum(r.status == s for r in rows) for s in ("covered", "n/a", "open", "GAP")}
        lines.append(
            f"{protocol}: {len(rows)} fields: {counts['covered']} covered, {counts['n/a']} n/a, "
            f"{counts['open']} open (known gaps), {counts['GAP']} gaps"
        )
        for row in rows:
            if every or row.status == "GAP":
                lines.append(f"  {row.status:<8} {row.field}: {_who(row)}")
        for pattern in stale.get(protocol, []):
            lines.append(f"  STALE    n/a pattern {pattern!r} names no field of the schema")
    return "\n".join(lines) + "\n"
