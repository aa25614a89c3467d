"""Lanes for the self-test: each lane is one reference server (fake engine) plus a zoo serving every
mutant in front of it. Mutants that share a lane run one after another, because load-watching cases
need a quiet server; lanes run side by side."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from grpclib import GRPCError
from harness_cli import harness_command
from zoo_process import start_zoo

from conformance.spec.coverage import CLASSES
from conformance.spec.registry import REGISTRY
from lmrpc.client import LmrpcClient
from lmrpc.v1 import ResumeGenerationRequest
from reference_server.models.source import resolve_model
from reference_server.testing import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
KNOWN_FAILURES = Path(__file__).with_name(
    "reference-known-failures.toml"
)  # the reference's own, with the fix
TOKEN_DELAY_S = "0.002"  # long requests stay in flight for seconds, so cancel and deadline cases bite
KV_TOKENS = "100000"  # small enough that n=max_outputs full-window requests can never fit (REQ-7)
MAX_WAITING = "64"  # small enough that CAP-5[max_waiting_requests] can reach it
ABORT_GRACE_S = "2"  # ABORT-6[after-expiry] waits the grace out in every run (5 s by default)


@dataclass
class Lane:
    server: ServerProcess
    zoo: subprocess.Popen[bytes]
    ports: dict[str, int] = field(default_factory=dict)

    @staticmethod
    def start(timeout_s: float = 120.0) -> Lane:
        lane_args = (
            "--fake-token-delay",
            TOKEN_DELAY_S,
            "--kv-tokens",
            KV_TOKENS,
            "--max-waiting-requests",
            MAX_WAITING,
            "--abort-grace",
            ABORT_GRACE_S,
        )
        server = ServerProcess(engine="fake", args=lane_args).start()
        try:
            _warm_profiler(server.target)
            zoo, ports = start_zoo("tests.selftest.zoo", "--upstream", server.target, timeout_s=timeout_s)
        except BaseException:
            server.stop()
            raise
        return Lane(server, zoo, ports)

    def target(self, mutant: str) -> str:
        return f"127.0.0.1:{self.ports[mutant]}"

    def reset(self, timeout_s: float = 30.0) -> None:
        """Leave the upstream as a fresh server: nothing paused, nothing recorded, nothing in flight
        (leaks included)."""

        async def settle() -> None:
            async with LmrpcClient.connect(self.server.target) as client:
                await client.control.resume_generation(ResumeGenerationRequest())
                with contextlib.suppress(GRPCError):  # FAILED_PRECONDITION: nothing was recording
                    await client.stop_profile()
                give_up = time.monotonic() + timeout_s
                while time.monotonic() < give_up:
                    await client.abort(everything=True)
                    load = await client.load()
                    if not (load.active_requests or load.running_sequences or load.waiting_sequences):
                        return
                    await asyncio.sleep(0.1)

        asyncio.run(settle())

    def stop(self) -> None:
        if self.zoo.poll() is None:
            self.zoo.send_signal(signal.SIGTERM)
            try:
                self.zoo.wait(10)
            except subprocess.TimeoutExpired:
                self.zoo.kill()
        self.server.stop()


def _warm_profiler(target: str) -> None:
    """Record nothing once: the fake engine's scheduler imports torch at its first StartProfile,
    which on a busy machine holds every request of the lane for tens of seconds; the first mutant
    of a lane would pay for it inside ADMIN-1 and whatever ran beside it."""

    async def record_nothing() -> None:
        async with LmrpcClient.connect(target) as client:
            await client.start_profile()
            await client.stop_profile()

    asyncio.run(record_nothing())


@dataclass
class Outcome:
    mutant: str
    exit_code: int
    failing: set[str]
    report: dict[str, object]
    duration_s: float


def triggered(report: dict[str, object], classes: frozenset[str]) -> set[str]:
    """The cases of a run that sent an input of one of ``classes`` (spec/coverage.py): what their
    calls sent, as the report records it, and the scenarios they declare. A mutant whose fault an
    input class sets off may fail any of them: whether a case's checks see the fault depends on what
    it drew and how its calls interleaved, not on the case's name."""
    if not classes:
        return set()
    hits = set()
    for entry in _cases(report):
        case = REGISTRY.get(entry["id"])
        declared = {s for s in case.sends if CLASSES[s].sent is None} if case is not None else set()
        if classes & (set(entry.get("sent", [])) | declared):
            hits.add(entry["id"])
    return hits


def _cases(report: dict[str, object]) -> list[dict[str, str]]:
    cases = report.get("cases", [])
    assert isinstance(cases, list)
    return cases


def run_harness(
    target: str, out_dir: Path, name: str, *, time_scale: float, extra: tuple[str, ...] = ()
) -> Outcome:
    """``conformance run`` as a user runs it: the installed CLI in a subprocess, reports to files."""
    report = out_dir / f"{name}.json"
    started = time.monotonic()
    done = subprocess.run(
        [
            *harness_command(),
            "run",
            "--target",
            target,
            "--json",
            str(report),
            "--junit",
            str(out_dir / f"{name}.xml"),
            "--repro-dir",
            str(out_dir / f"{name}-repro"),
            "--time-scale",
            str(time_scale),
            "--quiet",
            "--baseline",
            str(KNOWN_FAILURES),
            "--weights-path",  # the server's own checkpoint, for ADMIN-2[reload]
            str(resolve_model(None).path),
            *extra,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "120"},
    )
    data = json.loads(report.read_text()) if report.exists() else {"cases": []}
    failing = {c["id"] for c in data["cases"] if c["verdict"] not in ("PASS", "SKIP", "XFAIL")}
    if not report.exists():
        failing.add(f"(no report; exit {done.returncode}: {done.stderr[-400:]})")
    return Outcome(name, done.returncode, failing, data, time.monotonic() - started)
