"""scripts/serve-openai.sh and the README's OpenAI one-liner, as a newcomer runs them (fake engine)."""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gateway_fleet import FAKE_MODEL

ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 90.0


def readme_one_liner() -> str:
    section = (ROOT / "README.md").read_text().split("## OpenAI-compatible HTTP and many replicas")[1]
    match = re.search(r'\.venv/bin/python -c "(from openai import OpenAI;[^"]+)"', section)
    assert match is not None, "the README shows no OpenAI one-liner"
    return match.group(1)


def free_port_run(count: int) -> int:
    """The first of ``count`` consecutive free ports, below the ephemeral range: a port the kernel
    hands out (bind to 0) has neighbours that any connection's source port may take meanwhile (seen
    in CI: replica 1 found LMRPC_PORT + 1 in use)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 32000 - count)
        try:
            with contextlib.ExitStack() as probes:
                for port in range(base, base + count):
                    probes.enter_context(socket.socket()).bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {count} consecutive free ports in 20000-32000")


def test_the_script_serves_two_replicas_and_the_readme_line_gets_an_answer(tmp_path: Path) -> None:
    base = free_port_run(6)  # one run, so no two of the script's ports can meet
    smg_port = base
    env = {
        **os.environ,
        "LMRPC_ENGINE": "fake",
        "LMRPC_SKIP_SETUP": "1",  # the test environment is the installed venv
        "SMG_PORT": str(smg_port),
        "SMG_METRICS_PORT": str(base + 1),
        "LMRPC_PORT": str(base + 2),  # the script puts replica i on LMRPC_PORT + i
        "LMRPC_METRICS_PORT": str(base + 4),
        "LMRPC_RUN_DIR": str(tmp_path),
    }
    output = tmp_path / "script.out"
    with output.open("wb") as sink:
        script = subprocess.Popen(
            ["bash", str(ROOT / "scripts" / "serve-openai.sh"), "2"],
            cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while "OpenAI base URL" not in output.read_text():
            assert script.poll() is None, f"the script exited:\n{output.read_text()}"
            if time.monotonic() > deadline:
                pytest.fail(f"no base URL after {STARTUP_TIMEOUT_S} s:\n{output.read_text()}")
            time.sleep(0.1)
        printed = output.read_text()
        assert (
            f"OpenAI base URL: http://127.0.0.1:{smg_port}/v1" in printed
            and f"model: {FAKE_MODEL}" in printed
        )
        line = readme_one_liner().replace("127.0.0.1:8000", f"127.0.0.1:{smg_port}")
        line = line.replace("model='SmolLM2-135M-Instruct'", f"model='{FAKE_MODEL}'")
        answer = subprocess.run([sys.executable, "-c", line], capture_output=True, text=True, timeout=60)
        assert answer.returncode == 0, answer.stderr
        assert answer.stdout.strip()
    finally:
        os.killpg(script.pid, signal.SIGINT)  # Ctrl-C: the script stops smg and the replicas
        script.wait(30)

    def leftovers() -> list[str]:
        return subprocess.run(["pgrep", "-s", str(script.pid)], capture_output=True, text=True).stdout.split()

    deadline = time.monotonic() + 15
    while leftovers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert leftovers() == [], "processes of the script outlived it"
