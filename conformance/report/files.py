"""The machine-readable reports: versioned JSON and JUnit XML. Both are written even for partial runs."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from collections import defaultdict

from conformance.report.model import RunReport, failure_text
from conformance.spec.clauses import CLAUSES
from conformance.vocabulary import CaseResult, Verdict


def _atomic_write(path: str, text: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)


def write_json(report: RunReport, path: str) -> None:
    _atomic_write(path, json.dumps(report.to_json(), indent=2, ensure_ascii=False) + "\n")


def junit_xml(report: RunReport) -> str:
    groups: dict[str, list[CaseResult]] = defaultdict(list)
    for result in report.results:
        groups[CLAUSES[result.clause].section].append(result)
    root = ET.Element(
        "testsuites",
        name="lmrpc-conformance",
        tests=str(len(report.results)),
        time=f"{report.duration_s:.3f}",
    )
    for section, results in groups.items():
        failures = sum(r.verdict is Verdict.FAIL for r in results)
        errors = sum(r.verdict is Verdict.ERROR for r in results)
        skipped = sum(r.verdict in (Verdict.SKIP, Verdict.NOT_RUN, Verdict.XFAIL) for r in results)
        suite = ET.SubElement(
            root,
            "testsuite",
            name=section,
            tests=str(len(results)),
            failures=str(failures),
            errors=str(errors),
            skipped=str(skipped),
            time=f"{sum(r.duration_s for r in results):.3f}",
        )
        for result in results:
            case = ET.SubElement(
                suite,
                "testcase",
                classname=f"lmrpc.conformance.{result.level}",
                name=result.case_id,
                time=f"{result.duration_s:.3f}",
            )
            if result.verdict is Verdict.FAIL:
                ET.SubElement(
                    case, "failure", message=result.reason[:500], type="ConformanceFailure"
                ).text = failure_text(result, report.protocol)
            elif result.verdict is Verdict.ERROR:
                ET.SubElement(
                    case, "error", message=result.reason[:500], type="HarnessError"
                ).text = "\n".join(result.notes)
            elif result.verdict is Verdict.XFAIL:
                ET.SubElement(case, "skipped", message=f"known failure (baseline): {result.baseline_reason}")
            elif result.verdict in (Verdict.SKIP, Verdict.NOT_RUN):
                ET.SubElement(case, "skipped", message=f"{result.verdict.value}: {result.reason}")
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def write_junit(report: RunReport, path: str) -> None:
    _atomic_write(path, junit_xml(report))
