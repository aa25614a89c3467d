"""Helpers shared by the worker processes: sockets, logging, process naming."""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import sys

import zmq


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
