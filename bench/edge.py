"""The server's edge under attack: what a well-behaved client sees while another one misbehaves.

Two measurements, each against a fresh fake-engine server:

1. **Health latency under hostile input.** A probe client calls grpc.health.v1 Check every 20 ms on
   its own connection while an adversary sends, in a loop, one of the worst inputs (a 4 MiB
   Generate of one-byte unknown fields, an Abort naming 380,000 ids, a text prompt just under
   4 MiB, damaged bodies, a 4 GiB length prefix). Reported: p50 / p99 / max of the probe, and
   whether the server was still serving afterwards. Goal: p99 < 100 ms.
2. **Memory under stalled readers.** 256 streams whose clients never read (an HTTP/2 window of
   2 KiB, never reopened) ask for 8,000 tokens each; after ``--stall-s`` seconds: frontend RSS
   growth, and the time of a normal 12-token request from another client.

``--compare REV`` runs the same against another git revision of the server, side by side.

    .venv/bin/python bench/edge.py [--seconds 6] [--compare adc129b]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Cardinality
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest

from conformance.search.malformed import message_descriptor, mutants, named_faults
from conformance.stream.h2call import H2Call, frame
from conformance.stream.live import RawMessage
from conformance.stream.wire import length_field
from lmrpc.v1 import GenerateRequest, StoppingCriteria
from reference_server.testing import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
GENERATE = "/lmrpc.v1.InferenceService/Generate"
ABORT = "/lmrpc.v1.ControlService/Abort"
MiB = 1024 * 1024


def _attacks() -> dict[str, Callable[[Channel, int], Coroutine[Any, Any, None]]]:
    unknown_tags = b"\x78\x00" * (2 * MiB - 16)
    abort_ids = length_field(1, b"".join(length_field(1, f"id-{i}".encode()) for i in range(380_000)))
    big_text = bytes(
        GenerateRequest(text="word " * (4 * MiB // 5 - 64), stopping=StoppingCriteria(max_tokens=4))
    )
    seeds = [bytes(GenerateRequest(text="hi", stopping=StoppingCriteria(max_tokens=2)))]
    damaged = mutants(seeds, named_faults(message_descriptor("lmrpc.v1.GenerateRequest")), random.Random(1))

    async def send(channel: Channel, path: str, body: bytes) -> None:
        try:
            async with channel.request(
                path, Cardinality.UNARY_STREAM, RawMessage, RawMessage, timeout=60
            ) as call:
                await call.send_message(RawMessage(body), end=True)
                async for _ in call:
                    pass
        except (GRPCError, TimeoutError, ConnectionError, OSError):
            pass

    async def prefix_4gib(channel: Channel, port: int) -> None:
        call = H2Call("127.0.0.1", port)
        try:
            await call.__aenter__()
            call.start(GENERATE)
            call.send(frame(b"", length=0xFFFFFFFF) + b"\x00" * 60_000)
            await call.wait(30)
        except (TimeoutError, OSError):
            pass
        finally:
            await call.__aexit__()

    return {
        "4 MiB of one-byte unknown fields": lambda ch, port: send(ch, GENERATE, unknown_tags),
        "Abort naming 380,000 ids": lambda ch, port: send(ch, "/lmrpc.v1.ControlService/Abort", abort_ids),
        "text prompt just under 4 MiB": lambda ch, port: send(ch, GENERATE, big_text),
        "damaged Generate bodies": lambda ch, port: send(ch, GENERATE, next(damaged)),
        "4 GiB length prefix": prefix_4gib,
    }


async def _probe(
    port: int, seconds: float, attack: Callable[[Channel, int], Coroutine[Any, Any, None]]
) -> dict[str, object]:
    probe, hostile = Channel("127.0.0.1", port), Channel("127.0.0.1", port)
    latencies: list[float] = []
    stop = asyncio.Event()

    async def adversary() -> int:
        sent = 0
        while not stop.is_set():
            await attack(hostile, port)
            sent += 1
        return sent

    task = asyncio.create_task(adversary())
    give_up = time.monotonic() + seconds
    failures = 0
    while time.monotonic() < give_up:
        started = time.perf_counter()
        try:
            await HealthStub(probe).Check(HealthCheckRequest(), timeout=30)
        except (GRPCError, TimeoutError, OSError):
            failures += 1
        latencies.append(time.perf_counter() - started)
        await asyncio.sleep(0.02)
    stop.set()
    try:
        sent = await asyncio.wait_for(task, 60)
    except TimeoutError:
        task.cancel()
        sent = -1
    serving = True
    try:
        await HealthStub(probe).Check(HealthCheckRequest(), timeout=5)
        await _generate(probe)
    except Exception:
        serving = False
    probe.close()
    hostile.close()
    ordered = sorted(latencies)
    return {
        "p50_ms": 1000 * statistics.median(ordered),
        "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "max_ms": 1000 * ordered[-1],
        "probes": len(ordered),
        "probe_errors": failures,
        "attacks": sent,
        "serving_after": serving,
    }


async def _generate(channel: Channel) -> float:
    from lmrpc.v1 import InferenceServiceStub

    started = time.perf_counter()
    request = GenerateRequest(text="hello", stopping=StoppingCriteria(max_tokens=12, ignore_eos=True))
    async for _ in InferenceServiceStub(channel).generate(request, timeout=120):
        pass
    return time.perf_counter() - started


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _stalled(port: int, pid: int, streams: int, stall_s: float) -> dict[str, object]:
    before = _rss_mb(pid)
    calls = []
    for i in range(streams):
        call = H2Call("127.0.0.1", port, window=2048)
        await call.__aenter__()
        call.read_data = False
        call.start(GENERATE)
        request = GenerateRequest(
            request_id=f"stalled-{i}",
            text="never read",
            stopping=StoppingCriteria(max_tokens=8000, ignore_eos=True),
        )
        call.send(frame(bytes(request)), end=True)
        calls.append(call)
    await asyncio.sleep(stall_s)
    during = _rss_mb(pid)
    channel = Channel("127.0.0.1", port)
    try:
        normal_s = await asyncio.wait_for(_generate(channel), 120)
    except Exception:
        normal_s = float("nan")
    channel.close()
    for call in calls:
        await call.__aexit__()
    return {"rss_before_mb": before, "rss_stalled_mb": during, "normal_request_s": normal_s}


def _server(revision: str | None, args: tuple[str, ...]) -> tuple[ServerProcess, Path | None]:
    if revision is None:
        return ServerProcess(engine="fake", args=args).start(), None
    tree = Path(tempfile.mkdtemp(prefix="lmrpc-edge-")) / "tree"
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(tree), revision], cwd=ROOT, check=True, capture_output=True
    )
    code = f"import sys; sys.path.insert(0, {str(tree)!r}); from reference_server.cli import main; main()"
    return ServerProcess(engine="fake", args=args, launcher=("-c", code)).start(), tree


def _drop(tree: Path | None) -> None:
    if tree is not None:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)


def measure(
    revision: str | None, seconds: float, streams: int, stall_s: float
) -> dict[str, dict[str, object]]:
    results: dict[str, dict[str, object]] = {}
    for name, attack in _attacks().items():
        server, tree = _server(revision, ())
        try:
            results[name] = asyncio.run(_probe(server.port, seconds, attack))
        finally:
            server.stop()
            _drop(tree)
    server, tree = _server(revision, ("--fake-token-delay", "0.001"))
    try:
        assert server.process is not None
        results["stalled readers"] = asyncio.run(_stalled(server.port, server.process.pid, streams, stall_s))
    finally:
        server.stop()
        _drop(tree)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="probe time per attack")
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--stall-s", type=float, default=15.0)
    parser.add_argument("--compare", metavar="REV", help="also measure this git revision of the server")
    args = parser.parse_args()
    runs = {"this tree": measure(None, args.seconds, args.streams, args.stall_s)}
    if args.compare:
        runs[args.compare] = measure(args.compare, args.seconds, args.streams, args.stall_s)
    print(
        f"\n## health Check latency while an adversary loops (probe every 20 ms, {args.seconds:g} s each)\n"
    )
    print("| attack | " + " | ".join(f"{r}: p50 / p99 / max ms, serving after" for r in runs) + " |")
    print("|---|" + "---|" * len(runs))
    for attack in _attacks():
        cells = []
        for results in runs.values():
            r = results[attack]
            cells.append(
                f"{r['p50_ms']:.1f} / {r['p99_ms']:.1f} / {r['max_ms']:.0f}, {'yes' if r['serving_after'] else 'NO'}"
            )
        print(f"| {attack} | " + " | ".join(cells) + " |")
    print(f"\n## {args.streams} streams whose clients never read, after {args.stall_s:g} s\n")
    print("| server | frontend RSS before | with stalled streams | a normal 12-token request |")
    print("|---|---|---|---|")
    for name, results in runs.items():
        r = results["stalled readers"]
        print(
            f"| {name} | {r['rss_before_mb']:.0f} MB | {r['rss_stalled_mb']:.0f} MB | {r['normal_request_s']:.2f} s |"
        )
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"\nload average {' '.join(load)}; {sys.executable}")


if __name__ == "__main__":
    main()
