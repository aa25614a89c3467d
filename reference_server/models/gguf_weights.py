"""Llama weights from a GGUF file: dequantized with the ``gguf`` package, Hugging Face names.

llama.cpp's converter permutes the rows of each q/k head so that GGML's adjacent-pair RoPE
reproduces Hugging Face's rotate-half RoPE; we undo that permutation so one RoPE convention
(rotate-half, as in transformers) serves both checkpoint formats.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from reference_server.models.llama import LlamaConfig
from reference_server.models.quantized import BlockFormat, BlockWeight

GGUF_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GGUF_GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def load_gguf_llama(path: Path) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """Config and float32 state dict (Hugging Face names) of a llama-architecture GGUF file."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(path)
    config = _gguf_config(reader, path)
    weights: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        array = np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)  # copies the memmap
        name = _hf_name(tensor.name)
        value = torch.from_numpy(array)
        if name.endswith("q_proj.weight"):
            value = _unpermute(value, config.num_heads)
        elif name.endswith("k_proj.weight"):
            value = _unpermute(value, config.num_kv_heads)
        weights[name] = value
    return config, weights


def gguf_llama_config(path: Path) -> LlamaConfig:
    """The configuration alone (no tensor is read)."""
    from gguf import GGUFReader

    return _gguf_config(GGUFReader(path), path)


def _gguf_config(reader: Any, path: Path) -> LlamaConfig:
    def meta(key: str) -> Any:
        field = reader.fields.get(key)
        return None if field is None else field.contents()

    arch = meta("general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: architecture {arch!r} is not supported (only 'llama')")
    scaling = meta("llama.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ValueError(f"{path}: RoPE scaling {scaling!r} is not supported")
    names = {t.name for t in reader.tensors}
    num_heads = int(meta("llama.attention.head_count"))
    hidden = int(meta("llama.embedding_length"))
    head_dim = meta("llama.attention.key_length") or meta("llama.rope.dimension_count") or hidden // num_heads
    vocab = meta("llama.vocab_size")
    if vocab is None:
        vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    config = LlamaConfig(
        num_layers=int(meta("llama.block_count")),
        hidden_size=hidden,
        intermediate_size=int(meta("llama.feed_forward_length")),
        num_heads=num_heads,
        num_kv_heads=int(meta("llama.attention.head_count_kv") or num_heads),
        head_dim=int(head_dim),
        rope_theta=float(meta("llama.rope.freq_base") or 10000.0),
        rms_norm_eps=float(meta("llama.attention.layer_norm_rms_epsilon")),
        vocab_size=int(vocab),
        max_context_tokens=int(meta("llama.context_length")),
        tie_embeddings="output.weight" not in names,
    )
    return config


def load_gguf_blocks(path: Path) -> dict[str, BlockWeight]:
    """The tensors a GGUF file stores as Q4_1 or Q8_0 blocks, as stored (Hugging Face names, q and
    k rows in Hugging Face's order): the native kernels run them without dequantizing."""
    from gguf import GGMLQuantizationType, GGUFReader

    formats: dict[object, BlockFormat] = {
        GGMLQuantizationType.Q4_1: "q4_1",
        GGMLQuantizationType.Q8_0: "q8_0",
    }
    reader = GGUFReader(path)
    heads = {"q": int(reader.fields["llama.attention.head_count"].contents())}
    kv_field = reader.fields.get("llama.attention.head_count_kv")
    heads["k"] = heads["q"] if kv_field is None else int(kv_field.contents())
    blocks: dict[str, BlockWeight] = {}
    for tensor in reader.tensors:
        format = formats.get(tensor.tensor_type)
        if format is None:
            continue
        name = _hf_name(tensor.name)
        array = np.array(tensor.data, dtype=np.uint8)  # [rows, blocks * block bytes]; copies the memmap
        for projection, count in heads.items():
            if name.endswith(f"{projection}_proj.weight"):
                array = _unpermute_rows(array, count)
        blocks[name] = BlockWeight(format, np.ascontiguousarray(array), int(tensor.shape[0]))
    return blocks


def _hf_name(gguf_name: str) -> str:
    base, _, suffix = gguf_name.rpartition(".")
    if base in GGUF_GLOBAL_TENSORS:
        return f"{GGUF_GLOBAL_TENSORS[base]}.{suffix}"
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in GGUF_LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{GGUF_LAYER_TENSORS[parts[2]]}.{suffix}"
    raise ValueError(f"unexpected GGUF tensor {gguf_name!r}")


def _unpermute_rows(rows: np.ndarray, num_heads: int) -> np.ndarray:
    """``_unpermute`` on whole rows (of blocks)."""
    count = rows.shape[0]
    head_dim = count // num_heads
    return rows.reshape(num_heads, head_dim // 2, 2, -1).transpose(0, 2, 1, 3).reshape(count, -1)


def _unpermute(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[heads*D, in] in GGML's interleaved-pair row order → Hugging Face's half-split order."""
    rows = weight.shape[0]
    head_dim = rows // num_heads
    return weight.reshape(num_heads, head_dim // 2, 2, -1).transpose(1, 2).reshape(rows, -1).contiguous()
