"""A slow server that runs one request at a time gets a complete run with the default flags: the
harness measures its pace before the cases (conformance/harness/pace.py), prints what it chose,
asks it nothing but cheap calls to know it is alive, and gives every case a verdict. The server
here is the reference with the fake engine decoding one sequence at a time at 0.1 s a token (an
ordinary request ~1.2 s); the cases are the ones that keep several requests in flight."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from judged import run_conformance

from reference_server.smg_gateway import SmgGateway
from reference_server.testing import ServerProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SLOW_SERIAL_ARGS = ("--max-running", "1", "--fake-token-delay", "0.1", "--no-embedding")
GRPC_CASES = (
    "HEALTH-1[in-flight],LOAD-1[ground-truth],ABORT-5,CANCEL-3,CANCEL-3[shared-prefix],"
    "STREAM-5[every-byte],STREAM-6[concurrent],FLOW-2,STREAM-2,ERR-5,REQ-6[one-over]"
)
OPENAI_CASES = "SVC-1[openai],FINISH-1[openai,pool],STREAM-2[openai,greedy],STREAM-6[openai],CANCEL-1[openai],CANCEL-3[openai],FLOW-1[openai]"


def _judged_completely(
    tmp_path: Path, name: str, target: str, protocol: str, cases: str
) -> dict[str, object]:
    outcome = run_conformance(target, protocol, tmp_path, name, "--run", cases, "--wait", "60")
    verdicts = {c["id"]: c["verdict"] for c in outcome.report["cases"]}  # type: ignore[union-attr]
    assert verdicts, outcome.stdout
    assert not {c for c, v in verdicts.items() if v in ("NOT-RUN", "FAIL", "ERROR")}, outcome.explain()
    assert outcome.exit_code == 0, outcome.explain()
    pace = outcome.report["settings"]["pace"]  # type: ignore[index]
    assert pace["measured_parallel"] and pace["parallel"] == 1 and pace["jobs"] == 1, pace
    report = json.loads((tmp_path / f"{name}.json").read_text())
    assert report["aborted"] == "", report["aborted"]
    return pace  # type: ignore[no-any-return]


def test_a_slow_serial_grpc_server_gets_a_verdict_for_every_case(tmp_path: Path) -> None:
    with ServerProcess(engine="fake", args=SLOW_SERIAL_ARGS) as server:
        _judged_completely(tmp_path, "lmrpc", server.target, "lmrpc", GRPC_CASES)


def test_a_slow_serial_openai_server_gets_a_verdict_for_every_case(tmp_path: Path) -> None:
    with ServerProcess(engine="fake", args=SLOW_SERIAL_ARGS) as server:
        with SmgGateway([server.target], model="fake-SmolLM2-135M-Instruct") as gateway:
            _judged_completely(tmp_path, "openai", gateway.base_url, "openai", OPENAI_CASES)
