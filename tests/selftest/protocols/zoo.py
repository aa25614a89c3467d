"""Serve one protocol's mutants (and an unmutated proxy) in one process, each on its own port.

    python -m tests.selftest.protocols.zoo --protocol vllm-engine --upstream 127.0.0.1:50051 \\
        --ready-file /tmp/zoo.json

Once all are listening, the ready file holds ``{"mutant-name": port, ...}``; SIGTERM stops them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal

from grpclib.server import Server

from .engine_proxy import EngineProxy, RuntimeProxy, SglangSchedulerProxy, VllmEngineProxy, make_server
from .sglang_runtime_faults import SGLANG_RUNTIME_MUTANTS
from .sglang_runtime_openai_faults import SGLANG_RUNTIME_OPENAI_MUTANTS
from .sglang_scheduler_faults import SGLANG_SCHEDULER_MUTANTS
from .vllm_engine_faults import VLLM_ENGINE_MUTANTS

REFERENCE = "reference-proxy"
ZOOS: dict[str, tuple[type[EngineProxy], tuple[type[EngineProxy], ...]]] = {
    "vllm-engine": (VllmEngineProxy, VLLM_ENGINE_MUTANTS),
    "sglang-scheduler": (SglangSchedulerProxy, SGLANG_SCHEDULER_MUTANTS),
    "sglang-runtime": (RuntimeProxy, SGLANG_RUNTIME_MUTANTS),
}
SERVED_BESIDE: dict[str, tuple[type[EngineProxy], ...]] = {  # judged by another profile's test
    "sglang-runtime": SGLANG_RUNTIME_OPENAI_MUTANTS,  # the OpenAI pass-through: --target sglang-runtime://
}


async def serve(protocol: str, upstream: str, ready_file: str) -> None:
    reference, mutants = ZOOS[protocol]
    proxies: dict[str, EngineProxy] = {REFERENCE: reference(upstream)}
    proxies |= {m.name: m(upstream) for m in (*mutants, *SERVED_BESIDE.get(protocol, ()))}
    servers = {}
    for name, proxy in proxies.items():
        server = make_server(proxy)
        await server.start("127.0.0.1", 0)
        servers[name] = server
    ports = {name: _port(server) for name, server in servers.items()}
    tmp = f"{ready_file}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(ports, handle)
    os.replace(tmp, ready_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for server in servers.values():
        server.close()
    await asyncio.gather(*(s.wait_closed() for s in servers.values()))


def _port(server: Server) -> int:
    listening = server._server
    assert isinstance(listening, asyncio.Server)
    return int(listening.sockets[0].getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.selftest.protocols.zoo", description=__doc__)
    parser.add_argument("--protocol", required=True, choices=sorted(ZOOS))
    parser.add_argument("--upstream", required=True, metavar="HOST:PORT")
    parser.add_argument("--ready-file", required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.protocol, args.upstream, args.ready_file))


if __name__ == "__main__":
    main()
