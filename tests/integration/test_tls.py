"""TLS and mutual TLS end to end: the reference server serves over TLS, the SDK client and the
conformance harness (``--tls ...``) connect to it, and plaintext or certificate-less clients are
refused instead of hanging."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
from grpclib import GRPCError, Status
from grpclib.exceptions import StreamTerminatedError
from harness_cli import harness_command

from lmrpc.client import LmrpcClient, tls_context
from lmrpc.v1 import GenerateRequest, PauseGenerationRequest, StoppingCriteria
from reference_server.testing import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
REQUEST = GenerateRequest(text="hello over TLS", stopping=StoppingCriteria(max_tokens=5, ignore_eos=True))


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("conformance@lmrpc.test")
    files = Pki(
        *(folder / name for name in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key"))
    )
    ca.cert_pem.write_to_path(str(files.ca))
    for issued, cert, key in (
        (server, files.server_cert, files.server_key),
        (client, files.client_cert, files.client_key),
    ):
        for pem in issued.cert_chain_pems:
            pem.write_to_path(str(cert), append=True)
        issued.private_key_pem.write_to_path(str(key))
    return files


@pytest.fixture(scope="module")
def tls_server(pki: Pki) -> Iterator[ServerProcess]:
    args = ("--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key))
    with ServerProcess(engine="fake", args=args) as server:
        yield server


@pytest.fixture(scope="module")
def mtls_server(pki: Pki) -> Iterator[ServerProcess]:
    args = (
        "--tls-cert",
        str(pki.server_cert),
        "--tls-key",
        str(pki.server_key),
        "--tls-client-ca",
        str(pki.ca),
    )
    with ServerProcess(engine="fake", args=args) as server:
        yield server


def conformance(target: str, tmp_path: Path, *tls_args: str) -> tuple[int, dict[str, object]]:
    report = tmp_path / "report.json"
    done = subprocess.run(
        [*harness_command(), "run", "--target", target, "--level", "must",
         "--json", str(report), "--quiet", *tls_args],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    data = json.loads(report.read_text()) if report.exists() else {}
    return done.returncode, data


async def generate_text(target: str, context: object) -> str:
    async with LmrpcClient.connect(target, tls=context) as client:  # type: ignore[arg-type]
        result = await asyncio.wait_for(client.generate(REQUEST), 10)
        assert result.outputs[0].token_ids and len(result.outputs[0].token_ids) == 5
        return result.outputs[0].text


def test_sdk_client_generates_over_tls(tls_server: ServerProcess, pki: Pki) -> None:
    text = asyncio.run(generate_text(tls_server.target, tls_context(str(pki.ca))))
    assert text


def test_plaintext_client_is_refused_by_a_tls_server(tls_server: ServerProcess) -> None:
    with pytest.raises((StreamTerminatedError, ConnectionError, OSError, asyncio.TimeoutError)):
        asyncio.run(generate_text(tls_server.target, None))


def test_untrusted_server_certificate_is_refused(tls_server: ServerProcess) -> None:
    import ssl

    with pytest.raises(ssl.SSLCertVerificationError):
        asyncio.run(generate_text(tls_server.target, tls_context()))  # system store: our CA is unknown


def test_conformance_must_level_passes_over_tls(tls_server: ServerProcess, pki: Pki, tmp_path: Path) -> None:
    # every case, each kind of connection included (raw HTTP/2 ones too); the property search's
    # depth is the plain-text self-test's to spend
    code, report = conformance(
        tls_server.target, tmp_path, "--tls", "--tls-ca", str(pki.ca), "--max-examples", "2"
    )
    assert code == 0, report.get("summary")
    cases = report["cases"]
    assert isinstance(cases, list) and sum(case["verdict"] == "PASS" for case in cases) > 100


def test_mutual_tls_needs_a_client_certificate(mtls_server: ServerProcess, pki: Pki, tmp_path: Path) -> None:
    without, _ = conformance(mtls_server.target, tmp_path, "--tls", "--tls-ca", str(pki.ca), "--run", "SVC-*")
    assert without == 3  # target unreachable: the handshake fails, the harness says so and stops
    with_cert, report = conformance(
        mtls_server.target, tmp_path, "--tls", "--tls-ca", str(pki.ca),
        "--tls-cert", str(pki.client_cert), "--tls-key", str(pki.client_key), "--run", "STREAM-*",
    )  # fmt: skip
    assert with_cert == 0, report.get("summary")
    cases = report["cases"]
    assert isinstance(cases, list) and any(case["verdict"] == "PASS" for case in cases)


def test_unreadable_tls_files_fail_startup_clearly(pki: Pki) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "reference_server", "--engine", "fake", "--port", "0",
         "--tls-cert", str(pki.server_cert), "--tls-key", "/nonexistent/server.key"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and "/nonexistent/server.key" in result.stderr


def test_a_client_certificate_is_a_principal_with_a_role(tmp_path: Path) -> None:
    """With --auth, a verified client certificate named in the file authenticates (AUTH-1)."""
    issuer = trustme.CA()
    server_cert = issuer.issue_cert("127.0.0.1")
    gateway = issuer.issue_cert("gateway@lmrpc.test", common_name="gateway")
    stranger = issuer.issue_cert("stranger@lmrpc.test", common_name="stranger")
    files = {name: tmp_path / name for name in ("ca.pem", "server.pem", "server.key", "tokens")}
    issuer.cert_pem.write_to_path(str(files["ca.pem"]))
    server_cert.cert_chain_pems[0].write_to_path(str(files["server.pem"]))
    server_cert.private_key_pem.write_to_path(str(files["server.key"]))
    files["tokens"].write_text("cert:gateway client\n")

    def context(issued: trustme.LeafCert) -> object:
        cert, key = tmp_path / "client.pem", tmp_path / "client.key"
        issued.cert_chain_pems[0].write_to_path(str(cert))
        issued.private_key_pem.write_to_path(str(key))
        return tls_context(str(files["ca.pem"]), cert_file=str(cert), key_file=str(key))

    async def body(target: str) -> None:
        async with LmrpcClient.connect(target, tls=context(gateway)) as client:  # type: ignore[arg-type]
            result = await asyncio.wait_for(client.generate(REQUEST), 10)
            assert len(result.outputs[0].token_ids) == 5
            with pytest.raises(GRPCError) as denied:
                await client.control.pause_generation(PauseGenerationRequest())
            assert denied.value.status is Status.PERMISSION_DENIED
        async with LmrpcClient.connect(target, tls=context(stranger)) as client:  # type: ignore[arg-type]
            with pytest.raises(GRPCError) as refused:
                await client.generate(REQUEST)
            assert refused.value.status is Status.UNAUTHENTICATED

    args = (
        "--tls-cert", str(files["server.pem"]), "--tls-key", str(files["server.key"]),
        "--tls-client-ca", str(files["ca.pem"]), "--auth", str(files["tokens"]),
    )  # fmt: skip
    with ServerProcess(engine="fake", args=args) as server:
        asyncio.run(body(server.target))
