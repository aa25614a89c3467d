"""Serve every mutant (and an unmutated proxy) in one process, each on its own free port.

    python -m tests.selftest.zoo --upstream 127.0.0.1:50051 --ready-file /tmp/zoo.json

Once all are listening, the ready file holds ``{"mutant-name": port, ...}``; SIGTERM stops them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal

from grpclib.server import Server

from .mutants import MUTANTS
from .proxy import Proxy, make_server

REFERENCE = "reference-proxy"


async def serve(upstream: str, ready_file: str, only: set[str]) -> None:
    proxies: dict[str, Proxy] = {REFERENCE: Proxy(upstream)}
    proxies |= {m.name: m(upstream) for m in MUTANTS if not only or m.name in only}
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
    parser = argparse.ArgumentParser(prog="python -m tests.selftest.zoo", description=__doc__)
    parser.add_argument("--upstream", required=True, metavar="HOST:PORT")
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--only", default="", help="comma-separated mutant names (default: all)")
    args = parser.parse_args()
    asyncio.run(serve(args.upstream, args.ready_file, {n for n in args.only.split(",") if n}))


if __name__ == "__main__":
    main()
