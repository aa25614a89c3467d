"""The commands behind the CLI: run, list, replay and report; each turns its arguments into the
harness's terms and hands the work to harness/execute.py (a run) or report/ (what is printed)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import random
import re
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape

from conformance.cases import all_cases
from conformance.drivers.base import Address, ConnectOptions, Promises
from conformance.harness.connect import parse_endpoint, protocol_of
from conformance.harness.execute import RunPlan, execute, not_run
from conformance.harness.runner import Progress
from conformance.harness.session import Budgets, ServerAccess, Tuning
from conformance.harness.target import Credentials, TlsOptions
from conformance.report import field_matrix, output
from conformance.report.baseline import Baseline, BaselineError
from conformance.report.coverage import list_coverage
from conformance.report.files import write_json, write_junit
from conformance.report.implementations import SCHEMA, Naming, load_reports, matrix, report_of, write_report
from conformance.report.listing import print_cases, print_profile, profile_rows
from conformance.report.model import EXIT_FAIL, EXIT_INFRA, EXIT_OK, RunReport, exit_code
from conformance.search.property import CI_PROFILE, EXPLORE_PROFILE
from conformance.spec import fields
from conformance.spec.profiles import PROFILES
from conformance.spec.protocols import protocol
from conformance.spec.registry import Case, expand_patterns, select
from conformance.stream import wiretap
from conformance.vocabulary import HARNESS_VERSION, CaseResult, Verdict
from lmrpc import CONTRACT_REVISION


class UsageError(Exception):
    """Bad arguments or input files (exit 2)."""


def _tls(args: argparse.Namespace) -> TlsOptions | None:
    if not (args.tls or args.tls_ca or args.tls_cert or args.tls_insecure):
        return None
    return TlsOptions(args.tls_ca, args.tls_cert, args.tls_key, args.tls_server_name, args.tls_insecure)


def _credentials(args: argparse.Namespace) -> Credentials:
    return Credentials(getattr(args, "token", None), getattr(args, "admin_token", None))


def _promises(args: argparse.Namespace) -> Promises | None:
    names = [n.strip() for value in getattr(args, "assume", []) for n in value.split(",") if n.strip()]
    if not names:
        return None
    if args.protocol != "auto" and protocol(args.protocol).advertises:
        raise ValueError(
            f"--assume is for protocols that advertise nothing: {args.protocol} advertises its capabilities"
        )
    return Promises.parse(names)


def _address(args: argparse.Namespace, target: str) -> Address:
    """Where ``target`` is for ``args.protocol`` (resolved here from ``auto`` on a URL)."""
    args.protocol = protocol_of(target, args.protocol)
    return parse_endpoint(target, args.protocol, _tls(args), _credentials(args), args.api_key)


def _profile(args: argparse.Namespace) -> tuple[str, int | None]:
    name = args.profile or ("explore" if args.seed is not None else "ci")
    if name == "ci":
        return CI_PROFILE, None
    return EXPLORE_PROFILE, args.seed if args.seed is not None else random.randrange(2**32)


def version_text() -> str:
    """``conformance --version``: the harness release, the contract revision it checks, and each
    protocol's profile revision and case count, as a baseline would pin them."""
    registry = all_cases()
    lines = [f"lmrpc conformance {HARNESS_VERSION}", f"contract revision {CONTRACT_REVISION}", "protocols:"]
    for protocol_id, profile in PROFILES.items():
        cases = select(registry, protocol=protocol_id, level="all", run=[], skip=[])
        applying = [c for c in cases if profile.case(c).applies]
        lines.append(
            f"  {protocol_id:<17} profile r{profile.revision}, {len(applying)} cases ({len(cases) - len(applying)} n/a)"
        )
    return "\n".join(lines)


def list_cases(args: argparse.Namespace) -> int:
    if args.coverage:
        return list_coverage(args, all_cases())
    cases = select(
        all_cases(), level=args.level, run=expand_patterns(args.run), skip=expand_patterns(args.skip)
    )
    if args.protocol:
        profile = PROFILES[args.protocol]
        print_profile(profile, profile_rows(profile, cases, args.level), as_json=args.json)
    else:
        print_cases(cases, as_json=args.json)
    return EXIT_OK


def _write_repros(results: list[CaseResult], directory: str) -> None:
    for result in results:
        if result.verdict is Verdict.FAIL and result.repro is not None and result.repro.script:
            os.makedirs(directory, exist_ok=True)
            path = os.path.join(
                directory, re.sub(r"[^A-Za-z0-9_.-]+", "_", result.case_id).strip("_") + ".py"
            )
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(result.repro.script)
            result.repro.script_path = path


def _access(args: argparse.Namespace, recorded: Mapping[str, Any] | None = None) -> ServerAccess:
    """The options that reach the server beyond its address; a rerun falls back on the recorded run's."""
    recorded = recorded or {}

    def pick(name: str) -> str | None:
        value = getattr(args, name, None) or recorded.get(name)
        return str(value) if value else None

    return ServerAccess(
        weights_path=pick("weights_path"),
        metrics_url=pick("metrics_url"),
        restart_hook=pick("restart_hook"),
        drain_hook=pick("drain_hook"),
        otlp_listen=pick("otlp_listen"),
    )


def _plan(
    args: argparse.Namespace, budgets: Budgets, tuning: Tuning, recorded: Mapping[str, Any] | None = None
) -> RunPlan:
    promises = _promises(args)
    profile, seed = _profile(args)
    options = ConnectOptions(
        connect_s=budgets.connect_s,
        call_s=budgets.stream_s,
        idle_s=budgets.idle_s,
        promises=promises or Promises(),
        model=args.model,
        parallel=args.parallel,
    )
    return RunPlan(
        args.protocol, budgets, tuning, options, profile, seed, args.jobs, args.wait, _access(args, recorded)
    )


def _settings(args: argparse.Namespace, plan: RunPlan) -> dict[str, object]:
    """What the report records of how the run was asked for."""
    return {
        "time_scale": args.time_scale,
        "profile": plan.profile,
        "seed": plan.seed,
        "examples": plan.tuning.examples,
        "pool_size": plan.tuning.pool_size,
        "jobs": args.jobs,
        "run": args.run,
        "skip": args.skip,
        "baseline": args.baseline,
        "assume": [n for value in args.assume for n in value.split(",") if n],
        "weights_path": args.weights_path,
        "metrics_url": args.metrics_url,
        "restart_hook": args.restart_hook,
        "drain_hook": args.drain_hook,
        "otlp_listen": args.otlp_listen,
    }


async def run(args: argparse.Namespace) -> int:
    try:
        baseline = Baseline.load(args.baseline) if args.baseline else None
        address = _address(args, args.target)
        plan = _plan(args, Budgets(scale=args.time_scale), Tuning.for_level(args.level, args.max_examples))
    except (BaselineError, ValueError) as exc:
        raise UsageError(str(exc)) from exc
    registry = all_cases()
    cases = select(
        registry,
        protocol=args.protocol,
        level=args.level,
        run=expand_patterns(args.run),
        skip=expand_patterns(args.skip),
    )
    if not cases:
        raise UsageError(f"no case matches --level {args.level} --run {args.run} --skip {args.skip}")
    started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    report = RunReport(
        str(address), [], level=args.level, started_at=started_at, settings=_settings(args, plan)
    )
    if baseline is not None and (warning := baseline.version_warning()):
        report.warnings.append(warning)
    out = output.writer(
        args.format,
        verbose=args.verbose,
        quiet=args.quiet,
        classify=(lambda r: baseline.marked(r, registry)) if baseline else (lambda r: r),
    )
    out.begin([c.id for c in cases])
    if args.fields:
        wiretap.start()
    started = time.monotonic()
    _cancel_on_sigterm()
    try:
        await execute(address, cases, plan, Progress(out.on_start, out.on_result), report, say=out.say)
    except asyncio.CancelledError:
        report.aborted = report.aborted or "interrupted"
    finally:
        report.duration_s = time.monotonic() - started
        _finish(args, report, cases, registry, baseline, out.say)
    out.end(report)
    return exit_code(report)


def _cancel_on_sigterm() -> None:
    """SIGTERM ends the run as an interruption does: the reports of what ran are still written."""
    task = asyncio.current_task()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: task.cancel() if task else None)


def _finish(
    args: argparse.Namespace,
    report: RunReport,
    cases: list[Case],
    registry: Sequence[Case],
    baseline: Baseline | None,
    say: Callable[[str], None],
) -> None:
    """The baseline applied, and every file the run was asked for written."""
    if not report.results:
        report.results = not_run(cases, {}, report.aborted or "not run")
    if baseline is not None:
        report.stale = baseline.apply(report.results, registry)
    if args.write_baseline:
        _write_baseline(baseline or Baseline(), report, registry, args.write_baseline, say)
    _write_repros(report.results, args.repro_dir)
    if args.fields and wiretap.ACTIVE is not None:
        wiretap.ACTIVE.write(args.fields, report.protocol)
    if args.json:
        write_json(report, args.json)
    if args.junit:
        write_junit(report, args.junit)
    if args.report:
        naming = Naming(args.implementation, args.implementation_version)
        write_report(args.report, report_of(report, naming, baseline, report.settings))


def field_coverage(args: argparse.Namespace) -> int:
    """``conformance coverage FILE...``: the field matrix of each protocol the files record."""
    try:
        seen = field_matrix.load(args.files)
    except (OSError, ValueError) as exc:
        raise UsageError(str(exc)) from exc
    tables = {protocol: fields.matrix(protocol, observed) for protocol, observed in seen.items()}
    stale = {protocol: fields.stale_reasons(protocol) for protocol in tables}
    print(field_matrix.render(tables, stale, every=args.all, as_json=args.json), end="")
    gaps = any(row.status == "GAP" for rows in tables.values() for row in rows)
    return EXIT_FAIL if gaps or any(stale.values()) else EXIT_OK


def render_matrix(args: argparse.Namespace) -> int:
    """``conformance report DIR``: the implementations x clauses matrix of the reports in DIR."""
    reports = load_reports(args.folder)
    if not reports:
        raise UsageError(f"no implementation reports ({SCHEMA}) in {args.folder}")
    text = matrix(reports)
    if args.out == "-":
        print(text, end="")
    else:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(text)
        print(f"wrote {args.out}: {len(reports)} reports")
    return EXIT_OK


def _write_baseline(
    baseline: Baseline, report: RunReport, registry: Sequence[Case], path: str, say: Callable[[str], None]
) -> None:
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    updated = baseline.updated(report.results, registry, today)
    try:
        updated.write(path)
    except OSError as exc:
        report.warnings.append(f"cannot write the baseline {path}: {exc}")
        return
    say(f"wrote {len(updated.entries)} known failure(s) to {path}")


async def replay(args: argparse.Namespace) -> int:
    previous = _previous_report(args.report)
    cases = _failed_cases(previous, set(args.cases))
    if not cases:
        print("nothing to replay: the report has no failures")
        return EXIT_OK
    settings = previous.get("settings", {})
    if args.seed is None and settings.get("seed") is not None:
        args.seed, args.profile = settings["seed"], args.profile or "explore"
    args.time_scale = args.time_scale if args.time_scale != 1.0 else settings.get("time_scale", 1.0)
    if args.protocol == "auto" and previous.get("protocol"):
        args.protocol = previous["protocol"]
    if not getattr(args, "assume", None) and settings.get("assume"):
        args.assume = list(settings["assume"])
    try:
        address = _address(args, str(args.target or previous.get("target") or ""))
        tuning = Tuning.for_level(previous.get("level", "all"), args.max_examples)
        plan = _plan(args, Budgets(scale=args.time_scale), tuning, settings)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    report = RunReport(str(address), [], level="all")
    await execute(address, cases, plan, Progress(), report)
    return _print_replay(report)


def _previous_report(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            previous = json.load(handle)
    except (OSError, ValueError) as exc:
        raise UsageError(f"report={path!r}: {exc}") from exc
    if not isinstance(previous, dict):
        raise UsageError(f"report={path!r} is no JSON report (schema lmrpc-conformance/1)")
    return previous


def _failed_cases(previous: Mapping[str, Any], named: set[str]) -> list[Case]:
    """The cases named, or else every failure of the report; an unknown id is a usage error."""
    wanted = named or {c["id"] for c in previous.get("cases", []) if c["verdict"] in ("FAIL", "ERROR")}
    cases = [c for c in all_cases() if c.id in wanted]
    unknown = wanted - {c.id for c in cases}
    if unknown:
        raise UsageError(f"no such case: {', '.join(sorted(unknown))}")
    return cases


def _print_replay(report: RunReport) -> int:
    console = Console(highlight=False)
    for r in report.results:
        word = {Verdict.PASS: "[green]FIXED", Verdict.FAIL: "[red]STILL FAILING"}.get(
            r.verdict, r.verdict.value
        )
        console.print(f"{word}[/] {escape(r.case_id)} {escape(r.reason)}")
        for m in r.mismatches:
            console.print(f"    {escape(m.render())}")
    if report.aborted:
        console.print(f"[red]{escape(report.aborted)}")
        return EXIT_INFRA
    return EXIT_FAIL if any(r.verdict.is_failure for r in report.results) else EXIT_OK
