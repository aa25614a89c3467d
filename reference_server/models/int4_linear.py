"""A linear layer with 4-bit weights: groups of 32 input features share a scale and a minimum
(the Q4_1 scheme of GGUF files), run by torch's packed int4 CPU matmul.

Quantizing a Q4_1 GGUF's dequantized weights this way is lossless: llama.cpp's Q4_1 quantizer
maps each group's minimum to code 0 and maximum to code 15, so the group's min/max give back its
scale and minimum, and every code exactly. The kernel dequantizes ``(code - 8) * scale + zero``
with scale and zero in the activations' dtype (bf16: their rounding is of the size of the bf16
weights' own). A row's output does not depend on how many rows share the call (checked for
1..512 rows), so batch invariance holds as with the dense GEMMs.
"""

from __future__ import annotations

import torch
from torch import nn

GROUP_SIZE = 32
INNER_K_TILES = 2  # the packing's K tiling (the CPU kernel accepts 2, 4 or 8)


def int4_supported(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cpu" and dtype == torch.bfloat16


class Int4Linear(nn.Module):
    """y = x @ W.T for bf16 ``x`` [M, in] with W stored as 4-bit codes per group of 32."""

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype) -> None:
        """``weight`` [out, in] float32 (quantized here); ``in`` must be a multiple of 32."""
        super().__init__()
        out_features, in_features = weight.shape
        if in_features % GROUP_SIZE:
            raise ValueError(f"in_features={in_features} must be a multiple of {GROUP_SIZE} for int4 weights")
        groups = weight.float().view(out_features, in_features // GROUP_SIZE, GROUP_SIZE)
        low, high = groups.amin(-1), groups.amax(-1)
        scale = (high - low) / 15
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        codes = ((groups - low[..., None]) / safe[..., None]).round().clamp_(0, 15)
        codes = codes.to(torch.int32).view(out_features, in_features)
        self.packed = torch._convert_weight_to_int4pack_for_cpu(codes, INNER_K_TILES)
        zero = low + 8 * scale  # the kernel subtracts 8 from every code
        self.scale_and_zero = torch.stack((scale.t(), zero.t()), dim=-1).to(dtype).contiguous()
        self.in_features = in_features
        self.out_features = out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch._weight_int4pack_mm_for_cpu(
            x.contiguous(), self.packed, GROUP_SIZE, self.scale_and_zero
        )
        return out

    def dequantized(self) -> torch.Tensor:
        """The weights the kernel uses, as float32 [out, in] (for tests)."""
        eye = torch.eye(self.in_features, dtype=self.scale_and_zero.dtype)
        return self.forward(eye).float().t().contiguous()
