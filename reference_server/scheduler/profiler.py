"""A torch.profiler recording of the scheduler process, started and stopped on command.

While it records, every engine step is a ``engine.step`` range in the trace, with the torch
operators (and, on CUDA, the kernels) it ran. Stopping writes a chrome trace (JSON, readable by
chrome://tracing and Perfetto) into the folder the start named. torch.profiler is imported only
when a recording is first asked for, so the fake engine's scheduler pays nothing otherwise, and then
on a helper thread (``load_in_background``): an import that takes seconds on a busy machine must not
stop the engine stepping for the requests in flight.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TRACE_PREFIX = "lmrpc-scheduler"


class ProfilerStateError(RuntimeError):
    """Start while recording, or stop while not: the message says which."""


@dataclass
class _Recording:
    profile: Any  # torch.profiler.profile, entered
    output_dir: Path
    started: float  # time.time() at the start, names the trace


def _import_profiler() -> None:
    import torch.profiler  # noqa: F401


def _profiler_imported() -> bool:
    return "torch.profiler" in sys.modules


class SchedulerProfiler:
    def __init__(self) -> None:
        self._recording: _Recording | None = None
        self._loading: threading.Thread | None = None

    @property
    def ready(self) -> bool:
        """torch.profiler is imported, so start() does not wait for the import."""
        if self._loading is not None:
            return not self._loading.is_alive()
        return _profiler_imported()  # then by this loop's own thread, whole: the real engine's import

    def load_in_background(self) -> None:
        """Import torch.profiler on a helper thread (once); ``ready`` says when it is done."""
        if self._loading is None and not self.ready:
            self._loading = threading.Thread(target=_import_profiler, name="profiler-import", daemon=True)
            self._loading.start()

    @property
    def active(self) -> bool:
        return self._recording is not None

    def start(self, output_dir: str) -> Path:
        """The folder the trace will go to. Raises ProfilerStateError if recording, OSError if
        ``output_dir`` is not a writable folder."""
        if self._recording is not None:
            raise ProfilerStateError(
                f"a profile is already being recorded (into {self._recording.output_dir}); stop it first"
            )
        folder = Path(output_dir).expanduser()
        folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK):
            raise PermissionError(f"{folder} is not writable")
        import torch.profiler

        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        profile = torch.profiler.profile(activities=activities)
        profile.start()
        self._recording = _Recording(profile, folder, time.time())
        return folder

    def stop(self) -> Path:
        """The trace written; raises ProfilerStateError if nothing is being recorded."""
        recording = self._recording
        if recording is None:
            raise ProfilerStateError("no profile is being recorded; start one first")
        self._recording = None
        recording.profile.stop()
        path = (
            recording.output_dir / f"{TRACE_PREFIX}-{os.getpid()}-{int(recording.started * 1000)}.trace.json"
        )
        recording.profile.export_chrome_trace(str(path))
        return path

    @contextlib.contextmanager
    def step_range(self) -> Iterator[None]:
        """Marks one engine step in the trace while recording; does nothing otherwise."""
        if self._recording is None:
            yield
            return
        import torch.profiler

        with torch.profiler.record_function("engine.step"):
            yield
