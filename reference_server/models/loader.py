"""Build a ready-to-run LlamaModel from a ModelSource on a device and dtype."""

from __future__ import annotations

import torch

from reference_server.models.gguf_weights import load_gguf_llama
from reference_server.models.hf_weights import load_hf_llama
from reference_server.models.llama import LlamaConfig, LlamaModel
from reference_server.models.source import ModelSource


def load_weights(source: ModelSource) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    if source.kind == "gguf":
        return load_gguf_llama(source.path)
    return load_hf_llama(source.path)


def load_llama(source: ModelSource, *, device: torch.device, dtype: torch.dtype) -> LlamaModel:
    config, weights = load_weights(source)
    model = LlamaModel(config, dtype, device)
    model.load_hf_state_dict(weights)
    return model.eval()
