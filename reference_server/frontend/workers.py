"""One generation of worker processes (scheduler and detokenizer) and the frontend's link to them.

The frontend starts one generation at start-up and, after a worker dies, may replace it with a
fresh one (``--max-worker-restarts``). Each generation has its own IPC folder and sockets, so
nothing of a dead generation can reach its successor.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import multiprocessing.process
import shutil
from collections.abc import Callable

from reference_server import ipc
from reference_server.config import IpcAddresses, ServerConfig
from reference_server.detokenizer.process import run_detokenizer
from reference_server.frontend.engine_link import EngineLink, WorkerUnavailableError
from reference_server.frontend.requests import RequestTable
from reference_server.scheduler.process import run_scheduler

log = logging.getLogger("lmrpc.frontend")

ROLES = ("scheduler", "detokenizer")
SHUTDOWN_GRACE_S = 10.0  # a healthy worker finishes its step and exits well within this
KILL_GRACE_S = 1.0


class WorkerSet:
    def __init__(self, config: ServerConfig, table: RequestTable, on_failure: Callable[[str], None]) -> None:
        self.config = config
        self.addresses = IpcAddresses.create()
        self.link = EngineLink(self.addresses, table)
        self.link.on_failure = on_failure
        self.processes: dict[str, multiprocessing.process.BaseProcess] = {}
        self._stopping = False
        self._ready = False  # both workers said ready: only then is a Shutdown message read

    async def start(self, timeout_s: float) -> ipc.EngineInfo:
        """Spawn the workers and wait until both are ready. Raises WorkerUnavailableError (a
        worker failed or did not start in time)."""
        self.link.start()
        context = multiprocessing.get_context("spawn")
        loop = asyncio.get_running_loop()
        for role, target in (("scheduler", run_scheduler), ("detokenizer", run_detokenizer)):
            process = context.Process(
                target=target, args=(self.config, self.addresses), name=f"lmrpc-{role}", daemon=True
            )
            process.start()
            self.processes[role] = process
            loop.add_reader(process.sentinel, self._on_exit, role)
        try:
            async with asyncio.timeout(timeout_s):
                info = await self.link.wait_ready(ROLES)
        except TimeoutError:
            raise WorkerUnavailableError(f"workers not ready after {timeout_s:g} s") from None
        self._ready = True
        return info

    async def stop(self) -> None:
        """Shut the workers down and release the IPC folder. Ready workers finish their step and
        exit on a Shutdown message; workers that died, or are still starting (a restart under way,
        which may take long on a loaded machine), are terminated at once."""
        self._stopping = True
        all_alive = all(p.is_alive() for p in self.processes.values())  # a death not yet noticed counts
        healthy = self._ready and self.link.failure is None and all_alive
        if healthy:
            try:
                self.link.send(ipc.Shutdown())  # the scheduler passes it on to the detokenizer
            except WorkerUnavailableError:
                healthy = False
        if healthy:
            for process in self.processes.values():  # the scheduler first
                await asyncio.to_thread(process.join, SHUTDOWN_GRACE_S)
                if process.exitcode != 0:
                    break  # it died rather than shut down: the next never got the Shutdown
        Process = multiprocessing.process.BaseProcess
        for signal_them in (Process.terminate, Process.kill):
            alive = [p for p in self.processes.values() if p.is_alive()]
            for process in alive:
                signal_them(process)
            for process in alive:  # signalled together, they end side by side
                await asyncio.to_thread(process.join, KILL_GRACE_S)
        self.link.close()
        shutil.rmtree(self.addresses.folder, ignore_errors=True)

    def _on_exit(self, role: str) -> None:
        process = self.processes[role]
        asyncio.get_running_loop().remove_reader(process.sentinel)
        if not self._stopping:
            self.link.fail(f"the {role} process exited (code {process.exitcode})")
