"""The frontend process: gRPC server, worker processes, startup, recovery, drain and shutdown.

Startup order: bind the gRPC port first (a port in use fails at once, with health NOT_SERVING
served while the model loads), then spawn the scheduler and detokenizer, wait for both to say
Ready, load the tokenizer, and only then turn health SERVING.

If a worker dies, every stream in flight ends with RequestError(UNAVAILABLE) (LIFE-2), health
turns NOT_SERVING and fresh workers are started, with backoff, up to ``--max-worker-restarts``
times in a row; health is SERVING again once they are ready. With no restart left the process
exits with status 1 within a second, for its supervisor to restart it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import socket
import ssl
import time
from pathlib import Path
from typing import Any

from grpclib import Status
from grpclib.health.service import Health
from grpclib.server import Server

from lmrpc import descriptor_set_path
from lmrpc.v1 import GetLoadRequest, Load
from reference_server import ipc
from reference_server.config import ServerConfig, TlsFiles
from reference_server.engine.kv_events import KV_EVENT_BLOCK_SIZE
from reference_server.frontend import grpc_hooks
from reference_server.frontend.context import EngineFacts, FrontendContext, Phase, capabilities_for
from reference_server.frontend.control import ADMIN_METHODS, ControlService
from reference_server.frontend.dialects.base.dialect import Dialect
from reference_server.frontend.dialects.base.service import Backend
from reference_server.frontend.dialects.base.tokenizer_bundle import TokenizerZipSource
from reference_server.frontend.dialects.table import DIALECTS
from reference_server.frontend.edge.auth import Credentials, CredentialsError
from reference_server.frontend.edge.decoding import StrictDecoder
from reference_server.frontend.edge.guard import EdgeGuard, EdgePolicy
from reference_server.frontend.engine_link import WorkerUnavailableError
from reference_server.frontend.inference import InferenceService
from reference_server.frontend.kv_events import KvEventHub
from reference_server.frontend.metrics.exporter import MetricsServer, ServerCollector
from reference_server.frontend.metrics.observe import ObservedRequestTable
from reference_server.frontend.metrics.stats import ServingStats
from reference_server.frontend.reflection import reflection_services
from reference_server.frontend.requests import FlowHooks, RequestTable
from reference_server.frontend.workers import WorkerSet
from reference_server.models.source import resolve_model
from reference_server.models.tokenizer import load_tokenizer
from reference_server.tracing import start_tracing

log = logging.getLogger("lmrpc.frontend")

AFTER_ABORT_GRACE_S = 2.0
RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0)
STABLE_AFTER_S = 60.0  # workers serving this long make the next failure count as the first


@dataclasses.dataclass
class DialectPort:
    """A dialect served on a port of its own."""

    dialect: Dialect
    requested: int  # 0: a free one
    server: Server
    bound: int = 0  # the port, once listening


class StartupError(RuntimeError):
    """The server could not start; the message says why (port in use, model missing, ...)."""


class Frontend:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.source = resolve_model(config.engine.model_path)  # fails fast if the model is missing
        credentials = _load_credentials(config.auth_file)
        limits = config.limits
        hooks = FlowHooks(
            grant=lambda rid, credit: self.ctx.link.grant_tokens(rid, credit),
            window=limits.max_parked_tokens,
        )
        self.stats = ServingStats() if config.metrics_port is not None else None
        self.table = (
            RequestTable(limits.abort_grace_s, hooks)
            if self.stats is None
            else ObservedRequestTable(limits.abort_grace_s, hooks, self.stats)
        )
        self.kv_events = KvEventHub()
        self.workers = self._worker_set()
        self.ctx = FrontendContext(config, self.table, self.workers.link)
        self.ctx.tracing = start_tracing("lmrpc-reference-frontend", config.otlp_endpoint)
        inference, control = InferenceService(self.ctx), ControlService(self.ctx)
        self.control = control
        backend = Backend(
            self.ctx,
            inference,
            control,
            self.kv_events,
            self.source,
            TokenizerZipSource(self.ctx),
            self.stats,
        )
        dialects = [dialect for dialect in DIALECTS if dialect.enabled(config)]
        on_lmrpc_port = [dialect for dialect in dialects if dialect.own_port(config) is None]
        policy = EdgePolicy(
            max_message_bytes=limits.max_message_bytes,
            stall_timeout_s=limits.stall_timeout_s,
            credentials=credentials,
            admin_methods=ADMIN_METHODS.union(*(dialect.admin_methods for dialect in on_lmrpc_port)),
        )
        descriptor_sets = [
            p.read_bytes() for p in sorted(descriptor_set_path().parent.glob("descriptor_set*.binpb"))
        ]
        self.decoder = StrictDecoder(descriptor_sets)
        lmrpc_services = [inference, control, *(dialect.service(backend) for dialect in on_lmrpc_port)]
        self.server = self._grpc_server(lmrpc_services, policy)
        # A dialect with a port of its own answers nothing else there (smg probes SGLang's
        # HealthCheck first, so a port answering both SGLang and vLLM would be taken for SGLang).
        self.dialect_ports = [
            DialectPort(
                dialect,
                port,
                self._grpc_server(
                    [dialect.service(backend)],
                    dataclasses.replace(policy, admin_methods=dialect.admin_methods),
                ),
            )
            for dialect in dialects
            if (port := dialect.own_port(config)) is not None
        ]
        self.metrics: MetricsServer | None = None
        self.port = 0
        self.exit_code = 0
        self._stop = asyncio.Event()
        self._restarts = 0
        self._serving_since = 0.0
        self._recovery: asyncio.Task[None] | None = None

    def _grpc_server(self, services: list[Any], policy: EdgePolicy) -> Server:
        """A server of ``services`` with grpc.health.v1 (the frontend's phase) and reflection,
        every call through the edge guard, and every RPC counted when metrics are on."""
        health = Health({service: [self.ctx.health] for service in services})
        server = Server([*services, health, *reflection_services([*services, health])])
        grpc_hooks.install(server, services, EdgeGuard(policy, self.decoder), self.stats)
        return server

    async def start(self) -> None:
        tls = _server_tls_context(self.config.tls) if self.config.tls else None
        listener = _bind(self.config.host, self.config.port)
        await self.server.start(sock=listener, ssl=tls)
        self.port = listener.getsockname()[1]
        log.info(
            "listening on %s:%d%s (health NOT_SERVING until the model is loaded)",
            self.config.host,
            self.port,
            " with TLS" if tls else "",
        )
        for dialect_port in self.dialect_ports:
            dialect_listener = _bind(self.config.host, dialect_port.requested)
            await dialect_port.server.start(sock=dialect_listener, ssl=tls)
            dialect_port.bound = dialect_listener.getsockname()[1]
            log.info("%s on %s:%d", dialect_port.dialect.grpc_service, self.config.host, dialect_port.bound)
        if self.stats is not None and self.config.metrics_port is not None:
            collector = ServerCollector(
                self.stats, self._current_load, self.kv_events, asyncio.get_running_loop()
            )
            try:
                self.metrics = MetricsServer.start(self.config.host, self.config.metrics_port, collector)
            except OSError as exc:
                raise StartupError(
                    f"cannot serve metrics on {self.config.host}:{self.config.metrics_port}: {exc}"
                ) from None
            log.info("metrics on http://%s:%d/metrics", self.config.host, self.metrics.port)
        try:
            info = await self.workers.start(self.config.startup_timeout_s)
        except WorkerUnavailableError as exc:
            raise StartupError(str(exc)) from None
        tokenizer = await asyncio.to_thread(load_tokenizer, self.source)
        self.ctx.engine = EngineFacts(info, tokenizer, capabilities_for(info, tokenizer, self.config))
        self._serving_since = time.monotonic()
        self.ctx.set_phase(Phase.SERVING)
        log.info("serving %s on %s:%d", info.model_id, self.config.host, self.port)
        if self.config.ready_file:
            extra = "".join(f"{d.dialect.name} {d.bound}\n" for d in self.dialect_ports)
            _write_atomically(Path(self.config.ready_file), f"{self.port}\n{extra}")

    async def _current_load(self) -> Load | None:
        return (await self.control.get_load(GetLoadRequest())).current

    def request_stop(self) -> None:
        self._stop.set()

    async def run_until_stopped(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        await self._stop.wait()
        if self.ctx.phase is Phase.SERVING:
            await self.drain()

    async def drain(self) -> None:
        """Refuse new requests, let streams in flight finish, then abort what is left (LIFE-1)."""
        self.ctx.set_phase(Phase.DRAINING)
        log.info("draining %d request(s)", len(self.table))
        try:
            async with asyncio.timeout(self.config.drain_timeout_s):
                await self.ctx.idle.wait()
        except TimeoutError:
            log.warning("drain timeout: aborting %d request(s)", len(self.table))
            self.ctx.link.abort([s.rid for s in self.table.states() if s.submitted])
            for state in self.table.states():
                state.abort_requested = True
            try:
                async with asyncio.timeout(AFTER_ABORT_GRACE_S):
                    await self.ctx.idle.wait()
            except TimeoutError:
                self.table.fail_all(Status.UNAVAILABLE.value, "the server shut down")

    async def close(self) -> None:
        if self._recovery is not None:
            self._recovery.cancel()
        if self.ctx.tracing is not None:
            await asyncio.to_thread(self.ctx.tracing.shutdown)
        if self.metrics is not None:
            await asyncio.to_thread(self.metrics.stop)
        if self.port:
            self.server.close()
            await self.server.wait_closed()
        for dialect_port in self.dialect_ports:
            if dialect_port.bound:
                dialect_port.server.close()
                await dialect_port.server.wait_closed()
        await self.workers.stop()

    def _worker_set(self) -> WorkerSet:
        workers = WorkerSet(self.config, self.table, self._on_worker_failure)
        workers.link.on_kv_events = self.kv_events.publish
        return workers

    def _on_worker_failure(self, message: str) -> None:
        log.error("%s: failing %d request(s) in flight", message, len(self.table))
        self.ctx.failure = message
        self.table.fail_all(Status.UNAVAILABLE.value, message)
        if self.ctx.phase in (Phase.STARTING, Phase.DRAINING):
            self.ctx.set_phase(Phase.FAILED)  # start-up reports it; a drain just ends
            return
        if self._recovery is not None and not self._recovery.done():
            return  # fresh workers failed while starting: the recovery loop goes on
        if time.monotonic() - self._serving_since > STABLE_AFTER_S:
            self._restarts = 0
        self.ctx.set_phase(Phase.RECOVERING)
        self._recovery = asyncio.get_running_loop().create_task(self._recover(), name="lmrpc-recovery")

    async def _recover(self) -> None:
        """Replace the workers, with backoff, until they serve or no restart is left."""
        while True:
            if self._restarts >= self.config.max_worker_restarts:
                log.error("no worker restart left (--max-worker-restarts %d): exiting",
                          self.config.max_worker_restarts)  # fmt: skip
                self.ctx.set_phase(Phase.FAILED)
                self.exit_code = 1
                self._stop.set()
                return
            backoff = RESTART_BACKOFF_S[min(self._restarts, len(RESTART_BACKOFF_S) - 1)]
            self._restarts += 1
            log.warning("restarting the workers in %.1f s (restart %d of at most %d in a row)",
                        backoff, self._restarts, self.config.max_worker_restarts)  # fmt: skip
            await self.workers.stop()
            await asyncio.sleep(backoff)
            self.kv_events.publish(ipc.KvEvents(KV_EVENT_BLOCK_SIZE, [ipc.KvCacheCleared()]))
            self.workers = self._worker_set()
            self.ctx.link = self.workers.link
            try:
                info = await self.workers.start(self.config.startup_timeout_s)
            except WorkerUnavailableError as exc:
                log.error("the restarted workers did not start: %s", exc)
                continue
            previous = self.ctx.engine
            assert previous is not None  # recovery starts only after the first workers served
            # Fresh workers: the initial weights again, an empty KV cache, so a new instance (SVC-4).
            self.ctx.engine = EngineFacts(info, previous.tokenizer, previous.capabilities)
            self.ctx.failure = None
            self._serving_since = time.monotonic()
            self.ctx.set_phase(Phase.SERVING)
            log.info("workers restarted; serving again")
            return


def _load_credentials(path: str | None) -> Credentials | None:
    if path is None:
        return None
    try:
        return Credentials.load(path)
    except CredentialsError as exc:
        raise StartupError(str(exc)) from None


def _server_tls_context(files: TlsFiles) -> ssl.SSLContext:
    for name, path in (
        ("cert", files.cert_file),
        ("key", files.key_file),
        ("client CA", files.client_ca_file),
    ):
        if path is not None and not Path(path).is_file():
            raise StartupError(f"TLS {name} file {path} does not exist")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(files.cert_file, files.key_file)
        if files.client_ca_file:
            context.load_verify_locations(files.client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise StartupError(f"cannot load TLS files: {exc}") from None
    context.set_alpn_protocols(["h2"])  # gRPC runs over HTTP/2 only
    return context


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP matters: asyncio only sets TCP_NODELAY on accepted sockets that say TCP,
    # and without it every small response waits ~40 ms for a delayed ACK.
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as exc:
        listener.close()
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    listener.listen(1024)
    listener.setblocking(False)
    return listener


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
