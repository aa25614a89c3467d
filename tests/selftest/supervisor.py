"""A minimal process supervisor, as systemd or a Kubernetes pod would be: it runs the server command
again whenever it exits, until a ``stop`` file appears in its state folder. The process hooks of the
self-test act on it as a user's would: the restart hook stops the server (the supervisor starts a new
one), the drain hook writes ``stop`` and stops it.

    python tests/selftest/supervisor.py STATE_DIR -- COMMAND...

STATE_DIR/server.pid holds the running server's pid; STATE_DIR/exits gets each exit status, a line each.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def restart_hook(state: Path) -> str:
    """Stop the running server and return once it has exited; the supervisor starts the next one."""
    return f'pid=$(cat {state}/server.pid) && kill -TERM "$pid" && while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done'


def drain_hook(state: Path) -> str:
    """Begin the server's last shutdown: no restart after it."""
    return f"touch {state}/stop && kill -TERM $(cat {state}/server.pid)"


def main() -> None:
    state, command = Path(sys.argv[1]), sys.argv[sys.argv.index("--") + 1 :]
    state.mkdir(parents=True, exist_ok=True)
    while not (state / "stop").exists():
        server = subprocess.Popen(command)
        pid_file = state / "server.pid"
        pid_file.with_suffix(".tmp").write_text(str(server.pid))
        os.replace(pid_file.with_suffix(".tmp"), pid_file)
        code = server.wait()
        with (state / "exits").open("a") as exits:
            exits.write(f"{code}\n")


if __name__ == "__main__":
    main()
