"""What the worker processes share: start-up, sockets, failure reporting, process naming."""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from reference_server import ipc

log = logging.getLogger("lmrpc.worker")


@dataclass(frozen=True)
class WorkerSockets:
    inbox: zmq.Socket[bytes]  # PULL, bound at the worker's own address
    to_peer: zmq.Socket[bytes]  # PUSH to the other worker
    to_frontend: zmq.Socket[bytes]  # PUSH to the frontend


def run_worker(
    role: str,
    log_level: str,
    *,
    inbox: str,
    peer: str,
    frontend: str,
    serve: Callable[[WorkerSockets], None],
) -> None:
    """Run ``serve`` as this worker process's body. It must send ``Ready`` once started and
    return on Shutdown; an exception is reported to the frontend as WorkerFailed, then exit 1."""
    setup_worker(f"lmrpc-{role}", log_level)
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sockets = WorkerSockets(
        pull_socket(context, inbox), push_socket(context, peer), push_socket(context, frontend)
    )
    try:
        serve(sockets)
    except Exception as exc:
        log.error("%s failed:\n%s", role, traceback.format_exc())
        sockets.to_frontend.send(ipc.encode(ipc.WorkerFailed(role, f"{type(exc).__name__}: {exc}")))
        context.destroy(linger=1000)
        sys.exit(1)
    context.destroy(linger=1000)


def setup_worker(name: str, log_level: str) -> None:
    """Name the process, configure logging, and leave SIGINT/SIGTERM to the frontend, which
    shuts workers down with a Shutdown message (so a Ctrl-C never kills a worker mid-step)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    logging.basicConfig(
        level=log_level,
        format=f"%(asctime)s {name}[{os.getpid()}] %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    _set_thread_name(name)
    _exit_with_parent()


def _exit_with_parent() -> None:
    """If the frontend dies without shutting us down (SIGKILL, crash), get SIGTERM (Linux)."""
    try:
        libc = ctypes.CDLL(None)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid != os.getppid():  # it died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _set_thread_name(name: str) -> None:
    """Show the role in ps/top (/proc/PID/comm, 15 characters) on Linux."""
    try:
        libc = ctypes.CDLL(None)
        pr_set_name = 15
        libc.prctl(pr_set_name, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


def pull_socket(context: zmq.Context[zmq.Socket[bytes]], address: str) -> zmq.Socket[bytes]:
    socket = context.socket(zmq.PULL)
    socket.bind(address)
    return socket


def push_socket(context: zmq.Context[zmq.Socket[bytes]], address: str) -> zmq.Socket[bytes]:
    socket = context.socket(zmq.PUSH)
    socket.setsockopt(zmq.LINGER, 1000)
    socket.connect(address)
    return socket
