"""The harness's packages are layers (docs/conformance-map.md): each imports only those below it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "conformance"
LAYERS = (
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


def _layer(module: str) -> int | None:
    """The layer of ``conformance.X...`` (None for names outside the harness)."""
    parts = module.split(".")
    if parts[0] != "conformance":
        return None
    top = parts[1] if len(parts) > 1 else "__init__"
    return next(i for i, names in enumerate(LAYERS) if top in names.split("|"))


def _imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return found


def test_no_package_imports_one_above_it() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        own = _layer(module)
        assert own is not None
        for imported in _imports(path):
            layer = _layer(imported)
            if layer is not None and layer > own:
                upward.append(f"{module} (layer {own + 1}) imports {imported} (layer {layer + 1})")
    assert upward == []


def test_every_package_of_the_harness_has_a_layer() -> None:
    tops = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or p.is_dir()}
    tops.discard("__pycache__")
    named = {name for names in LAYERS for name in names.split("|")}
    assert tops <= named, tops - named
