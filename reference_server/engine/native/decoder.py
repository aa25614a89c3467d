"""Decode steps in native code: every layer of a step for all its one-token rows in one call.

At one or a few rows a step is a pass over the weights plus thousands of small operations; in
torch the operations cost as much as the pass (see bench/decode_step.py). ``decode_step.c``
does the whole step without returning to Python, with its own matmul over weights packed for
it once at load.

What goes native is decided per token, never per batch: every generated token that is fed back
(a decode row) takes this path, every prompt token takes the torch model. So a sequence's numbers
do not depend on what else runs in the step (SAMPLE-2), and prompt tokens' KV is the same whether
it was computed now or taken from the prefix cache (KVManager caches prompt tokens only while a
decoder is in use).
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

from reference_server.engine.kv_pool import KVPool, SlotTable
from reference_server.engine.native.kernels import KernelsUnavailable, load_kernels
from reference_server.models.llama import DecoderLayer, LlamaModel

PANEL = 64  # output columns per packed panel, as in decode_step.c
VECTOR = 16  # float32 lanes of one AVX-512 vector


class _Model(ctypes.Structure):
    _fields_ = [
        *((name, ctypes.c_int32) for name in (
            "num_layers", "hidden", "intermediate", "num_heads", "num_kv_heads", "head_dim", "vocab",
            "table_width", "max_positions",
        )),
        ("eps", ctypes.c_float),
        *((name, ctypes.c_void_p) for name in (
            "embed", "head", "final_norm", "rope_cos", "rope_sin", "slot_table",
            "input_norm", "post_norm", "qkv", "o", "gate_up", "down", "k_pool", "v_pool",
        )),
    ]  # fmt: skip


def unsupported_reason(model: LlamaModel, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why this model cannot decode natively here, or None."""
    if device.type != "cpu" or dtype != torch.bfloat16:
        return f"native decode runs bfloat16 on the CPU, not {dtype} on {device.type}"
    c = model.config
    for name in ("hidden_size", "head_dim"):
        if getattr(c, name) % VECTOR:
            return f"{name}={getattr(c, name)} is not a multiple of {VECTOR}"
    if c.intermediate_size % 2 or c.q_size % 2:
        return "odd inner dimensions"
    for layer in model.layers:
        assert isinstance(layer, DecoderLayer)
        for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
            if not isinstance(getattr(layer, name), nn.Linear):
                return f"layer projections are {type(getattr(layer, name)).__name__}, not dense"
    try:
        load_kernels()
    except (KernelsUnavailable, OSError) as error:
        return str(error)
    return None


class NativeDecoder:
    """Built from the dense model before its weights are prepacked for torch (it packs its own)."""

    def __init__(self, model: LlamaModel, pool: KVPool, table: SlotTable) -> None:
        self._lib = load_kernels()
        c = model.config
        self.vocab_size = c.vocab_size
        self.threads = torch.get_num_threads()  # OpenMP threads of a step; numbers do not depend on it
        layers = [layer for layer in model.layers if isinstance(layer, DecoderLayer)]
        self._keep: list[torch.Tensor] = []  # everything the C struct points to stays alive here
        head = model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight

        def float_weight(norm: nn.Module) -> torch.Tensor:
            weight = getattr(norm, "float_weight", None)
            assert isinstance(weight, torch.Tensor), "RMSNorm.freeze() must run first"
            return weight

        def pointers(tensors: list[torch.Tensor]) -> int:
            array = (ctypes.c_void_p * len(tensors))(*(self._address(t) for t in tensors))
            self._arrays.append(array)
            return ctypes.addressof(array)

        self._arrays: list[ctypes.Array[ctypes.c_void_p]] = []
        self._struct = _Model(
            num_layers=c.num_layers, hidden=c.hidden_size, intermediate=c.intermediate_size,
            num_heads=c.num_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, vocab=c.vocab_size,
            table_width=table.rows.shape[1], max_positions=model.rope.cos.shape[0], eps=c.rms_norm_eps,
            embed=self._address(model.embed_tokens.weight), head=self._address(self._pack(head)),
            final_norm=self._address(float_weight(model.norm)),
            rope_cos=self._address(model.rope.cos), rope_sin=self._address(model.rope.sin),
            slot_table=self._address(table.rows),
            input_norm=pointers([float_weight(layer.input_norm) for layer in layers]),
            post_norm=pointers([float_weight(layer.post_attention_norm) for layer in layers]),
            qkv=pointers([self._pack(self._dense(layer.qkv_proj)) for layer in layers]),
            o=pointers([self._pack(self._dense(layer.o_proj)) for layer in layers]),
            gate_up=pointers([self._pack(self._dense(layer.gate_up_proj)) for layer in layers]),
            down=pointers([self._pack(self._dense(layer.down_proj)) for layer in layers]),
            k_pool=pointers(pool.k), v_pool=pointers(pool.v),
        )  # fmt: skip

    def step(
        self, token_ids: list[int], positions: list[int], rows: list[int], slots: torch.Tensor
    ) -> torch.Tensor:
        """One new token per sequence: ``token_ids[i]`` at ``positions[i]`` of the sequence on
        slot-table row ``rows[i]`` (already mapping that position to ``slots[i]``). Writes the
        tokens' K/V and returns float32 logits [B, vocab]."""
        batch = len(token_ids)
        ids = torch.tensor(token_ids, dtype=torch.int64)
        pos = torch.tensor(positions, dtype=torch.int64)
        row = torch.tensor(rows, dtype=torch.int64)
        new_slots = slots.to(torch.int64).contiguous()
        logits = torch.empty((batch, self.vocab_size), dtype=torch.float32)
        status = self._lib.lm_decode_step(
            ctypes.byref(self._struct), batch, ids.data_ptr(), pos.data_ptr(), row.data_ptr(),
            new_slots.data_ptr(), logits.data_ptr(), self.threads,
        )  # fmt: skip
        if status != 0:
            raise MemoryError(f"native decode step of {batch} rows could not allocate its scratch memory")
        return logits

    def _address(self, tensor: torch.Tensor) -> int:
        assert tensor.is_contiguous() and tensor.device.type == "cpu"
        self._keep.append(tensor)
        return int(tensor.data_ptr())

    @staticmethod
    def _dense(linear: nn.Module) -> torch.Tensor:
        assert isinstance(linear, nn.Linear)
        return linear.weight

    def _pack(self, weight: torch.Tensor) -> torch.Tensor:
        n, k = weight.shape
        weight = weight.detach().to(torch.bfloat16).contiguous()
        packed = torch.empty((-(-n // PANEL) * PANEL, k), dtype=torch.bfloat16)
        self._lib.lm_pack_weight(weight.data_ptr(), packed.data_ptr(), n, k)
        return packed
