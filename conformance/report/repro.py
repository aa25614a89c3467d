"""Stand-alone repro scripts: the calls a failing case made, replayed with the lmrpc SDK.

The script needs only ``lmrpc`` installed (and, for an engine protocol, the harness: its driver
sends the same lmrpc.v1 calls over that protocol and prints the normalised events). Calls start
at the offsets the harness used (streams run concurrently, as they did), so ordering-sensitive
failures such as an abort racing a stream replay the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

from conformance.vocabulary import Call

_HEADER = '''#!/usr/bin/env python3
"""Repro for lmrpc conformance case {case_id}: replays its calls and prints every response.

    python {filename} [host:port]      (default: {target})
"""

import asyncio
import contextlib
import sys
import time

{client_import}
from lmrpc.v1 import *  # noqa: F403

nan, inf = float("nan"), float("inf")
TARGET = sys.argv[1] if len(sys.argv) > 1 else "{target}"


async def stream(client, label, request, deadline_s=None, cancel_after=None):
    received = 0
    try:
        calls = client.inference.generate(request, timeout=deadline_s)
        async with contextlib.aclosing(calls) as events:
            async for event in events:
                print(f"{{label}} <- {{event!r}}")
                received += 1
                if cancel_after is not None and received >= cancel_after:
                    print(f"{{label}}: cancelling the call after {{received}} messages")
                    break
        print(f"{{label}}: ended, {{received}} messages")
    except Exception as exc:  # GRPCError carries the status; a deadline arrives as TimeoutError
        print(f"{{label}}: ended with {{type(exc).__name__}}: {{exc}} after {{received}} messages")


async def unary(label, call):
    try:
        print(f"{{label}} <- {{await call!r}}")
    except Exception as exc:
        print(f"{{label}}: {{type(exc).__name__}}: {{exc}}")


async def main():
    async with {client_open} as client:
        start = time.monotonic()
        streams = []

        async def at(offset_s):
            await asyncio.sleep(max(0.0, offset_s - (time.monotonic() - start)))
'''

_FOOTER = """
        await asyncio.gather(*streams)


if __name__ == "__main__":
    asyncio.run(main())
"""


def script(
    case_id: str, target: str, calls: Sequence[Call], protocol: str = "lmrpc", filename: str = "repro.py"
) -> str:
    if protocol == "lmrpc":
        client_import, client_open = "from lmrpc.client import LmrpcClient", "LmrpcClient.connect(TARGET)"
    else:
        client_import = "from conformance.drivers.client import connect  # pip install 'lmrpc[conformance]'"
        client_open = f"connect(TARGET, {protocol!r})"
    lines = [
        _HEADER.format(
            case_id=case_id,
            target=target,
            filename=filename,
            client_import=client_import,
            client_open=client_open,
        )
    ]
    for i, call in enumerate(calls):
        label = f"[{i}] {call.method}"
        lines.append(f"        await at({call.t_s:.3f})")
        if call.method == "generate":
            extra = ""
            if call.deadline_s is not None:
                extra += f", deadline_s={call.deadline_s!r}"
            if call.cancel_after is not None:
                extra += f", cancel_after={call.cancel_after!r}"
            lines.append(
                f"        streams.append(asyncio.create_task(stream(client, {label!r}, "
                f"{call.request!r}{extra})))"  # betterproto2 reprs are constructor calls
            )
        else:
            stub = "client.control" if call.service == "control" else "client.inference"
            lines.append(f"        await unary({label!r}, {stub}.{call.method}({call.request!r}))")
    if not calls:
        lines.append("        pass  # the case made no calls")
    return "\n".join(lines) + _FOOTER
