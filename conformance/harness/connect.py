"""From what the user named (``--target``, ``--protocol``) to a connected target: a gRPC one
(lmrpc.v1 or an engine protocol, ``host:port``) or an OpenAI-compatible HTTP one (a URL), after
waiting, when asked (``--wait``), until it is ready to serve."""

from __future__ import annotations

import asyncio
import time

from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from h2.exceptions import H2Error

from conformance.drivers import Promises
from conformance.drivers.detect import detect
from conformance.drivers.openai.client import OpenAIEndpoint
from conformance.drivers.openai.discover import list_models
from conformance.drivers.openai.runtime_transport import client_for
from conformance.drivers.openai.target import HttpOptions, HttpTarget
from conformance.harness.session import Budgets
from conformance.harness.target import Credentials, Endpoint, Target, TlsOptions, choose_driver
from conformance.spec.protocols import HTTP_PROTOCOLS, is_url

AnyEndpoint = Endpoint | OpenAIEndpoint
WAIT_EVERY_S = 0.25


def protocol_of(target: str, protocol: str) -> str:
    """The protocol a run speaks: ``auto`` on a URL is the OpenAI API; a URL is refused for a gRPC
    protocol and host:port for the OpenAI API."""
    if protocol == "auto" and is_url(target):
        return "openai"
    if protocol in HTTP_PROTOCOLS and not is_url(target):
        raise ValueError(f"--protocol {protocol} takes a URL: --target http://{target}")
    if protocol not in HTTP_PROTOCOLS and is_url(target):
        raise ValueError(f"--protocol {protocol} takes host:port, not a URL ({target})")
    return protocol


def parse_endpoint(
    target: str, protocol: str, tls: TlsOptions | None, credentials: Credentials, api_key: str | None
) -> AnyEndpoint:
    if protocol in HTTP_PROTOCOLS:
        return OpenAIEndpoint.parse(
            target, api_key=api_key or credentials.token, tls=tls.context() if tls is not None else None
        )
    return Endpoint.parse(target, tls, credentials)


async def wait_until_ready(endpoint: AnyEndpoint, seconds: float, budgets: Budgets) -> str:
    """Poll until the target is ready (gRPC health ``""`` SERVING, or, for a server without the
    health service, some protocol answering; an OpenAI server listing its models). Returns how it
    was found ready; raises TimeoutError with the last thing it saw."""
    give_up = time.monotonic() + seconds
    last = "nothing tried"
    while True:
        try:
            ready, last = await asyncio.wait_for(_ready(endpoint, budgets), max(budgets.connect_s, 1.0))
        except TimeoutError:
            ready, last = False, "no answer"
        if ready:
            return last
        if time.monotonic() >= give_up:
            raise TimeoutError(f"not ready after {seconds:.0f}s: {last}")
        await asyncio.sleep(WAIT_EVERY_S)


async def _ready(endpoint: AnyEndpoint, budgets: Budgets) -> tuple[bool, str]:
    if isinstance(endpoint, OpenAIEndpoint):
        async with client_for(endpoint, connect_s=budgets.connect_s) as client:
            try:
                models, _ = await list_models(client, budgets.connect_s)
            except Exception as exc:  # refused, not yet an OpenAI server, a 503 while loading...
                return False, f"{type(exc).__name__}: {exc}"
            return bool(models), f"GET /models lists {models}"
    channel = endpoint.channel()
    try:
        try:
            health = await HealthStub(channel).Check(HealthCheckRequest(service=""))
            status = HealthCheckResponse.ServingStatus.Name(health.status)
            return health.status == HealthCheckResponse.SERVING, f"health is {status}"
        except GRPCError:  # no health service: whichever protocol answers says it is up
            found = await detect(channel, budgets.connect_s)
            return True, found.how
    except (OSError, StreamTerminatedError, ProtocolError, H2Error, GRPCError) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # the detection found nothing yet
        return False, f"{type(exc).__name__}: {exc}"
    finally:
        channel.close()


async def connect(
    endpoint: AnyEndpoint,
    protocol: str,
    promises: Promises | None,
    budgets: Budgets,
    http: HttpOptions,
) -> tuple[Target | HttpTarget, str]:
    """The connected target and what chose its protocol."""
    if isinstance(endpoint, OpenAIEndpoint):
        return await HttpTarget.connect(endpoint, http), "--protocol openai"
    driver, how = await choose_driver(endpoint, protocol, promises, budgets.connect_s)
    return await Target.connect(endpoint, budgets.connect_s, driver), how
