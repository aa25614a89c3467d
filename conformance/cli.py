"""``conformance``: run the lmrpc.v1 conformance cases against a server that is already running,
over lmrpc.v1, one of smg's engine protocols, or the OpenAI-compatible HTTP API.

    conformance run --target 127.0.0.1:50051 --level must --junit out/junit.xml --json out/report.json
    conformance run --target 127.0.0.1:30000 --protocol sglang-scheduler --assume deterministic_greedy
    conformance run --target http://127.0.0.1:8080 --wait 120 --report reports/llama.cpp.json
    conformance list [--level must] [--run 'ABORT-*'] [--protocol vllm-engine]
    conformance replay out/report.json [CASE_ID ...] [--target host:port]
    conformance report reports/ --out docs/implementations.md

Exit codes: 0 pass, 1 conformance failure, 2 usage error, 3 target unreachable or harness /
infrastructure error, 4 stale baseline (and nothing else wrong).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from conformance.report.model import EXIT_USAGE
from conformance.report.output import FORMATS
from conformance.spec.protocols import PROTOCOLS, cli_help


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be > 0")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be >= 1")
    return value


def _selection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--level",
        choices=("must", "should", "all"),
        default="all",
        help="which clause level to check (default: all)",
    )
    parser.add_argument(
        "--run",
        action="append",
        default=[],
        metavar="GLOB",
        help="only cases matching GLOB (case or clause ID, * and ? wildcards, @file); repeatable",
    )
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="GLOB",
        help="leave out matching cases (for cases that crash or wedge the target); repeatable",
    )


def _protocol(parser: argparse.ArgumentParser, *, default: str) -> None:
    parser.add_argument(
        "--protocol",
        choices=("auto", *PROTOCOLS),
        default=default,
        help=cli_help(),
    )


def _target(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument(
        "--target",
        required=required,
        metavar="HOST:PORT|URL",
        help="the server under test: host:port (gRPC) or http(s)://host:port[/prefix] (OpenAI API; "
        "the prefix defaults to /v1), or sglang-runtime://host:port (the OpenAI API through SGLang's "
        "native gRPC service)",
    )
    _protocol(parser, default="auto")
    parser.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="first wait up to SECONDS for the target to be ready (health SERVING; an OpenAI server "
        "listing its models), instead of failing at once on a server that is still starting",
    )
    for add_arguments in (_openai_arguments, _run_arguments, _server_arguments, _connection_arguments):
        add_arguments(parser)


def _openai_arguments(parser: argparse.ArgumentParser) -> None:
    """What an OpenAI-compatible HTTP target needs."""
    openai = parser.add_argument_group("OpenAI-compatible HTTP (--protocol openai)")
    openai.add_argument("--model", metavar="ID", help="the model to use (default: the first of /v1/models)")
    openai.add_argument("--api-key", metavar="KEY", help="sent as Authorization: Bearer KEY (AUTH-1)")
    openai.add_argument(
        "--parallel",
        type=_positive_int,
        default=None,
        metavar="N",
        help="requests the server runs at once, when it does not say (llama.cpp's /props does); sizes the "
        "answer pool and the disconnect and flow cases (default: measured on a slow server, else 4)",
    )


def _run_arguments(parser: argparse.ArgumentParser) -> None:
    """What the server promises, and how long and how hard the run tries."""
    parser.add_argument(
        "--assume",
        action="append",
        default=[],
        metavar="NAME",
        help="what an engine-protocol or sglang-runtime server promises that its protocol cannot advertise: "
        "deterministic_greedy, seeded_sampling (vllm-engine), prefix_cache; repeatable, comma-separated",
    )
    parser.add_argument(
        "--time-scale",
        type=_positive_float,
        default=1.0,
        metavar="F",
        help="multiply every timeout and budget by F (slow hardware, cold models)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        metavar="N",
        help="hypothesis seed; implies --profile explore unless a profile is given",
    )
    parser.add_argument(
        "--profile",
        choices=("ci", "explore"),
        default=None,
        help="ci: derandomized, no database (default); explore: random, local database",
    )
    parser.add_argument(
        "--max-examples",
        type=_positive_int,
        default=None,
        metavar="N",
        help="examples per property case (default: tuned per level)",
    )
    parser.add_argument(
        "--jobs",
        "-j",
        type=_positive_int,
        default=4,
        metavar="N",
        help="cases run concurrently (exclusive cases always run alone; default 4)",
    )


def _server_arguments(parser: argparse.ArgumentParser) -> None:
    """What the harness may reach on the server's side: weights, metrics, hooks, spans."""
    parser.add_argument(
        "--weights-path",
        metavar="PATH",
        help="a checkpoint of the weights the server serves, as a path on the server's host: ADMIN-2[reload] "
        "loads it with UpdateWeights (skipped without it)",
    )
    parser.add_argument(
        "--metrics-url",
        metavar="URL",
        help="the server's Prometheus endpoint (http://HOST:PORT/metrics): LOAD-2 compares the gauges the "
        "Kubernetes inference gateway reads with GetLoad (skipped without it)",
    )
    hooks = parser.add_argument_group(
        "server control (shell commands the harness runs; cases that need one skip without it)"
    )
    hooks.add_argument(
        "--restart-hook",
        metavar="CMD",
        help="restarts the server process and returns (the harness then waits for it to serve on the same "
        "address): SVC-4[restart] checks that its ServerInfo names a new instance. Runs after every other case",
    )
    hooks.add_argument(
        "--drain-hook",
        metavar="CMD",
        help="begins the server's shutdown, as SIGTERM does (e.g. 'kill -TERM $(cat server.pid)'): LIFE-1[drain] "
        "checks health, refusals and the streams in flight while it drains. Runs last: the server is gone after it",
    )
    parser.add_argument(
        "--otlp-listen",
        metavar="HOST:PORT",
        help="receive the server's OTLP/HTTP spans here (point its exporter at http://HOST:PORT/v1/traces): "
        "TRACE-1 checks that a call's spans continue the caller's W3C traceparent (skipped without it)",
    )


def _connection_arguments(parser: argparse.ArgumentParser) -> None:
    """TLS and credentials."""
    tls = parser.add_argument_group("TLS")
    tls.add_argument("--tls", action="store_true", help="connect with TLS instead of plaintext HTTP/2")
    tls.add_argument("--tls-ca", metavar="FILE", help="CA bundle to verify the server with")
    tls.add_argument("--tls-cert", metavar="FILE", help="client certificate (mutual TLS)")
    tls.add_argument("--tls-key", metavar="FILE", help="client key (mutual TLS)")
    tls.add_argument("--tls-server-name", metavar="NAME", help="name to verify in the server certificate")
    tls.add_argument("--tls-insecure", action="store_true", help="do not verify the server certificate")
    auth = parser.add_argument_group("authentication (servers with Capabilities.authentication)")
    auth.add_argument(
        "--token",
        metavar="TOKEN",
        help="bearer token of a principal with the client role, sent on every call",
    )
    auth.add_argument(
        "--admin-token",
        metavar="TOKEN",
        help="bearer token of an admin principal, for pause/resume/flush and Abort of all (AUTH-2)",
    )


class _VersionAction(argparse.Action):
    """``--version``: what a baseline pins, built only when asked (it loads the case library)."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from conformance.commands import version_text

        print(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="conformance",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument(
        "--version",
        action=_VersionAction,
        help="the harness release, contract revision and protocol profiles",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="check a running server (never spawns one)")
    _target(run, required=True)
    _selection(run)
    run.add_argument("--baseline", metavar="FILE", help="TOML file of known failures (each with a reason)")
    run.add_argument(
        "--write-baseline",
        metavar="FILE",
        help="after the run, write the baseline it calls for: still-failing entries kept, stale ones "
        "dropped, new failures added (may be the --baseline file itself)",
    )
    run.add_argument("--junit", metavar="FILE", help="write JUnit XML here")
    run.add_argument("--json", metavar="FILE", help="write the JSON report (schema lmrpc-conformance/1) here")
    run.add_argument(
        "--report",
        metavar="FILE",
        help="write the implementation report here (who the server says it is, every verdict, the "
        "baseline applied), for `conformance report DIR`",
    )
    run.add_argument(
        "--implementation",
        metavar="NAME",
        help="the implementation's name in the report, where the server does not say (smg, for one)",
    )
    run.add_argument("--implementation-version", metavar="VERSION", help="its version, likewise")
    run.add_argument(
        "--repro-dir",
        metavar="DIR",
        default="conformance-repro",
        help="write one repro script per failure here (default: ./conformance-repro)",
    )
    run.add_argument(
        "--format",
        choices=FORMATS,
        default="auto",
        help="console output: table (progress bar, tables, panels: a terminal), lines (one line per case, "
        "then each failure: a CI log), github (lines, ::error annotations and the job summary); auto: "
        "github under GITHUB_ACTIONS=true, lines when CI is set or standard output is no terminal, else table",
    )
    run.add_argument(
        "--fields",
        metavar="FILE",
        help="record every field each case sends and reads on the wire and write them here, for "
        "`conformance coverage`",
    )
    run.add_argument("--verbose", "-v", action="store_true", help="show every case and print repro scripts")
    run.add_argument("--quiet", "-q", action="store_true", help="print only failures and the summary line")

    listing = commands.add_parser("list", help="list the cases: ID, clause, level, required capabilities")
    _selection(listing)
    listing.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        default=None,
        help="print that protocol's clause profile: whether each clause applies, how it reads, or why not",
    )
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.add_argument(
        "--coverage",
        action="store_true",
        help="which cases send each input class and observe each MUST sentence; exit 1 on a gap",
    )

    matrix = commands.add_parser(
        "report", help="render the implementations x clauses matrix from a folder of implementation reports"
    )
    matrix.add_argument(
        "folder", metavar="DIR", help="a folder of reports written by `conformance run --report`"
    )
    matrix.add_argument(
        "--out", metavar="FILE", default="-", help="write the markdown here (default: standard output)"
    )

    coverage = commands.add_parser(
        "coverage",
        help="every field of each protocol's schema: sent or read by which cases, n/a and why, or a gap "
        "(exit 1 on a gap)",
    )
    coverage.add_argument(
        "files", nargs="+", metavar="FILE", help="field files written by `conformance run --fields`"
    )
    coverage.add_argument("--all", action="store_true", help="print every field, not only the gaps")
    coverage.add_argument("--json", action="store_true", help="print JSON instead of text")

    replay = commands.add_parser("replay", help="re-run the failed cases of a JSON report")
    replay.add_argument("report", help="a JSON report written by `conformance run --json`")
    replay.add_argument(
        "cases", nargs="*", metavar="CASE_ID", help="only these cases (default: every failure)"
    )
    _target(replay, required=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help exits 0, a usage error 2
        return int(exc.code or 0)
    from conformance import commands as app

    try:
        if args.command == "list":
            return app.list_cases(args)
        if args.command == "replay":
            return asyncio.run(app.replay(args))
        if args.command == "report":
            return app.render_matrix(args)
        if args.command == "coverage":
            return app.field_coverage(args)
        return asyncio.run(app.run(args))
    except app.UsageError as exc:
        print(f"conformance: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
