"""Weights in GGUF's block formats, as the native kernels read them: groups of 32 inputs of one
output row share an fp16 scale. ``q4_1``: w = d * code + m, 4-bit codes; ``q8_0``: w = d * code,
8-bit signed codes.

A GGUF file's own blocks are taken as stored (``load_gguf_blocks``), never through another
format; weights from elsewhere are quantized by the ``gguf`` package's own quantizers, so the
codes are those llama.cpp would write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

if TYPE_CHECKING:
    from gguf import GGMLQuantizationType

BlockFormat = Literal["q4_1", "q8_0"]
GROUP_SIZE = 32


@dataclass(frozen=True, slots=True)
class BlockWeight:
    """A [rows, columns] weight as GGUF blocks: ``blocks`` is uint8 [rows, columns / 32 * block bytes]."""

    format: BlockFormat
    blocks: np.ndarray
    columns: int

    @property
    def rows(self) -> int:
        return int(self.blocks.shape[0])

    def dequantized(self) -> torch.Tensor:
        """float32 [rows, columns], as GGUF defines the values."""
        from gguf.quants import dequantize

        return torch.from_numpy(np.array(dequantize(self.blocks, _gguf_type(self.format)), dtype=np.float32))


def quantize(weight: torch.Tensor, format: BlockFormat) -> BlockWeight:
    """``weight`` [rows, columns] (any float dtype; columns a multiple of 32) into blocks."""
    from gguf.quants import quantize as gguf_quantize

    columns = weight.shape[1]
    if columns % GROUP_SIZE:
        raise ValueError(f"a {format} weight needs whole groups of {GROUP_SIZE} inputs, not {columns}")
    array = weight.detach().float().contiguous().numpy()
    return BlockWeight(format, np.ascontiguousarray(gguf_quantize(array, _gguf_type(format))), columns)


def stack_rows(parts: list[BlockWeight]) -> BlockWeight:
    """The rows of ``parts`` one after another (a fused projection), all of one format and width."""
    first = parts[0]
    if any(p.format != first.format or p.columns != first.columns for p in parts):
        raise ValueError("fused weights must share a block format and a width")
    return BlockWeight(
        first.format, np.ascontiguousarray(np.concatenate([p.blocks for p in parts])), first.columns
    )


def _gguf_type(format: BlockFormat) -> GGMLQuantizationType:
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType.Q4_1 if format == "q4_1" else GGMLQuantizationType.Q8_0
