"""The user's commands that control the server's process (``--restart-hook``, ``--drain-hook``).

The harness never signals a server itself: it may run on another host, under a supervisor, in a
container. The user says how, as a shell command; a command that fails is the run's problem, not
the server's, so it ends the case as a harness error, never as the server's failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile

TAIL_BYTES = 600  # of the command's output, quoted when it fails


class HookFailed(RuntimeError):
    """The command exited non-zero or outlived its budget."""


async def run_hook(option: str, command: str, timeout_s: float) -> None:
    """Run ``command`` with the shell and wait for it to exit; raises HookFailed unless it exits 0 in
    time. Its output goes to a file, not a pipe: a server the command starts in the background keeps
    its inherited descriptors open, and a pipe would never reach end-of-file."""
    with tempfile.TemporaryFile() as output:
        process = await asyncio.create_subprocess_shell(
            command, stdin=asyncio.subprocess.DEVNULL, stdout=output, stderr=output, start_new_session=True
        )
        try:
            code = await asyncio.wait_for(process.wait(), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            raise HookFailed(f"{option} {command!r} did not exit within {timeout_s:.0f}s") from None
        if code != 0:
            output.seek(max(0, output.tell() - TAIL_BYTES))
            tail = output.read().decode(errors="replace").strip()
            raise HookFailed(f"{option} {command!r} exited {code}: {tail}")
