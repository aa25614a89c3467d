"""Each clean environment, made with pip from the built wheel as the README says, imports every
module it ships and runs what it is for: the harness-only one (no torch) runs the README's CI
commands as written against a reference server; the server-only one serves constrained decoding
on the embedded model."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from lmrpc.client import LmrpcClient
from lmrpc.v1 import (
    Constraint,
    GenerateRequest,
    GetServerInfoRequest,
    GetServerInfoResponse,
    SamplingParams,
    StoppingCriteria,
)
from reference_server.testing import ServerProcess

from .dist import CI_SECTION, SERVER_SECTION, Dist, bash_block, environ_for

IMPORTER = Path(__file__).with_name("import_every_module.py")
README_TARGET = "127.0.0.1:50051"  # the address the README's commands name


def python(dist: Dist, name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [dist.bin(name, "python"), *args], cwd=cwd, env=environ_for(dist.venv(name), dist.folder),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("name", "packages", "absent"),
    [
        ("harness", ("lmrpc", "conformance"), ("torch", "zmq")),
        ("server", ("lmrpc", "reference_server"), ("hypothesis", "rich")),
        ("all", ("lmrpc", "conformance", "reference_server"), ()),
    ],
)
def test_every_module_imports_in_a_clean_environment(
    dist: Dist, tmp_path: Path, name: str, packages: tuple[str, ...], absent: tuple[str, ...]
) -> None:
    done = python(dist, name, str(IMPORTER), *packages, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    for module in absent:  # what the other extra brings, which this one must not pull in
        probe = python(dist, name, "-c", f"import {module}", cwd=tmp_path)
        assert probe.returncode != 0, f"{name} has {module}"


def test_the_readmes_ci_commands_run_as_written(
    dist: Dist, tmp_path: Path, fake_server: ServerProcess
) -> None:
    """The section's pip line made the harness environment (dist.py); its run line, with the
    README's address swapped for the test server's, passes and writes both reports."""
    pip, run = bash_block(CI_SECTION)
    assert pip == 'pip install "lmrpc[conformance]"' and run.startswith(
        f"conformance run --target {README_TARGET} "
    )
    argv = shlex.split(run.replace(README_TARGET, fake_server.target))
    done = subprocess.run(
        argv, cwd=tmp_path, env=environ_for(dist.venv("harness"), dist.folder) | {"CI": "true"},
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "conformance.json").read_text())
    assert report["harness_version"] and report["exit_code"] == 0 and report["level"] == "must"
    assert (tmp_path / "conformance.xml").read_text().startswith("<?xml")
    lines = done.stdout.splitlines()  # CI=true and no terminal: one line per case, no table
    assert any(re.match(r"PASS +STREAM-1 +\d+\.\d\ds$", line) for line in lines), lines[:20]
    assert not any("│" in line for line in lines)


def test_the_server_from_pip_serves_constrained_decoding(dist: Dist, tmp_path: Path) -> None:
    """The README's server lines (which made the environment) give a server that advertises
    constrained decoding and keeps to a regex and a JSON schema on the embedded model."""
    assert bash_block(SERVER_SECTION, 1)[-1] == f"lmrpc-server --port {README_TARGET.rsplit(':', 1)[1]}"
    program = dist.bin("server", "lmrpc-server")
    server = ServerProcess(
        engine="model", python=dist.bin("server", "python"), launcher=(program,), cwd=str(tmp_path)
    )
    with server:
        info, phone, person = asyncio.run(_constrained(server.target))
    assert info.server.capabilities.constrained_decoding
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", phone), phone
    assert set(json.loads(person)) == {"name", "age"}


async def _constrained(target: str) -> tuple[GetServerInfoResponse, str, str]:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    async with LmrpcClient.connect(target) as client:
        info = await client.control.get_server_info(GetServerInfoRequest())
        texts = []
        for constraint in (
            Constraint(regex=r"[0-9]{3}-[0-9]{4}"),
            Constraint(json_schema=json.dumps(schema)),
        ):
            result = await client.generate(
                GenerateRequest(
                    text="Write it down:", constraint=constraint, sampling=SamplingParams(temperature=0.0),
                    stopping=StoppingCriteria(max_tokens=128),
                )
            )  # fmt: skip
            texts.append(result.text)
    return info, texts[0], texts[1]
