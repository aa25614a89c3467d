"""From what the user named (``--target``, ``--protocol``) to a connected target: the address of
its row's wire (``host:port`` for gRPC, a URL for an HTTP API), waited for when asked (``--wait``)
until it is ready to serve, then reached through the protocol's driver."""

from __future__ import annotations

import asyncio
import time

from conformance.drivers.base import Address, ConnectOptions, Target
from conformance.drivers.openai.client import OpenAIEndpoint
from conformance.harness.session import Budgets
from conformance.harness.target import Credentials, Endpoint, TlsOptions
from conformance.spec.protocols import HTTP_PROTOCOLS, is_url, wire_of

WAIT_EVERY_S = 0.25


def protocol_of(target: str, protocol_id: str) -> str:
    """The protocol a run speaks: ``auto`` on a URL is the first HTTP protocol; a URL is refused
    for a gRPC protocol and host:port for an HTTP one."""
    if protocol_id == "auto" and is_url(target):
        return HTTP_PROTOCOLS[0]
    if wire_of(protocol_id) == "http" and not is_url(target):
        raise ValueError(f"--protocol {protocol_id} takes a URL: --target http://{target}")
    if wire_of(protocol_id) == "grpc" and is_url(target):
        raise ValueError(f"--protocol {protocol_id} takes host:port, not a URL ({target})")
    return protocol_id


def parse_endpoint(
    target: str, protocol_id: str, tls: TlsOptions | None, credentials: Credentials, api_key: str | None
) -> Address:
    """Where the target is, in the form its protocol's wire takes (the one place that tells them apart)."""
    if wire_of(protocol_id) == "http":
        return OpenAIEndpoint.parse(
            target, api_key=api_key or credentials.token, tls=tls.context() if tls is not None else None
        )
    return Endpoint.parse(target, tls, credentials)


async def wait_until_ready(address: Address, seconds: float, budgets: Budgets) -> str:
    """Poll until the target is ready (``Address.ready``). Returns how it was found ready; raises
    TimeoutError with the last thing it saw."""
    give_up = time.monotonic() + seconds
    last = "nothing tried"
    while True:
        try:
            ready, last = await asyncio.wait_for(
                address.ready(budgets.connect_s), max(budgets.connect_s, 1.0)
            )
        except TimeoutError:
            ready, last = False, "no answer"
        if ready:
            return last
        if time.monotonic() >= give_up:
            raise TimeoutError(f"not ready after {seconds:.0f}s: {last}")
        await asyncio.sleep(WAIT_EVERY_S)


async def connect(address: Address, protocol_id: str, options: ConnectOptions) -> tuple[Target, str]:
    """The connected target and what chose its protocol."""
    return await address.connect(protocol_id, options)
