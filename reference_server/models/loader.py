"""Build a ready-to-run LlamaModel from a ModelSource on a device and dtype."""

from __future__ import annotations

import json

import torch

from reference_server.models.gguf_weights import gguf_llama_config, load_gguf_llama
from reference_server.models.hf_weights import hf_llama_config, load_hf_llama
from reference_server.models.int4_linear import int4_supported
from reference_server.models.llama import LlamaConfig, LlamaModel, hf_tensor_shapes
from reference_server.models.packed_linear import prepack_supported
from reference_server.models.source import ModelSource

PREPACK_BATCH_HINT = 32  # the row count oneDNN tunes the packed layout for (numbers do not depend on it)


class CheckpointMismatchError(ValueError):
    """A checkpoint that does not fit the served model's shape; the message says where."""


def load_weights(source: ModelSource) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    if source.kind == "gguf":
        return load_gguf_llama(source.path)
    return load_hf_llama(source.path)


def load_config(source: ModelSource) -> LlamaConfig:
    """The model's configuration, without reading its weights."""
    if source.kind == "gguf":
        return gguf_llama_config(source.path)
    return hf_llama_config(json.loads((source.path / "config.json").read_text()), source.path)


def load_llama(
    source: ModelSource,
    *,
    device: torch.device,
    dtype: torch.dtype,
    int4_weights: bool = False,
    prepack: bool = True,
) -> LlamaModel:
    """``int4_weights``: the layers' projections as 4-bit groups of 32 in torch's int4 kernel (CPU, bf16 only).
    ``prepack``: give bf16 CPU projections oneDNN's layout now (``LlamaModel.prepack_weights``)."""
    if int4_weights and not int4_supported(device, dtype):
        raise ValueError(f"int4 weights need the CPU and bfloat16, not {device.type} and {dtype}")
    config, weights = load_weights(source)
    model = LlamaModel(config, dtype, device)
    model.load_hf_state_dict(weights, int4_weights=int4_weights)
    if prepack and prepack_supported(device, dtype):
        model.prepack_weights(PREPACK_BATCH_HINT)
    return model.eval()


def check_checkpoint_fits(served: LlamaConfig, config: LlamaConfig, weights: dict[str, torch.Tensor]) -> None:
    """Raise CheckpointMismatchError unless ``config`` and ``weights`` have exactly the served
    model's configuration, tensor names and shapes (a shape that only broadcasts is refused too)."""
    differing = [
        f"{name}={getattr(config, name)!r} (served: {getattr(served, name)!r})"
        for name in served.__dataclass_fields__
        if getattr(config, name) != getattr(served, name)
    ]
    if differing:
        raise CheckpointMismatchError(f"the checkpoint's configuration differs: {', '.join(differing)}")
    expected = hf_tensor_shapes(served)
    optional = {"lm_head.weight"} if served.tie_embeddings else set()  # tied checkpoints may keep a copy
    missing = sorted(set(expected) - set(weights) - optional)
    unexpected = sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise CheckpointMismatchError(
            f"the checkpoint's tensors differ: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    for name, tensor in weights.items():
        if tuple(tensor.shape) != expected[name]:
            raise CheckpointMismatchError(
                f"tensor {name} has shape {tuple(tensor.shape)}; the served model's is {expected[name]}"
            )
