"""The whole forward pass in native code: every layer of a step, for all its tokens, in one call.

A 135M model at one or a few rows is a pass over the weights plus thousands of small operations;
in torch the operations cost as much as the pass (bench/decode_step.py). ``forward.c`` runs the
step without returning to Python, with its own matmul over weights packed for it once at load,
and attention straight from the token-slot KV pool.

Batch invariance holds by construction: every output element is computed by one fixed sequence
of instructions that depends only on its own token (its row and position), never on how many
tokens, chunks or threads share the step. Prompt and generated tokens take the same path, so KV
from the prefix cache equals KV computed afresh.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import Literal

import torch
from torch import nn

from reference_server.engine.kv_pool import KVPool, SlotTable
from reference_server.engine.native.kernels import Isa, KernelsUnavailable, load_kernels
from reference_server.models.llama import DecoderLayer, LlamaConfig, LlamaModel
from reference_server.models.quantized import GROUP_SIZE, BlockFormat, BlockWeight, quantize, stack_rows

PANEL = 64  # output columns per packed panel, as in forward.c
VECTOR = 16  # float32 lanes of one of the kernels' vectors (a zmm register, or two ymm)
MAX_HEAD_DIM = 512  # as forward.c checks
OUT_OF_RANGE = -2  # lm_forward's status for a token id or position out of range
FORMAT_CODES = {"bf16": 0, "q4_1": 1, "q8_0": 2}  # forward.c's FORMAT_*
KV_FORMAT_CODES = {"dense": 0, "int8": 1}  # forward.c's KV_*
# int8 codes of one of those vectors: an int8 KV cache's head_dim is whole vectors of them
KV_CODES_PER_VECTOR = 64

Format = Literal["bf16", "q4_1", "q8_0"]
# the engine's weight options → the formats of the layers' projections and of the LM head
LAYER_FORMAT: dict[str, Format] = {"dense": "bf16", "q4_1": "q4_1", "int8": "q8_0"}


class _Model(ctypes.Structure):
    _fields_ = [
        *((name, ctypes.c_int32) for name in (
            "num_layers", "hidden", "intermediate", "num_heads", "num_kv_heads", "head_dim", "vocab",
            "table_width", "max_positions", "layer_format", "head_format",
        )),
        ("eps", ctypes.c_float),
        *((name, ctypes.c_void_p) for name in (
            "embed", "head", "final_norm", "rope_cos", "rope_sin", "slot_table",
            "input_norm", "post_norm", "qkv", "o", "gate_up", "down",
        )),
        ("kv_format", ctypes.c_int32),
        ("kv_slots", ctypes.c_int32),
        *((name, ctypes.c_void_p) for name in ("k_pool", "v_pool", "k_scales", "v_scales")),
    ]  # fmt: skip


def unsupported_reason(
    config: LlamaConfig,
    device: torch.device,
    dtype: torch.dtype,
    weights: str = "dense",
    kv_cache: str = "dense",
    isa: Isa | None = None,
) -> str | None:
    """Why a model of this shape cannot run natively here (in ``isa``'s kernels; None: the best this
    CPU runs) with these weights and KV cache, or None."""
    if device.type != "cpu" or dtype != torch.bfloat16:
        return f"the native kernels run bfloat16 on the CPU, not {dtype} on {device.type}"
    for name in ("hidden_size", "intermediate_size", "head_dim"):
        if getattr(config, name) % VECTOR:
            return f"{name}={getattr(config, name)} is not a multiple of {VECTOR}"
    if config.head_dim > MAX_HEAD_DIM:
        return f"head_dim={config.head_dim} is over {MAX_HEAD_DIM}"
    if LAYER_FORMAT[weights] != "bf16":
        for name in ("hidden_size", "intermediate_size", "q_size"):
            if getattr(config, name) % GROUP_SIZE:
                return f"{name}={getattr(config, name)} is not whole groups of {GROUP_SIZE} for {weights} weights"
    if kv_cache == "int8" and config.head_dim % KV_CODES_PER_VECTOR:
        return f"head_dim={config.head_dim} is not a multiple of {KV_CODES_PER_VECTOR} for an int8 KV cache"
    try:
        load_kernels(isa)
    except (KernelsUnavailable, OSError) as error:
        return str(error)
    return None


class NativeModel:
    """Built from the dense bf16 model; it packs its own copy of the projection weights, in the
    format ``weights`` names (LAYER_FORMAT). Quantized, the layers take the checkpoint's own blocks
    of that format from ``stored`` (Hugging Face names) where it has them, and the LM head its own
    q4_1 or q8_0 blocks (else q8_0); everything else is quantized from the weights as given."""

    def __init__(
        self,
        model: LlamaModel,
        pool: KVPool,
        table: SlotTable,
        weights: str = "dense",
        stored: Mapping[str, BlockWeight] | None = None,
        isa: Isa | None = None,
    ) -> None:
        self._lib = load_kernels(isa)
        self.isa: str = self._lib.lm_isa().decode()
        self._stored = dict(stored or {})
        self.layer_format = LAYER_FORMAT[weights]
        c = model.config
        self.vocab_size = c.vocab_size
        self.threads = torch.get_num_threads()  # OpenMP threads of a step; numbers do not depend on it
        layers = [layer for layer in model.layers if isinstance(layer, DecoderLayer)]
        self._keep: list[torch.Tensor] = []  # everything the C struct points to stays alive here
        self._arrays: list[ctypes.Array[ctypes.c_void_p]] = []
        head_name = "model.embed_tokens.weight" if model.lm_head is None else "lm_head.weight"
        head = model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight
        if self.layer_format == "bf16":
            self.head_format: Format = "bf16"
        else:
            own = self._stored.get(head_name)
            self.head_format = own.format if own is not None else "q8_0"
        # a tied quantized head is also the embedding table: the kernels read a token's row from it
        embed = None if self.head_format != "bf16" and model.lm_head is None else model.embed_tokens.weight

        def layer_weights(i: int, parts: tuple[str, ...], dense: nn.Module) -> torch.Tensor:
            names = [f"model.layers.{i}.{part}.weight" for part in parts]
            return self._packed(names, self._dense(dense), self.layer_format)

        def float_weight(norm: nn.Module) -> torch.Tensor:
            weight = getattr(norm, "float_weight", None)
            assert isinstance(weight, torch.Tensor), "RMSNorm.freeze() must run first"
            return weight

        def pointers(tensors: list[torch.Tensor]) -> int:
            array = (ctypes.c_void_p * len(tensors))(*(self._address(t) for t in tensors))
            self._arrays.append(array)
            return ctypes.addressof(array)

        self._struct = _Model(
            num_layers=c.num_layers, hidden=c.hidden_size, intermediate=c.intermediate_size,
            num_heads=c.num_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, vocab=c.vocab_size,
            table_width=table.rows.shape[1], max_positions=model.rope.cos.shape[0],
            layer_format=FORMAT_CODES[self.layer_format], head_format=FORMAT_CODES[self.head_format],
            eps=c.rms_norm_eps, embed=None if embed is None else self._address(embed),
            head=self._address(self._packed([head_name], head, self.head_format)),
            final_norm=self._address(float_weight(model.norm)),
            rope_cos=self._address(model.rope.cos), rope_sin=self._address(model.rope.sin),
            slot_table=self._address(table.rows),
            input_norm=pointers([float_weight(layer.input_norm) for layer in layers]),
            post_norm=pointers([float_weight(layer.post_attention_norm) for layer in layers]),
            qkv=pointers([
                layer_weights(i, ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), layer.qkv_proj)
                for i, layer in enumerate(layers)
            ]),
            o=pointers([layer_weights(i, ("self_attn.o_proj",), layer.o_proj) for i, layer in enumerate(layers)]),
            gate_up=pointers([
                layer_weights(i, ("mlp.gate_proj", "mlp.up_proj"), layer.gate_up_proj) for i, layer in enumerate(layers)
            ]),
            down=pointers([layer_weights(i, ("mlp.down_proj",), layer.down_proj) for i, layer in enumerate(layers)]),
            kv_format=KV_FORMAT_CODES[pool.kv_format], kv_slots=pool.num_slots,
            k_pool=pointers(pool.k), v_pool=pointers(pool.v),
            k_scales=pointers(pool.k_scales), v_scales=pointers(pool.v_scales),
        )  # fmt: skip
        self._stored.clear()

    def forward(
        self,
        token_ids: list[int],
        positions: list[int],
        chunk_starts: list[int],
        chunk_rows: list[int],
        slots: torch.Tensor,
        logit_tokens: list[int],
    ) -> torch.Tensor:
        """Chunk ``c`` is tokens ``chunk_starts[c]`` to ``chunk_starts[c + 1] - 1`` (consecutive
        positions of the sequence on slot-table row ``chunk_rows[c]``, whose table already maps
        them to ``slots``). Writes every token's K/V and returns float32 logits
        [len(logit_tokens), vocab] for the tokens ``logit_tokens`` (increasing)."""
        ids = torch.tensor(token_ids, dtype=torch.int64)
        pos = torch.tensor(positions, dtype=torch.int64)
        starts = torch.tensor(chunk_starts, dtype=torch.int64)
        rows = torch.tensor(chunk_rows, dtype=torch.int64)
        new_slots = slots.to(torch.int64).contiguous()
        wanted = torch.tensor(logit_tokens, dtype=torch.int64)
        logits = torch.empty((len(logit_tokens), self.vocab_size), dtype=torch.float32)
        status = self._lib.lm_forward(
            ctypes.byref(self._struct), len(token_ids), ids.data_ptr(), pos.data_ptr(), len(chunk_rows),
            starts.data_ptr(), rows.data_ptr(), new_slots.data_ptr(), len(logit_tokens), wanted.data_ptr(),
            logits.data_ptr(), self.threads,
        )  # fmt: skip
        if status == OUT_OF_RANGE:
            raise ValueError(
                f"a token id or position is out of range (vocab {self.vocab_size}): ids {token_ids[:8]}, "
                f"positions {positions[:8]}"
            )
        if status != 0:
            raise MemoryError(
                f"the native forward pass of {len(token_ids)} tokens could not allocate its scratch memory"
            )
        return logits

    def _address(self, tensor: torch.Tensor) -> int:
        assert tensor.is_contiguous() and tensor.device.type == "cpu"
        self._keep.append(tensor)
        return int(tensor.data_ptr())

    @staticmethod
    def _dense(linear: nn.Module) -> torch.Tensor:
        assert isinstance(linear, nn.Linear)
        return linear.weight

    def _packed(self, names: list[str], dense: torch.Tensor, format: Format) -> torch.Tensor:
        """The weight whose rows are the tensors ``names`` (``dense`` holds them fused), packed."""
        n, k = dense.shape
        packed = torch.empty(self._lib.lm_packed_bytes(FORMAT_CODES[format], n, k), dtype=torch.uint8)
        if format == "bf16":
            weight = dense.detach().to(torch.bfloat16).contiguous()
            self._lib.lm_pack_weight(weight.data_ptr(), packed.data_ptr(), n, k)
            return packed
        blocks = self._blocks(names, dense, format)
        assert blocks.rows == n and blocks.columns == k, (names, blocks.rows, blocks.columns, n, k)
        self._lib.lm_pack_quant(FORMAT_CODES[format], blocks.blocks.ctypes.data, packed.data_ptr(), n, k)
        return packed

    def _blocks(self, names: list[str], dense: torch.Tensor, format: BlockFormat) -> BlockWeight:
        own = [self._stored.get(name) for name in names]
        if all(block is not None and block.format == format for block in own):
            return stack_rows([block for block in own if block is not None])
        # quantized from the checkpoint's own values where it has them, never from a bf16 rounding of them
        if all(block is not None for block in own):
            return quantize(torch.cat([block.dequantized() for block in own if block is not None]), format)
        return quantize(dense, format)
