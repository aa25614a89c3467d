"""The frontend process: gRPC server, worker processes, startup, drain and shutdown.

Startup order: bind the gRPC port first (a port in use fails at once, with health NOT_SERVING
served while the model loads), then spawn the scheduler and detokenizer, wait for both to say
Ready, load the tokenizer, and only then turn health SERVING.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import multiprocessing.process
import os
import shutil
import signal
import socket
import ssl
from pathlib import Path
from typing import Any

from grpclib.health.service import Health
from grpclib.server import Server

from reference_server.config import IpcAddresses, ServerConfig, TlsFiles
from reference_server.detokenizer.process import run_detokenizer
from reference_server.frontend.codec import SizeLimitedCodec
from reference_server.frontend.context import Engine, FrontendContext, Phase, capabilities_for
from reference_server.frontend.control import ControlService
from reference_server.frontend.engine_link import EngineLink, WorkerUnavailableError
from reference_server.frontend.inference import InferenceService
from reference_server.frontend.kv_events import KvEventHub
from reference_server.frontend.metrics.exporter import MetricsServer, ServerCollector
from reference_server.frontend.metrics.observe import ObservedEngineLink, ObservedRequestTable, count_rpcs
from reference_server.frontend.metrics.stats import ServingStats
from reference_server.frontend.reflection import reflection_services
from reference_server.frontend.requests import RequestTable
from reference_server.frontend.unknown_methods import answer_unknown_methods
from reference_server.frontend.vllm.service import VllmEngineService
from reference_server.models.source import resolve_model
from reference_server.models.tokenizer import load_tokenizer
from reference_server.scheduler.process import run_scheduler

log = logging.getLogger("lmrpc.frontend")

WORKERS = ("scheduler", "detokenizer")
AFTER_ABORT_GRACE_S = 2.0


class StartupError(RuntimeError):
    """The server could not start; the message says why (port in use, model missing, ...)."""


class Frontend:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.source = resolve_model(config.engine.model_path)  # fails fast if the model is missing
        self.addresses = IpcAddresses.create()
        self.stats = ServingStats() if config.metrics_port is not None else None
        if self.stats is None:
            self.table = RequestTable(config.limits.abort_grace_s)
            self.link = EngineLink(self.addresses, self.table)
        else:
            self.table = ObservedRequestTable(config.limits.abort_grace_s, self.stats)
            self.link = ObservedEngineLink(self.addresses, self.table, self.stats)
        self.kv_events = KvEventHub()
        self.link.on_kv_events = self.kv_events.publish
        self.ctx = FrontendContext(config, self.table, self.link)
        inference, control = InferenceService(self.ctx), ControlService(self.ctx)
        self.control = control
        services: list[Any] = [inference, control]
        if config.vllm_dialect:  # smg's vLLM worker protocol, translated onto the two above
            services.append(
                VllmEngineService(self.ctx, inference, control, self.kv_events, self.source, self.stats)
            )
        health = Health({service: [self.ctx.health] for service in services})
        self.server = Server(
            [*services, health, *reflection_services([*services, health])],
            codec=SizeLimitedCodec(config.limits.max_message_bytes),
        )
        answer_unknown_methods(self.server)
        if self.stats is not None:
            count_rpcs(self.server, self.stats)
        self.metrics: MetricsServer | None = None
        self.processes: dict[str, multiprocessing.process.BaseProcess] = {}
        self.port = 0
        self._stop = asyncio.Event()

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
        if self.stats is not None and self.config.metrics_port is not None:
            collector = ServerCollector(self.stats, self.control, self.kv_events, asyncio.get_running_loop())
            try:
                self.metrics = MetricsServer.start(self.config.host, self.config.metrics_port, collector)
            except OSError as exc:
                raise StartupError(
                    f"cannot serve metrics on {self.config.host}:{self.config.metrics_port}: {exc}"
                ) from None
            log.info("metrics on http://%s:%d/metrics", self.config.host, self.metrics.port)
        self.link.on_failure = self._on_worker_failure
        self.link.start()
        self._spawn_workers()
        try:
            info = await asyncio.wait_for(self.link.wait_ready(WORKERS), self.config.startup_timeout_s)
        except WorkerUnavailableError as exc:
            raise StartupError(str(exc)) from None
        except TimeoutError:
            raise StartupError(f"workers not ready after {self.config.startup_timeout_s} s") from None
        tokenizer = await asyncio.to_thread(load_tokenizer, self.source)
        self.ctx.engine = Engine(info, tokenizer, capabilities_for(info, tokenizer, self.config))
        self.ctx.set_phase(Phase.SERVING)
        log.info("serving %s on %s:%d", info.model_id, self.config.host, self.port)
        if self.config.ready_file:
            _write_atomically(Path(self.config.ready_file), f"{self.port}\n")

    def request_stop(self) -> None:
        self._stop.set()

    async def run_until_stopped(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        await self._stop.wait()
        await self.drain()

    async def drain(self) -> None:
        """Refuse new requests, let streams in flight finish, then abort what is left (LIFE-1)."""
        if self.ctx.phase is not Phase.FAILED:
            self.ctx.set_phase(Phase.DRAINING)
        log.info("draining %d request(s)", len(self.table))
        try:
            await asyncio.wait_for(self.ctx.idle.wait(), self.config.drain_timeout_s)
        except TimeoutError:
            log.warning("drain timeout: aborting %d request(s)", len(self.table))
            self.link.abort([s.rid for s in self.table.states() if s.submitted])
            for state in self.table.states():
                state.abort_requested = True
            try:
                await asyncio.wait_for(self.ctx.idle.wait(), AFTER_ABORT_GRACE_S)
            except TimeoutError:
                self.table.fail_all(14, "the server shut down")

    async def close(self) -> None:
        if self.metrics is not None:
            await asyncio.to_thread(self.metrics.stop)
        if self.port:
            self.server.close()
            await self.server.wait_closed()
        self.link.shutdown_workers()
        for process in self.processes.values():
            await asyncio.to_thread(process.join, 10.0)
            if process.is_alive():
                process.kill()
        self.link.close()
        shutil.rmtree(self.addresses.folder, ignore_errors=True)

    def _spawn_workers(self) -> None:
        context = multiprocessing.get_context("spawn")
        loop = asyncio.get_running_loop()
        for name, target in (("scheduler", run_scheduler), ("detokenizer", run_detokenizer)):
            process = context.Process(
                target=target, args=(self.config, self.addresses), name=f"lmrpc-{name}", daemon=True
            )
            process.start()
            self.processes[name] = process
            loop.add_reader(process.sentinel, self._on_worker_exit, name)

    def _on_worker_exit(self, name: str) -> None:
        process = self.processes[name]
        asyncio.get_running_loop().remove_reader(process.sentinel)
        if self.ctx.phase is not Phase.DRAINING or process.exitcode != 0:
            self.link.fail(f"the {name} process exited (code {process.exitcode})")

    def _on_worker_failure(self, message: str) -> None:
        log.error("%s: failing %d request(s) in flight", message, len(self.table))
        self.ctx.failure = message
        self.ctx.set_phase(Phase.FAILED)
        self.table.fail_all(14, message)


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
