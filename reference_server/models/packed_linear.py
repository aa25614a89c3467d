"""A bf16 linear layer whose weight oneDNN reorders once, at load, into its blocked layout.

``F.linear`` on a plain bf16 weight makes oneDNN reorder (pack) the weight on every call: at
decode batch sizes that is a second pass over every weight per token. The packed weight gives
the same products in the same order (bitwise equal to ``F.linear`` for 4+ rows, and to itself
for any row count), without that pass.
"""

from __future__ import annotations

import torch
from torch import nn

from reference_server.cpu import bf16_gemm_native


def prepack_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN prepacks bf16 weights only where it multiplies bf16 natively (AVX-512 or AVX-NE-CONVERT)."""
    mkldnn = torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
    return device.type == "cpu" and dtype == torch.bfloat16 and bool(mkldnn) and bf16_gemm_native()


class PackedLinear(nn.Module):
    """y = x @ W.T for bf16 ``x`` [M, in]; ``batch_hint`` is the row count the layout is tuned for."""

    def __init__(self, weight: torch.Tensor, batch_hint: int) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), batch_hint)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [None], "")
        return out
