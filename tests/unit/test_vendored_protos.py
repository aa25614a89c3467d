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
SGLANG_RUNTIME_COMMIT = "cde1809f1dd3ae51c64313b08135a196a997be9e"
SGLANG_RUNTIME_SHA256 = "c294534ca219c3ffd343d4bd45b76cb0eb1f938acd74a0e943738c2f04125461"


def test_the_sglang_runtime_proto_is_the_recorded_upstream_file() -> None:
    """proto/third_party/sglang_runtime/ holds SGLang's sglang.proto unmodified, at the commit
    and digest its README records."""
    files = sorted(p.relative_to(SGLANG_RUNTIME).as_posix() for p in SGLANG_RUNTIME.rglob("*.proto"))
    assert files == ["sglang/runtime/v1/sglang.proto"]
    digest = hashlib.sha256((SGLANG_RUNTIME / files[0]).read_bytes()).hexdigest()
    assert digest == SGLANG_RUNTIME_SHA256, "sglang.proto differs from the vendored upstream file"
    readme = (SGLANG_RUNTIME / "README.md").read_text()
    assert SGLANG_RUNTIME_COMMIT in readme and SGLANG_RUNTIME_SHA256 in readme
    licence = (SGLANG_RUNTIME / "LICENSE").read_text()
    assert "Apache License" in licence and "SGLang Team" in licence
