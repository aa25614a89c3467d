"""Llama weights from a local Hugging Face directory: config.json + *.safetensors (no hub)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from reference_server.models.llama import LlamaConfig

SUPPORTED_MODEL_TYPES = ("llama", "mistral")


def load_hf_llama(folder: Path) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """Config and state dict (checkpoint dtype, Hugging Face names) of a Llama-family directory."""
    from safetensors.torch import load_file

    config = hf_llama_config(json.loads((folder / "config.json").read_text()), folder)
    weights: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        weights.update(load_file(str(shard)))
    return config, weights


def hf_llama_config(raw: dict[str, Any], folder: Path) -> LlamaConfig:
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"{folder}: model_type {model_type!r} is not supported ({', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    if raw.get("attention_bias") or raw.get("mlp_bias"):
        raise ValueError(f"{folder}: attention_bias/mlp_bias are not supported")
    if raw.get("sliding_window") is not None and model_type == "mistral":
        raise ValueError(f"{folder}: sliding-window attention is not supported")
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", None):
        raise ValueError(f"{folder}: RoPE scaling {rope_type!r} is not supported")
    theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
    num_heads = int(raw["num_attention_heads"])
    hidden = int(raw["hidden_size"])
    return LlamaConfig(
        num_layers=int(raw["num_hidden_layers"]),
        hidden_size=hidden,
        intermediate_size=int(raw["intermediate_size"]),
        num_heads=num_heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
        head_dim=int(raw.get("head_dim") or hidden // num_heads),
        rope_theta=float(theta),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        vocab_size=int(raw["vocab_size"]),
        max_context_tokens=int(raw.get("max_position_embeddings", 2048)),
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
    )
