"""Build a ready-to-run LlamaModel from a ModelSource on a device and dtype."""

from __future__ import annotations

import torch

from reference_server.models.gguf_weights import load_gguf_llama
from reference_server.models.hf_weights import load_hf_llama
from reference_server.models.int4_linear import int4_supported
from reference_server.models.llama import LlamaConfig, LlamaModel
from reference_server.models.packed_linear import prepack_supported
from reference_server.models.source import ModelSource

PREPACK_BATCH_HINT = 32  # the row count oneDNN tunes the packed layout for (numbers do not depend on it)


def load_weights(source: ModelSource) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    if source.kind == "gguf":
        return load_gguf_llama(source.path)
    return load_hf_llama(source.path)


def load_llama(
    source: ModelSource,
    *,
    device: torch.device,
    dtype: torch.dtype,
    int4_weights: bool = False,
    prepack: bool = True,
) -> LlamaModel:
    """``int4_weights``: the layers' projections as 4-bit groups of 32 (CPU, bf16 only).
    ``prepack``: give bf16 CPU projections oneDNN's layout now (``LlamaModel.prepack_weights``)."""
    if int4_weights and not int4_supported(device, dtype):
        raise ValueError(f"int4 weights need the CPU and bfloat16, not {device.type} and {dtype}")
    config, weights = load_weights(source)
    model = LlamaModel(config, dtype, device)
    model.load_hf_state_dict(weights, int4_weights=int4_weights)
    if prepack and prepack_supported(device, dtype):
        model.prepack_weights(PREPACK_BATCH_HINT)
    return model.eval()
