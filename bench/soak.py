"""The reference server judged again and again beside busy loops: its verdict must not depend on load.

    python bench/soak.py [--runs 10] [--busy 2] [--protocols lmrpc,vllm-engine,sglang-scheduler,sglang-runtime]
                         [--level all] [--time-scale 0.5] [--out reports/soak]

Each run starts a fresh fake-engine reference server with the self-test's lane settings
(tests/selftest/protocols/lanes.py) and judges it in every protocol in turn, as the self-test does
(``conformance run`` in a subprocess, with the reference's known-failures baseline and the
protocols' ``--assume``). ``--busy`` processes spin beside it the whole time, each taking a core.
A run is clean when every protocol's run exits 0 with no failing case. One line per run and
protocol (passed, skipped, failing cases, seconds); exit 1 unless every run was clean.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reference_server.models.source import resolve_model
from reference_server.testing import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
KNOWN_FAILURES = ROOT / "tests" / "selftest" / "reference-known-failures.toml"
LANE_ARGS = (  # the self-test lane's: long requests stay in flight, small queue and KV limits reachable
    "--fake-token-delay", "0.002", "--kv-tokens", "100000", "--max-waiting-requests", "64", "--abort-grace", "2",
    "--sglang-scheduler-port", "0", "--sglang-runtime-port", "0",
)  # fmt: skip
ASSUME = {  # what the reference promises that the engine protocols cannot advertise
    "lmrpc": (),
    "vllm-engine": ("--assume", "deterministic_greedy,prefix_cache,seeded_sampling"),
    "sglang-scheduler": ("--assume", "deterministic_greedy,prefix_cache"),
    "sglang-runtime": ("--assume", "deterministic_greedy,prefix_cache"),
}
SPIN = "while True:\n    pass\n"


def target(server: ServerProcess, protocol: str) -> str:
    if protocol == "sglang-scheduler":
        return server.sglang_scheduler_target
    if protocol == "sglang-runtime":
        return server.sglang_runtime_target
    return server.target  # lmrpc.v1 and the vLLM dialect share the main port


def judge(server: ServerProcess, protocol: str, args: argparse.Namespace, report: Path) -> tuple[bool, str]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "conformance", "run", "--target", target(server, protocol), "--protocol", protocol,
         "--level", args.level, "--time-scale", str(args.time_scale), "--baseline", str(KNOWN_FAILURES),
         "--weights-path", str(resolve_model(None).path), "--json", str(report), "--quiet", *ASSUME[protocol]],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    seconds = time.monotonic() - started
    cases = json.loads(report.read_text())["cases"] if report.exists() else []
    verdicts = [c["verdict"] for c in cases]
    failing = sorted(c["id"] for c in cases if c["verdict"] not in ("PASS", "SKIP", "XFAIL"))
    clean = done.returncode == 0 and not failing and bool(cases)
    line = (
        f"{protocol:<17} {verdicts.count('PASS'):4d} passed {verdicts.count('SKIP'):3d} skipped "
        f"{seconds:6.0f} s exit {done.returncode}"
    )
    if failing:
        line += "  FAILING " + " ".join(failing)
    elif not cases:
        line += "  no report: " + done.stderr.strip()[-300:]
    return clean, line


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--busy", type=int, default=2, help="spinning processes beside the server")
    parser.add_argument("--protocols", default=",".join(ASSUME))
    parser.add_argument("--level", default="all", choices=("must", "should", "all"))
    parser.add_argument("--time-scale", type=float, default=0.5, help="as the self-test runs the harness")
    parser.add_argument("--out", default=str(ROOT / "reports" / "soak"))
    args = parser.parse_args()
    protocols = args.protocols.split(",")
    unknown = set(protocols) - ASSUME.keys()
    if unknown:
        parser.error(f"unknown protocol(s): {', '.join(sorted(unknown))}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"{args.runs} runs of {', '.join(protocols)} at --level {args.level}, {args.busy} busy loop(s), "
          f"{os.cpu_count()} cores", flush=True)  # fmt: skip
    clean_runs, in_a_row = 0, 0
    with ExitStack() as stack:
        for _ in range(args.busy):
            spinner = subprocess.Popen([sys.executable, "-c", SPIN])
            stack.callback(spinner.wait)
            stack.callback(spinner.kill)
        for run in range(1, args.runs + 1):
            with ServerProcess(engine="fake", args=LANE_ARGS) as server:
                results = [judge(server, p, args, out / f"run{run}-{p}.json") for p in protocols]
            clean = all(ok for ok, _ in results)
            clean_runs += clean
            in_a_row = in_a_row + 1 if clean else 0
            for _, line in results:
                print(f"run {run:2d} {'clean' if clean else 'NOT CLEAN'}  {line}", flush=True)
    print(f"\n{clean_runs}/{args.runs} runs clean, the last {in_a_row} in a row (load average now "
          f"{os.getloadavg()[0]:.2f})")  # fmt: skip
    sys.exit(0 if clean_runs == args.runs else 1)


if __name__ == "__main__":
    main()
