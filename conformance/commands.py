"""The commands behind the CLI: run, list and replay."""

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
from rich.table import Table

from conformance.cases import all_cases
from conformance.drivers import Promises
from conformance.drivers.detect import DetectionError
from conformance.drivers.openai.target import HttpOptions, HttpTarget
from conformance.harness.connect import AnyEndpoint, connect, parse_endpoint, protocol_of, wait_until_ready
from conformance.harness.otlp import SpanReceiver
from conformance.harness.pace import measure_pace
from conformance.harness.refusals import learn_refusals
from conformance.harness.runner import Progress, run_all
from conformance.harness.session import Budgets, ServerAccess, Session, Tuning
from conformance.harness.target import Credentials, TlsOptions
from conformance.report import output
from conformance.report.baseline import Baseline, BaselineError
from conformance.report.coverage import list_coverage
from conformance.report.files import write_json, write_junit
from conformance.report.implementations import SCHEMA, Naming, load_reports, matrix, report_of, write_report
from conformance.report.model import EXIT_FAIL, EXIT_INFRA, EXIT_OK, RunReport, exit_code
from conformance.search.property import CI_PROFILE, EXPLORE_PROFILE
from conformance.spec.clauses import CLAUSES
from conformance.spec.profiles import PROFILES
from conformance.spec.registry import Case, expand_patterns, select
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
    if args.protocol == "lmrpc":
        raise ValueError("--assume is for engine protocols: an lmrpc.v1 server advertises its capabilities")
    return Promises.parse(names)


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
    for protocol, profile in PROFILES.items():
        cases = select(registry, protocol=protocol, level="all", run=[], skip=[])
        applying = [c for c in cases if profile.case(c).applies]
        lines.append(
            f"  {protocol:<17} profile r{profile.revision}, {len(applying)} cases ({len(cases) - len(applying)} n/a)"
        )
    return "\n".join(lines)


def list_cases(args: argparse.Namespace) -> int:
    if args.coverage:
        return list_coverage(args, all_cases())
    if args.protocol:
        return list_profile(args)
    cases = select(
        all_cases(), level=args.level, run=expand_patterns(args.run), skip=expand_patterns(args.skip)
    )
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "id": c.id,
                        "clause": c.clause.id,
                        "level": c.level.value,
                        "group": c.group,
                        "requires": list(c.requires),
                        "exclusive": c.exclusive,
                        "doc": c.doc,
                    }
                    for c in cases
                ],
                indent=2,
            )
        )
        return EXIT_OK
    table = Table(
        "case", "clause", "level", "requires", "doc", title=f"{len(cases)} cases", title_justify="left"
    )
    for c in cases:
        table.add_row(
            escape(c.id),
            c.clause.id,
            c.level.value,
            escape(", ".join(c.requires) or "-"),
            escape(c.doc.split("\n")[0]),
        )
    Console().print(table)
    return EXIT_OK


def list_profile(args: argparse.Namespace) -> int:
    """``conformance list --protocol X``: every clause, whether it applies there and how it reads
    there, or why it cannot be checked there; and the cases a profile leaves out of a clause."""
    profile = PROFILES[args.protocol]
    cases = select(
        all_cases(), level=args.level, run=expand_patterns(args.run), skip=expand_patterns(args.skip)
    )
    by_clause: dict[str, list[Case]] = {}
    for case in cases:
        by_clause.setdefault(case.clause.id, []).append(case)
    rows = []
    for clause in CLAUSES.values():
        if args.level != "all" and clause.level.value.lower() != args.level:
            continue
        reading = profile.clause(clause.id)
        own = by_clause.get(clause.id, [])
        runs = [c.id for c in own if profile.case(c).applies]
        left_out = {
            c.id: profile.case(c).text for c in own if not profile.case(c).applies and reading.applies
        }
        rows.append((clause, reading, runs, left_out))
    if args.json:
        print(
            json.dumps(
                {
                    "protocol": profile.protocol,
                    "clauses": [
                        {
                            "clause": clause.id,
                            "level": clause.level.value,
                            "applies": reading.applies,
                            "reads": reading.text,
                            "cases": runs,
                            "cases_left_out": left_out,
                        }
                        for clause, reading, runs, left_out in rows
                    ],
                },
                indent=2,
            )
        )
        return EXIT_OK
    applying = sum(reading.applies for _, reading, _, _ in rows)
    table = Table(
        "clause",
        "level",
        "applies",
        "how it reads there, or why not",
        "cases",
        title=f"{profile.title} ({profile.protocol}): {applying} of {len(rows)} clauses apply",
        title_justify="left",
    )
    for clause, reading, runs, left_out in rows:
        note = reading.text or "as written"
        if left_out:
            note += "; not " + "; not ".join(f"{i}: {why}" for i, why in left_out.items())
        table.add_row(
            clause.id,
            clause.level.value,
            "yes" if reading.applies else "no",
            escape(note),
            escape(", ".join(runs) or "-"),
        )
    Console().print(table)
    return EXIT_OK


def _not_run(cases: list[Case], done: dict[str, CaseResult], reason: str) -> list[CaseResult]:
    return [
        done.get(c.id) or CaseResult(c.id, c.clause.id, c.level.value, Verdict.NOT_RUN, reason=reason)
        for c in cases
    ]


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


async def execute(
    endpoint: AnyEndpoint,
    cases: list[Case],
    *,
    protocol: str = "lmrpc",
    promises: Promises | None = None,
    budgets: Budgets,
    tuning: Tuning,
    profile: str,
    seed: int | None,
    jobs: int,
    progress: Progress,
    report: RunReport,
    http: HttpOptions | None = None,
    wait_s: float = 0.0,
    access: ServerAccess | None = None,
    say: Callable[[str], None] = lambda line: None,
) -> None:
    """Connect, measure the server's pace, run ``cases`` and fill ``report``; partial results survive
    interruption. ``say`` prints what the run chose."""
    done: dict[str, CaseResult] = {}
    inner_result = progress.on_result

    def on_result(result: CaseResult) -> None:
        done[result.case_id] = result
        inner_result(result)

    progress.on_result = on_result
    try:
        if wait_s > 0:
            report.settings["waited"] = await wait_until_ready(endpoint, wait_s, budgets)
        wire, how = await connect(endpoint, protocol, promises, budgets, http or HttpOptions())
    except DetectionError as exc:
        report.aborted = f"target {endpoint}: {exc}"
        report.results = _not_run(cases, done, report.aborted)
        return
    except Exception as exc:  # unreachable, refused, TLS, not a server of the protocol...
        report.aborted = f"target {endpoint} unreachable: {type(exc).__name__}: {exc}"
        report.results = _not_run(cases, done, report.aborted)
        return
    session = Session(wire, budgets, tuning, seed=seed, profile=profile, access=access or ServerAccess())
    if session.access.otlp_listen:
        session.spans = SpanReceiver()
        try:
            await session.spans.start(session.access.otlp_listen)
        except OSError as exc:
            report.aborted = f"--otlp-listen {session.access.otlp_listen}: {exc}"
            report.results = _not_run(cases, done, report.aborted)
            await session.aclose()
            return
    report.protocol = session.protocol
    report.settings["protocol"] = how
    server = wire.info.server
    report.server = {
        "name": server.server_name,
        "version": server.server_version,
        "contract_revision": server.contract_revision,
        "model": wire.info.model.model_id,
    }
    if isinstance(wire, HttpTarget):
        report.server["identity"] = {"source": wire.identity.source, **wire.identity.answers}
        report.settings["support"] = wire.support.to_json()
        report.settings["tokenizer"] = str(wire.tokenizer) if wire.tokenizer else None
    try:
        await learn_refusals(session)
        if session.info.refusals:
            report.settings["refusals"] = dict(session.info.refusals)
            say("refused by design: " + "; ".join(f"{k} ({v})" for k, v in session.info.refusals.items()))
        jobs = await _pace(session, jobs, report, say)
        if isinstance(wire, HttpTarget):
            report.settings["parallel"], report.settings["parallel_source"] = (
                wire.parallel,
                wire.parallel_source,
            )
        report.results = await run_all(session, cases, jobs=jobs, progress=progress)
    except asyncio.CancelledError:
        report.aborted = "interrupted"
        report.results = _not_run(cases, done, "interrupted")
    finally:
        await session.aclose()
    down = [
        r.reason
        for r in report.results
        if r.verdict is Verdict.NOT_RUN and r.reason.startswith("target down")
    ]
    if down:
        report.aborted = down[0]


async def _pace(session: Session, jobs: int, report: RunReport, say: Callable[[str], None]) -> int:
    """Size budgets and concurrency from the server's measured pace (harness/pace.py); the number
    of cases to run at once. A server that cannot answer the measurement runs at the flags' settings:
    the cases then say what is wrong."""
    try:
        pace = await measure_pace(session, jobs)
    except Exception as exc:
        report.settings["pace"] = f"not measured: {type(exc).__name__}: {exc}"
        say(
            f"pace not measured ({type(exc).__name__}: {exc}); budgets at --time-scale {session.budgets.scale}"
        )
        return jobs
    if (
        isinstance(session.wire, HttpTarget)
        and session.wire.parallel_source == "assumed"
        and pace.measured_parallel
    ):
        session.wire.parallel, session.wire.parallel_source = pace.parallel, "measured"
    report.settings["pace"] = pace.to_json()
    report.settings["jobs"] = pace.jobs
    say(pace.describe())
    return pace.jobs


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


def _http(args: argparse.Namespace, budgets: Budgets, promises: Promises | None) -> HttpOptions:
    return HttpOptions(
        model=args.model,
        promises=promises or Promises(),
        parallel=args.parallel,
        connect_s=budgets.connect_s,
        call_s=budgets.stream_s,
        idle_s=budgets.idle_s,
    )


async def run(args: argparse.Namespace) -> int:
    try:
        baseline = Baseline.load(args.baseline) if args.baseline else None
        args.protocol = protocol_of(args.target, args.protocol)
        endpoint = parse_endpoint(args.target, args.protocol, _tls(args), _credentials(args), args.api_key)
        tuning = Tuning.for_level(args.level, args.max_examples)
        promises = _promises(args)
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
    profile, seed = _profile(args)
    budgets = Budgets(scale=args.time_scale)
    report = RunReport(
        str(endpoint),
        [],
        level=args.level,
        started_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        settings={
            "time_scale": args.time_scale,
            "profile": profile,
            "seed": seed,
            "examples": tuning.examples,
            "pool_size": tuning.pool_size,
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
        },
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
    progress = Progress(out.on_start, out.on_result)
    started = time.monotonic()
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGTERM, lambda: task.cancel() if task else None)
    try:
        await execute(
            endpoint,
            cases,
            protocol=args.protocol,
            promises=promises,
            budgets=budgets,
            tuning=tuning,
            profile=profile,
            seed=seed,
            jobs=args.jobs,
            progress=progress,
            report=report,
            http=_http(args, budgets, promises),
            wait_s=args.wait,
            access=_access(args),
            say=out.say,
        )
    except asyncio.CancelledError:
        report.aborted = report.aborted or "interrupted"
    finally:
        report.duration_s = time.monotonic() - started
        if not report.results:
            report.results = _not_run(cases, {}, report.aborted or "not run")
        if baseline is not None:
            report.stale = baseline.apply(report.results, registry)
        if args.write_baseline:
            _write_baseline(baseline or Baseline(), report, registry, args.write_baseline, out.say)
        _write_repros(report.results, args.repro_dir)
        if args.json:
            write_json(report, args.json)
        if args.junit:
            write_junit(report, args.junit)
        if args.report:
            naming = Naming(args.implementation, args.implementation_version)
            write_report(args.report, report_of(report, naming, baseline, report.settings))
    out.end(report)
    return exit_code(report)


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
    try:
        with open(args.report, encoding="utf-8") as handle:
            previous = json.load(handle)
    except (OSError, ValueError) as exc:
        raise UsageError(f"report={args.report!r}: {exc}") from exc
    wanted = set(args.cases) or {
        c["id"] for c in previous.get("cases", []) if c["verdict"] in ("FAIL", "ERROR")
    }
    cases = [c for c in all_cases() if c.id in wanted]
    unknown = wanted - {c.id for c in cases}
    if unknown:
        raise UsageError(f"no such case: {', '.join(sorted(unknown))}")
    if not cases:
        print("nothing to replay: the report has no failures")
        return EXIT_OK
    settings = previous.get("settings", {})
    if args.seed is None and settings.get("seed") is not None:
        args.seed, args.profile = settings["seed"], args.profile or "explore"
    args.time_scale = args.time_scale if args.time_scale != 1.0 else settings.get("time_scale", 1.0)
    target = args.target or previous.get("target")
    if args.protocol == "auto" and previous.get("protocol"):
        args.protocol = previous["protocol"]
    try:
        args.protocol = protocol_of(target, args.protocol)
        endpoint = parse_endpoint(target, args.protocol, _tls(args), _credentials(args), args.api_key)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    profile, seed = _profile(args)
    if not getattr(args, "assume", None) and previous.get("settings", {}).get("assume"):
        args.assume = list(previous["settings"]["assume"])
    try:
        promises = _promises(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    report = RunReport(str(endpoint), [], level="all")
    budgets = Budgets(scale=args.time_scale)
    await execute(
        endpoint,
        cases,
        protocol=args.protocol,
        promises=promises,
        budgets=budgets,
        tuning=Tuning.for_level(previous.get("level", "all"), args.max_examples),
        profile=profile,
        seed=seed,
        jobs=args.jobs,
        progress=Progress(),
        report=report,
        http=_http(args, budgets, promises),
        wait_s=args.wait,
        access=_access(args, settings),
    )
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
