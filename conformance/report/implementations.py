"""Implementation reports and the matrix made of them.

``conformance run --report FILE`` writes one report per run: who the server says it is (and what the
user named it), the protocol, the harness and contract revision, every case's verdict with the
reason of each skip and failure, and the baseline applied with each entry's reason. Reports of
servers the project does not write are kept in the repository (``docs/reports/``), one per
implementation, protocol and version, the way the Kubernetes Gateway API Inference Extension keeps
its vendors' conformance reports; ``conformance report DIR`` renders them into the matrix of
implementations x clauses in ``docs/implementations.md``.
"""

from __future__ import annotations

import datetime
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.report.baseline import Baseline
from conformance.report.model import RunReport, badge
from conformance.spec.clauses import CLAUSES
from conformance.vocabulary import HARNESS_VERSION, Verdict
from lmrpc import CONTRACT_REVISION

SCHEMA = "lmrpc-implementation-report/1"
MARKS = {"pass": "✅", "fail": "❌", "known": "⚠️", "skip": "—", "absent": ""}


@dataclass(frozen=True, slots=True)
class Naming:
    """What the user calls the implementation, where the server does not say (``--implementation``)."""

    name: str | None = None
    version: str | None = None


def report_of(
    run: RunReport, naming: Naming, baseline: Baseline | None, settings: dict[str, Any]
) -> dict[str, Any]:
    reported = {"name": run.server.get("name", ""), "version": run.server.get("version", "")}
    return {
        "schema": SCHEMA,
        "implementation": {
            "name": naming.name or reported["name"] or "unknown",
            "version": naming.version or reported["version"] or "unknown",
            "as_reported": reported,
            "identity": run.server.get("identity", {}),
        },
        "protocol": run.protocol,
        "target": run.target,
        "model": run.server.get("model", ""),
        "harness_version": HARNESS_VERSION,
        "contract_revision": CONTRACT_REVISION,
        "date": run.started_at[:10] or datetime.date.today().isoformat(),
        "level": run.level,
        "badge": badge(run),
        "settings": settings,
        "baseline": {
            "file": baseline.path if baseline else None,
            "entries": [
                {"case": e.case, "fingerprints": list(e.fingerprints), "reason": e.reason}
                for e in baseline.entries
            ]
            if baseline
            else [],
            "stale": run.stale,
        },
        "aborted": run.aborted,
        "summary": {v.value: n for v, n in Counter(r.verdict for r in run.results).items()},
        "cases": [
            {
                "id": r.case_id,
                "clause": r.clause,
                "level": r.level,
                "verdict": r.verdict.value,
                **({"reason": r.reason} if r.verdict is not Verdict.PASS and r.reason else {}),
                **({"baseline_reason": r.baseline_reason} if r.baseline_reason else {}),
                **({"findings": list(r.findings())} if r.findings() else {}),
            }
            for r in run.results
        ],
    }


def write_report(path: str, report: dict[str, Any]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def load_reports(folder: str) -> list[dict[str, Any]]:
    reports = []
    for path in sorted(Path(folder).glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict) and data.get("schema") == SCHEMA:
            data["_file"] = path.name
            reports.append(data)
    return reports


def clause_mark(cases: Sequence[dict[str, Any]]) -> str:
    """One clause of one report: failing beats known beats passing beats skipped."""
    verdicts = {c["verdict"] for c in cases}
    if verdicts & {Verdict.FAIL.value, Verdict.ERROR.value}:
        return "fail"
    if Verdict.XFAIL.value in verdicts:
        return "known"
    if Verdict.PASS.value in verdicts:
        return "pass"
    return "skip" if cases else "absent"


def column(report: dict[str, Any]) -> str:
    implementation = report["implementation"]
    return f"{implementation['name']} {implementation['version']} (`{report['protocol']}`)"


def matrix(reports: Sequence[dict[str, Any]]) -> str:
    """The markdown of docs/implementations.md."""
    lines = [
        "# Implementations",
        "",
        "What the conformance harness found on each implementation it was run against, rendered by",
        "`conformance report docs/reports --out docs/implementations.md` from the reports committed in",
        "[`docs/reports/`](reports/) (each written by `conformance run --report FILE`). A cell is a clause",
        "as that protocol reads it (docs/conformance.md): "
        f"{MARKS['pass']} every case passed, {MARKS['fail']} a case failed, {MARKS['known']} a known "
        f"failure (in the report's baseline, with its reason below), {MARKS['skip']} skipped (not served, "
        "refused, or needing what the server does not promise); empty: not part of that protocol's profile.",
        "",
        "| implementation | protocol | date | harness | contract | result |",
        "|---|---|---|---|---|---|",
    ]
    for report in reports:
        lines.append(
            f"| {report['implementation']['name']} {report['implementation']['version']} | `{report['protocol']}` | "
            f"{report['date']} | {report['harness_version']} | r{report['contract_revision']} | {report['badge']} |"
        )
    by_report = [_by_clause(r) for r in reports]
    lines += ["", "| clause | level | " + " | ".join(column(r) for r in reports) + " |"]
    lines.append("|---|---|" + "---|" * len(reports))
    for clause in CLAUSES.values():
        marks = [clause_mark(cases.get(clause.id, [])) for cases in by_report]
        if all(m == "absent" for m in marks):
            continue
        lines.append(f"| {clause.id} | {clause.level.value} | " + " | ".join(MARKS[m] for m in marks) + " |")
    for report in reports:
        lines += _details(report)
    return "\n".join(lines) + "\n"


def _by_clause(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for case in report["cases"]:
        out.setdefault(case["clause"], []).append(case)
    return out


def _details(report: dict[str, Any]) -> list[str]:
    implementation = report["implementation"]
    lines = [
        "",
        f"## {implementation['name']} {implementation['version']} (`{report['protocol']}`)",
        "",
        f"Report [`{report['_file']}`](reports/{report['_file']}); model `{report['model']}`; as the server reports "
        f"itself: {json.dumps(implementation['as_reported'], ensure_ascii=False)}.",
    ]
    known = [c for c in report["cases"] if c["verdict"] == Verdict.XFAIL.value]
    failed = [c for c in report["cases"] if c["verdict"] in (Verdict.FAIL.value, Verdict.ERROR.value)]
    skipped = [c for c in report["cases"] if c["verdict"] == Verdict.SKIP.value]
    if failed:
        lines += ["", "Failed:", ""] + [f"- `{c['id']}`: {_cell(c.get('reason', ''))}" for c in failed]
    if known:
        by_reason: dict[str, list[str]] = {}
        for c in known:
            by_reason.setdefault(_cell(c.get("baseline_reason", "")), []).append(f"`{c['id']}`")
        lines += ["", "Known failures (the baseline's reasons):", ""]
        lines += [f"- {', '.join(ids)}: {reason}" for reason, ids in by_reason.items()]
    if skipped:
        reasons = Counter(_cell(c.get("reason", "")) for c in skipped)
        lines += ["", f"Skipped ({len(skipped)}):", ""]
        lines += [f"- {n} × {reason}" for reason, n in reasons.most_common()]
    return lines


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")[:400]
