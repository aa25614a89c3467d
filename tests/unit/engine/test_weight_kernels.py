"""The two CPU weight layouts a model may load: 4-bit groups (Int4Linear) and oneDNN-packed bf16
(PackedLinear). Both must keep each output row independent of how many rows share the call."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from reference_server.models.int4_linear import GROUP_SIZE, Int4Linear
from reference_server.models.packed_linear import PackedLinear, prepack_supported

ROW_COUNTS = (1, 2, 3, 4, 5, 8, 31, 32, 64, 512)


def q4_1_weights(out_features: int, in_features: int, gen: torch.Generator) -> torch.Tensor:
    """Weights as a Q4_1 GGUF dequantizes them: d * code + m per group of 32, codes 0 and 15
    present in every group (llama.cpp's quantizer maps the group's min and max to them)."""
    groups = in_features // GROUP_SIZE
    codes = torch.randint(0, 16, (out_features, groups, GROUP_SIZE), generator=gen)
    codes[..., 0], codes[..., 1] = 0, 15
    d = (torch.rand(out_features, groups, 1, generator=gen) * 0.01 + 1e-3).half().float()
    m = (torch.randn(out_features, groups, 1, generator=gen) * 0.05).half().float()
    return (d * codes + m).view(out_features, in_features)


def test_int4_round_trips_q4_1_weights_to_bf16_precision() -> None:
    gen = torch.Generator().manual_seed(0)
    weight = q4_1_weights(96, 128, gen)
    layer = Int4Linear(weight, torch.bfloat16)
    error = (layer.dequantized() - weight).abs().max()
    # scale and zero are stored in bf16: the only error is their rounding (a bf16 weight has ~1/256)
    assert error <= weight.abs().max() / 64
    x = torch.randn(4, 128, generator=gen).bfloat16()
    torch.testing.assert_close(layer(x).float(), x.float() @ weight.t(), atol=0.05, rtol=0.02)


def test_int4_rows_do_not_depend_on_the_row_count() -> None:
    gen = torch.Generator().manual_seed(1)
    layer = Int4Linear(q4_1_weights(192, 576, gen), torch.bfloat16)
    x = torch.randn(max(ROW_COUNTS), 576, generator=gen).bfloat16()
    first = layer(x[:1])
    for rows in ROW_COUNTS:
        assert torch.equal(layer(x[:rows])[:1], first), rows


def test_int4_rejects_a_width_that_is_not_whole_groups() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        Int4Linear(torch.zeros(8, 48), torch.bfloat16)


@pytest.mark.skipif(not prepack_supported(torch.device("cpu"), torch.bfloat16), reason="needs oneDNN")
def test_packed_linear_equals_f_linear_and_does_not_depend_on_the_row_count() -> None:
    gen = torch.Generator().manual_seed(2)
    weight = (torch.randn(3072, 576, generator=gen) * 0.02).bfloat16()
    x = torch.randn(max(ROW_COUNTS), 576, generator=gen).bfloat16()
    for hint in (4, 32):
        layer = PackedLinear(weight, hint)
        first = layer(x[:4])
        assert torch.equal(first, F.linear(x[:4], weight))
        for rows in ROW_COUNTS:
            assert torch.equal(layer(x[:rows])[: min(rows, 4)], first[: min(rows, 4)]), (hint, rows)
