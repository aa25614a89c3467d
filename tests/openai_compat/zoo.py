"""Serve the OpenAI mutants (and the correct proxy) in one process, each on a port of its own, in
front of one real OpenAI-compatible server.

    python -m tests.openai_compat.zoo --upstream http://127.0.0.1:8000 --ready-file /tmp/zoo.json

Once all are listening, the ready file holds ``{"mutant-name": port, ...}``; SIGTERM stops them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal

import aiohttp
from aiohttp import web

from .mutants import CONTROLS, MUTANTS
from .proxy import Proxy

SLOTS = 4  # what the upstream runs at once, as the proxies present it (the harness's --parallel)


async def served_model(upstream: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(f"{upstream}/v1/models") as response:
        models = (await response.json())["data"]
    return str(models[0]["id"])


async def serve(upstream: str, ready_file: str, slots: int) -> None:
    model = await served_model(upstream)
    runners = {}
    for mutant in (*(m() for m in CONTROLS), *(m() for m in MUTANTS)):
        runner = web.AppRunner(
            Proxy(mutant, upstream, slots, model).app(), access_log=None, handle_signals=False
        )
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners[mutant.name] = runner
    ports = {name: runner.addresses[0][1] for name, runner in runners.items()}
    tmp = f"{ready_file}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(ports, handle)
    os.replace(tmp, ready_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await asyncio.gather(*(r.cleanup() for r in runners.values()))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.openai_compat.zoo", description=__doc__)
    parser.add_argument("--upstream", required=True, metavar="URL", help="the server root, http://host:port")
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--slots", type=int, default=SLOTS)
    args = parser.parse_args()
    asyncio.run(serve(args.upstream.rstrip("/"), args.ready_file, args.slots))


if __name__ == "__main__":
    main()
