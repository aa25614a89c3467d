"""Llama in plain torch, over flattened variable-length batches.

One forward pass takes the new tokens of every scheduled sequence concatenated into one row
per token (no padding between sequences), each with its own position; attention is delegated
to a backend that knows which rows belong to which sequence and where their KV lives. Only the
rows that need logits go through the LM head.

Row invariance: a token's hidden state must not depend on how many other rows share the
forward pass (batch-invariant greedy/seeded outputs). CPU GEMMs pick a different reduction
order for very small row counts (bf16 oneDNN: 1 row; fp32 MKL: up to 3 rows), so every matmul
here sees at least ``MIN_GEMM_ROWS`` rows; shorter inputs are padded with zero rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from reference_server.models.int4_linear import Int4Linear
from reference_server.models.packed_linear import PackedLinear

MIN_GEMM_ROWS = 4


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    vocab_size: int
    max_context_tokens: int
    tie_embeddings: bool

    def __post_init__(self) -> None:
        for name in (
            "num_layers",
            "hidden_size",
            "intermediate_size",
            "num_heads",
            "num_kv_heads",
            "head_dim",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def layer_parameters(self) -> int:
        """Weights of one layer's four projections (what a decode step reads per layer)."""
        h = self.hidden_size
        return h * (self.q_size + 2 * self.kv_size) + self.q_size * h + 3 * self.intermediate_size * h


def hf_tensor_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Hugging Face Llama checkpoint of this configuration, and its shape
    (``lm_head.weight`` too, which a tied checkpoint may leave out)."""
    h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (v, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (v, h),
    }
    for layer in range(config.num_layers):
        p = f"model.layers.{layer}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (config.q_size, h),
            p + "self_attn.k_proj.weight": (config.kv_size, h),
            p + "self_attn.v_proj.weight": (config.kv_size, h),
            p + "self_attn.o_proj.weight": (h, config.q_size),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        }
    return shapes


class Attention(Protocol):
    """What a decoder layer needs from the attention backend for the current step."""

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T, H, D], k/v [T, KVH, D] for the step's new tokens (plus padding rows at the end).
        Stores k/v in the KV cache and returns attention output [T, H, D]."""
        ...


def _linear(in_features: int, out_features: int, dtype: torch.dtype) -> nn.Linear:
    return nn.Linear(in_features, out_features, bias=False, device="meta", dtype=dtype)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(size, dtype=dtype, device="meta"), requires_grad=False)
        self.float_weight: torch.Tensor | None = None  # set by freeze(): one conversion, not one per call

    def freeze(self) -> None:
        """The weights are final: keep their float32 copy."""
        self.float_weight = self.weight.float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: the float32 residual stream → normalized, in the weights' dtype."""
        xf = x.float()
        inverse_rms = xf.pow(2).mean(-1, keepdim=True).add_(self.eps).rsqrt_()
        weight = self.weight.float() if self.float_weight is None else self.float_weight
        return (xf * inverse_rms).mul_(weight).to(self.weight.dtype)


class RotaryEmbedding:
    """Rotate-half RoPE (Hugging Face convention) with a precomputed float32 cos/sin table."""

    def __init__(self, head_dim: int, theta: float, max_positions: int, device: torch.device) -> None:
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
        self.cos = freqs.cos().to(device)  # [max_positions, D/2]
        self.sin = freqs.sin().to(device)

    def angles(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[cos, cos] and [-sin, sin], [T, 1, D], for the step's positions (shared by every layer)."""
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)

    @staticmethod
    def rotate(x: torch.Tensor, angles: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """(x1, x2) → (x1 cos - x2 sin, x2 cos + x1 sin), as x * [cos, cos] + (x2, x1) * [-sin, sin]:
        the same products and sums in the same order, in a third of the ops."""
        cos, signed_sin = angles
        xf = x.float()
        return (xf * cos + xf.roll(x.shape[-1] // 2, dims=-1) * signed_sin).to(x.dtype)


class Released(nn.Module):
    """Where a weight was, once the native kernels hold their own copy (``LlamaModel.release_weights``)."""

    def forward(self, *args: object) -> torch.Tensor:
        raise RuntimeError("this model's weights were released: the native kernels run it")


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, index: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.index = index
        self.config = config
        h, i = config.hidden_size, config.intermediate_size
        self.input_norm = RMSNorm(h, config.rms_norm_eps, dtype)
        # nn.Linear, or Int4Linear after load_hf_state_dict(..., int4_weights=True)
        self.qkv_proj: nn.Module = _linear(h, config.q_size + 2 * config.kv_size, dtype)
        self.o_proj: nn.Module = _linear(config.q_size, h, dtype)
        self.post_attention_norm = RMSNorm(h, config.rms_norm_eps, dtype)
        self.gate_up_proj: nn.Module = _linear(h, 2 * i, dtype)
        self.down_proj: nn.Module = _linear(i, h, dtype)

    def forward(
        self, x: torch.Tensor, angles: tuple[torch.Tensor, torch.Tensor], attention: Attention
    ) -> torch.Tensor:
        c = self.config
        rows = x.shape[0]
        qkv: torch.Tensor = self.qkv_proj(self.input_norm(x))
        heads = c.num_heads + c.num_kv_heads
        qk = RotaryEmbedding.rotate(qkv[:, : heads * c.head_dim].view(rows, heads, c.head_dim), angles)
        q, k = qk[:, : c.num_heads], qk[:, c.num_heads :]
        v = qkv[:, heads * c.head_dim :].view(rows, c.num_kv_heads, c.head_dim)
        out = attention.forward(self.index, q, k, v)
        # float32 += bf16 widens each element exactly, as .float() then + would, without the copy
        x = x + self.o_proj(out.reshape(rows, c.q_size))
        gate, up = self.gate_up_proj(self.post_attention_norm(x)).chunk(2, dim=-1)
        mlp: torch.Tensor = self.down_proj(F.silu(gate).mul_(up))
        return x.add_(mlp)


class LlamaModel(nn.Module):
    """Weights are uninitialized until ``load_hf_state_dict``."""

    def __init__(self, config: LlamaConfig, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, h, device="meta", dtype=dtype)
        self.layers = nn.ModuleList(DecoderLayer(config, i, dtype) for i in range(config.num_layers))
        self.norm = RMSNorm(h, config.rms_norm_eps, dtype)
        self.rope = RotaryEmbedding(config.head_dim, config.rope_theta, config.max_context_tokens, device)
        self.lm_head = None if config.tie_embeddings else _linear(h, config.vocab_size, dtype)
        self.packed_head: PackedLinear | None = None  # see prepack_weights
        self.requires_grad_(False)
        self.to_empty(device=device)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: Attention) -> torch.Tensor:
        """input_ids, positions [T] → final hidden states [T, hidden] (after the last norm).
        The residual stream stays float32 between layers; matmuls run in the weights' dtype."""
        num_tokens = input_ids.shape[0]
        pad = MIN_GEMM_ROWS - num_tokens
        if pad > 0:
            input_ids = F.pad(input_ids, (0, pad))
            positions = F.pad(positions, (0, pad))
        x = self.embed_tokens(input_ids).float()
        angles = self.rope.angles(positions)
        for layer in self.layers:
            x = layer(x, angles, attention)
        hidden: torch.Tensor = self.norm(x[:num_tokens])
        return hidden

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [B, hidden] → float32 logits [B, vocab]."""
        rows = hidden.shape[0]
        if rows < MIN_GEMM_ROWS:
            hidden = F.pad(hidden, (0, 0, 0, MIN_GEMM_ROWS - rows))
        if self.packed_head is not None:
            logits: torch.Tensor = self.packed_head(hidden)
            return logits[:rows].float()
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight)[:rows].float()

    def prepack_weights(self, batch_hint: int) -> None:
        """Replace every dense bf16 projection and the LM head by a ``PackedLinear`` (same
        numbers, no per-call weight reorder). The tied embedding table stays for the lookup."""
        for layer in self.layers:
            for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
                linear = getattr(layer, name)
                if isinstance(linear, nn.Linear):
                    setattr(layer, name, PackedLinear(linear.weight, batch_hint))
        head = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        self.packed_head = PackedLinear(head, batch_hint)

    def release_weights(self) -> None:
        """Drop the projections, the embedding table and the LM head (the native kernels packed
        their own copies and keep what else they read alive); the torch model cannot run after."""
        for layer in self.layers:
            for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
                setattr(layer, name, Released())
        self.embed_tokens = Released()  # type: ignore[assignment]
        self.lm_head = None
        self.packed_head = None

    def load_hf_state_dict(self, weights: dict[str, torch.Tensor], *, int4_weights: bool = False) -> None:
        """Load Hugging Face-named Llama weights (any float dtype), fusing qkv and gate/up.
        Consumes ``weights`` (entries are popped) to keep the peak memory low. With
        ``int4_weights`` the four projections of every layer become ``Int4Linear`` (quantized from
        the weights as given, so a Q4_1 GGUF's values come back exactly); the embeddings, the
        LM head and the norms stay in the model's dtype."""
        dtype = self.embed_tokens.weight.dtype

        def take(name: str) -> torch.Tensor:
            if name not in weights:
                raise ValueError(f"checkpoint lacks tensor {name!r}")
            return weights.pop(name).to(dtype)

        def take_raw(name: str) -> torch.Tensor:
            if name not in weights:
                raise ValueError(f"checkpoint lacks tensor {name!r}")
            return weights.pop(name).float()

        def project(layer: DecoderLayer, attribute: str, weight: torch.Tensor) -> None:
            if int4_weights:
                setattr(layer, attribute, Int4Linear(weight, dtype))
            else:
                getattr(layer, attribute).weight.copy_(weight.to(dtype))

        with torch.no_grad():
            self.embed_tokens.weight.copy_(take("model.embed_tokens.weight"))
            self.norm.weight.copy_(take("model.norm.weight"))
            if self.lm_head is not None:
                self.lm_head.weight.copy_(take("lm_head.weight"))
            else:
                weights.pop("lm_head.weight", None)  # some tied checkpoints still store a copy
            for i, layer in enumerate(self.layers):
                p = f"model.layers.{i}."
                assert isinstance(layer, DecoderLayer)
                layer.input_norm.weight.copy_(take(p + "input_layernorm.weight"))
                layer.post_attention_norm.weight.copy_(take(p + "post_attention_layernorm.weight"))
                attn = [take_raw(p + f"self_attn.{n}_proj.weight") for n in ("q", "k", "v")]
                project(layer, "qkv_proj", torch.cat(attn))
                project(layer, "o_proj", take_raw(p + "self_attn.o_proj.weight"))
                mlp = [take_raw(p + f"mlp.{n}_proj.weight") for n in ("gate", "up")]
                project(layer, "gate_up_proj", torch.cat(mlp))
                project(layer, "down_proj", take_raw(p + "mlp.down_proj.weight"))
        if weights:
            raise ValueError(f"checkpoint has unexpected tensors: {sorted(weights)[:5]}")
        for module in self.modules():
            if isinstance(module, RMSNorm):
                module.freeze()
