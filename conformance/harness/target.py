"""The server under test: where it is, which protocol it speaks, what it says it is, and the
channels the harness uses.

The harness never spawns a server. It connects to ``host:port`` through the protocol's driver
(``conformance.drivers``: lmrpc.v1 by default), reads what the server says about itself once, and
derives every case's preconditions from what the server advertises.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field
from typing import Literal

from grpclib.client import Channel
from grpclib.config import Configuration
from grpclib.exceptions import GRPCError
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse

from conformance.drivers import Driver, LmrpcDriver, Promises, make_driver
from conformance.drivers.base import ConnectOptions
from conformance.drivers.detect import detect
from conformance.spec.protocols import protocol
from conformance.stream import wiretap
from conformance.vocabulary import TargetInfo
from lmrpc.client import bearer_token, parse_target, tls_context
from lmrpc.v1 import ControlServiceStub, GetServerInfoRequest, InferenceServiceStub


@dataclass(frozen=True, slots=True)
class TlsOptions:
    ca_file: str | None = None  # trust this CA instead of the system store
    cert_file: str | None = None  # client certificate (mutual TLS)
    key_file: str | None = None
    server_name: str | None = None  # SNI / hostname to verify, when it differs from the target host
    insecure: bool = False  # do not verify the server certificate

    def context(self) -> ssl.SSLContext:
        context = tls_context(self.ca_file, cert_file=self.cert_file, key_file=self.key_file)
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context


@dataclass(frozen=True, slots=True)
class Credentials:
    """Bearer tokens for servers with ``Capabilities.authentication`` (AUTH-*): ``token`` has the
    client role and is used for every call; ``admin_token`` for administrative ones."""

    token: str | None = None
    admin_token: str | None = None


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int
    tls: TlsOptions | None = None
    credentials: Credentials = Credentials()

    @staticmethod
    def parse(target: str, tls: TlsOptions | None = None, credentials: Credentials | None = None) -> Endpoint:
        host, port = parse_target(target)
        return Endpoint(host, port, tls, credentials or Credentials())

    def channel(self, *, token: str | Literal["default"] | None = "default") -> Channel:
        """A new HTTP/2 connection, sending ``token`` (by default the client token) on every call."""
        if self.tls is None:
            channel = Channel(self.host, self.port)
        else:
            config = (
                Configuration(ssl_target_name_override=self.tls.server_name) if self.tls.server_name else None
            )
            channel = Channel(self.host, self.port, ssl=self.tls.context(), config=config)
        chosen = self.credentials.token if token == "default" else token
        if chosen:
            bearer_token(channel, chosen)
        return wiretap.tap(channel)

    def ssl_context(self) -> ssl.SSLContext | None:
        return self.tls.context() if self.tls is not None else None

    async def ready(self, connect_s: float) -> tuple[bool, str]:
        """Health ``""`` SERVING, or, for a server without the health service, some protocol
        answering (``Address``)."""
        channel = self.channel()
        try:
            try:
                health = await HealthStub(channel).Check(HealthCheckRequest(service=""))
                status = HealthCheckResponse.ServingStatus.Name(health.status)
                return health.status == HealthCheckResponse.SERVING, f"health is {status}"
            except GRPCError:  # no health service: whichever protocol answers says it is up
                found = await detect(channel, connect_s)
                return True, found.how
        except Exception as exc:  # refused, reset, or the detection found nothing yet
            return False, f"{type(exc).__name__}: {exc}"
        finally:
            channel.close()

    async def connect(self, protocol_id: str, options: ConnectOptions) -> tuple[GrpcTarget, str]:
        driver, how = await choose_driver(self, protocol_id, options.promises, options.connect_s)
        return await GrpcTarget.connect(self, options.connect_s, driver), how

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(slots=True)
class GrpcTarget:
    """A gRPC server, connected through its protocol's driver (``Target``)."""

    endpoint: Endpoint
    info: TargetInfo
    channel: Channel
    control: ControlServiceStub
    inference: InferenceServiceStub
    admin: ControlServiceStub  # for administrative RPCs: the admin token's channel, when one is given
    driver: Driver  # the wire protocol: lmrpc.v1, or an engine protocol (conformance.drivers)
    admin_channel: Channel | None = None  # None: no admin token was given
    _extra: list[Channel] = field(default_factory=list)

    @staticmethod
    async def connect(endpoint: Endpoint, timeout_s: float, driver: Driver | None = None) -> GrpcTarget:
        """Open the shared channel and read the server's info. Raises on an unreachable target."""
        driver = driver or LmrpcDriver()
        channel = endpoint.channel()
        try:
            found = await asyncio.wait_for(driver.discover(channel, timeout_s), 4 * timeout_s)
        except BaseException:
            channel.close()
            raise
        info = TargetInfo(
            found.server,
            found.model,
            found.embedding,
            found.kv_tokens_total,
            cache_block_tokens=found.cache_block_tokens,
        )
        control = driver.control(channel)
        admin_channel = None
        if endpoint.credentials.admin_token:
            admin_channel = endpoint.channel(token=endpoint.credentials.admin_token)
        admin = driver.control(admin_channel) if admin_channel else control
        return GrpcTarget(
            endpoint, info, channel, control, driver.inference(channel), admin, driver, admin_channel
        )

    @property
    def protocol(self) -> str:
        return self.driver.protocol

    @property
    def learns_refusals(self) -> bool:
        return not protocol(self.protocol).advertises

    async def alive(self, budget_s: float) -> tuple[bool, str]:
        """Health answers, or GetServerInfo where there is no health service: a server that says
        NOT_SERVING and answers is alive (what its health says is HEALTH-1's and HEALTH-2's business)."""
        channel = self.fresh_channel()
        try:
            try:
                reply = await asyncio.wait_for(
                    HealthStub(channel).Check(HealthCheckRequest(service="")), budget_s
                )
                return True, f"serving (health {HealthCheckResponse.ServingStatus.Name(reply.status)})"
            except GRPCError as exc:
                health = f"health {exc.status.name}"
            await asyncio.wait_for(self.control.get_server_info(GetServerInfoRequest()), budget_s)
            return True, f"serving (GetServerInfo answers; {health})"
        except Exception as exc:
            return False, f"{type(exc).__name__}: {exc}"
        finally:
            channel.close()

    def paced(self, parallel: int | None) -> None:
        pass  # what it runs at once is the session's (Session.parallel)

    def report_fields(self) -> tuple[dict[str, object], dict[str, object]]:
        return {}, {}

    async def aclose(self) -> None:
        self.close()

    def fresh_channel(self, *, token: str | Literal["default"] | None = "default") -> Channel:
        """A separate HTTP/2 connection, for cases that must not share one (closed with the target);
        ``token`` overrides the credentials it sends (None: none)."""
        channel = self.endpoint.channel(token=token)
        self._extra.append(channel)
        return channel

    def close(self) -> None:
        for channel in [self.channel, *([self.admin_channel] if self.admin_channel else []), *self._extra]:
            channel.close()
        self._extra.clear()


async def choose_driver(
    endpoint: Endpoint, protocol_id: str, promises: Promises | None, timeout_s: float
) -> tuple[Driver, str]:
    """The driver for ``protocol``, or for the protocol ``auto`` detects (``drivers/detect.py``),
    and what chose it. ``promises`` (``--assume``) apply to engine protocols only."""
    how = "--protocol"
    if protocol_id == "auto":
        channel = endpoint.channel()
        try:
            found = await detect(channel, timeout_s)
        finally:
            channel.close()
        protocol_id, how = found.protocol, f"--protocol auto: {found.how}"
    advertises = protocol(protocol_id).advertises  # promises are for protocols that advertise nothing
    return make_driver(protocol_id, None if advertises else promises), how
