"""Both packages are layers, each importing only those below it: the harness's
(docs/conformance-map.md) and the reference server's (docs/architecture.md), whose worker
processes, peers in one layer, never import each other."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HARNESS = (
    "vocabulary",
    "spec",
    "stream",
    "drivers",
    "validators",
    "report",
    "harness",
    "search",
    "cases",
    "commands|cli|__main__|pytest_plugin|__init__",
)
SERVER = (
    "__init__|cache_dir|config|cpu|ipc|tracing|worker_io",  # what every process shares
    "models",
    "engine",
    "detokenizer|scheduler",  # the worker processes: peers
    "frontend",  # the process that starts them
    "cli|__main__|testing|smg_gateway",
)
PEERS = {"detokenizer", "scheduler"}
PACKAGES = {"conformance": HARNESS, "reference_server": SERVER}


def _top(module: str, package: str) -> str | None:
    parts = module.split(".")
    if parts[0] != package:
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def _layer(top: str, layers: tuple[str, ...]) -> int:
    return next(i for i, names in enumerate(layers) if top in names.split("|"))


def _imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_module_imports_a_layer_above_its_own_or_a_peer_process(package: str) -> None:
    layers = PACKAGES[package]
    wrong = []
    for path in sorted((ROOT / package).rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        top = _top(module, package)
        assert top is not None
        own = _layer(top, layers)
        for imported in _imports(path):
            other = _top(imported, package)
            if other is None or other == top:
                continue
            layer = _layer(other, layers)
            if layer > own or (top in PEERS and other in PEERS):
                wrong.append(f"{module} (layer {own + 1}) imports {imported} (layer {layer + 1})")
    assert wrong == []


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_every_module_and_folder_has_a_layer(package: str) -> None:
    folder = ROOT / package
    tops = {p.stem if p.is_file() else p.name for p in folder.iterdir() if p.suffix == ".py" or p.is_dir()}
    tops.discard("__pycache__")
    named = {name for names in PACKAGES[package] for name in names.split("|")}
    assert tops <= named, tops - named


MAX_MODULE_LINES = 600
MAX_FORWARD_LINES = 100  # lm_forward, the native pass: its scratch and its attention are helpers


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_module_grows_past_its_one_job(package: str) -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for path in sorted((ROOT / package).rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"split these by job (at most {MAX_MODULE_LINES} lines each)"


def test_the_native_forward_pass_reads_in_one_screen() -> None:
    source = (ROOT / "reference_server" / "engine" / "native" / "forward.c").read_text().splitlines()
    start = next(i for i, line in enumerate(source) if line.startswith("int lm_forward("))
    end = next(i for i in range(start, len(source)) if source[i] == "}")
    assert end - start + 1 <= MAX_FORWARD_LINES
