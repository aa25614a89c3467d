"""proto/third_party/smg/ holds unmodified copies of the pinned smg-grpc-proto package's files."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENDORED = ROOT / "proto" / "third_party" / "smg"


def pinned_version() -> str:
    name, _, version = (VENDORED / "VERSION").read_text().strip().partition("==")
    assert name == "smg-grpc-proto"
    return version


def test_the_installed_package_is_the_pinned_version() -> None:
    assert importlib.metadata.version("smg-grpc-proto") == pinned_version()
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"smg-grpc-proto=={pinned_version()}"' in pyproject


def test_vendored_files_equal_the_packages() -> None:
    spec = importlib.util.find_spec("smg_grpc_proto")  # located, not imported
    assert spec is not None and spec.submodule_search_locations
    upstream = Path(next(iter(spec.submodule_search_locations))) / "proto"
    vendored = sorted(VENDORED.glob("*.proto"))
    assert [p.name for p in vendored] == ["common.proto", "sglang_scheduler.proto", "vllm_engine.proto"]
    for path in vendored:
        assert path.read_bytes() == (upstream / path.name).read_bytes(), f"{path.name} differs from upstream"


def test_the_licence_is_vendored_with_them() -> None:
    licence = (VENDORED / "LICENSE").read_text()
    assert "Apache License" in licence and "Version 2.0" in licence


SGLANG_RUNTIME = ROOT / "proto" / "third_party" / "sglang_runtime"
SGLANG_RUNTIME_RELEASE = "sglang` 0.5.23"
SGLANG_RUNTIME_SHA256 = "5f2bf11ea8b2430667b0342794d9b79c6cda4e93d69b6cfe1f8adb0eef87315c"


def test_the_sglang_runtime_proto_is_the_recorded_upstream_file() -> None:
    """proto/third_party/sglang_runtime/ holds SGLang's sglang.proto as the release its README
    names serves it (checked against that release's server), at the digest the README records."""
    files = sorted(p.relative_to(SGLANG_RUNTIME).as_posix() for p in SGLANG_RUNTIME.rglob("*.proto"))
    assert files == ["sglang/runtime/v1/sglang.proto"]
    digest = hashlib.sha256((SGLANG_RUNTIME / files[0]).read_bytes()).hexdigest()
    assert digest == SGLANG_RUNTIME_SHA256, "sglang.proto differs from the vendored upstream file"
    readme = (SGLANG_RUNTIME / "README.md").read_text()
    assert SGLANG_RUNTIME_RELEASE in readme and SGLANG_RUNTIME_SHA256 in readme
    licence = (SGLANG_RUNTIME / "LICENSE").read_text()
    assert "Apache License" in licence and "SGLang Team" in licence


def test_the_sglang_runtime_proto_has_the_releases_26_rpcs() -> None:
    """SGLang 0.5.23's SglangService: the 25 RPCs of cde1809f and WatchEngineState, in the
    release's order."""
    text = (SGLANG_RUNTIME / "sglang" / "runtime" / "v1" / "sglang.proto").read_text()
    rpcs = [line.split()[1].split("(")[0] for line in text.splitlines() if line.strip().startswith("rpc ")]
    assert len(rpcs) == 26 and rpcs[8] == "WatchEngineState", rpcs
